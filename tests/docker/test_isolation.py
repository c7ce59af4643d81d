"""From inside the sandbox: no network, no Docker API, no capabilities, no escalation."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend

pytestmark = pytest.mark.docker

PY_CONNECT = (
    "import socket,sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); print('CONNECTED')\n"
    "except OSError as e:\n"
    "    print('FAILED', e)\n"
)


async def test_network_is_off(runtime_backend: DockerBackend, user_workspace: Path) -> None:
    box = await runtime_backend.get(user_workspace)
    r = await box.exec(ExecRequest("ls /sys/class/net 2>/dev/null || cat /proc/net/dev"))
    ifaces = r.stdout.decode().split()
    assert "lo" in ifaces or "lo:" in r.stdout.decode()
    assert not any(i.startswith(("eth", "en", "wl", "docker", "veth")) for i in ifaces), ifaces
    for host, port in (("1.1.1.1", "80"), ("172.17.0.1", "2375"), ("172.17.0.1", "2376"), ("8.8.8.8", "53")):
        r = await box.exec(ExecRequest(f'python3 -c "$SRC" {host} {port}', env={"SRC": PY_CONNECT}, timeout=20))
        assert b"FAILED" in r.stdout and b"CONNECTED" not in r.stdout, (host, r)
    r = await box.exec(ExecRequest("python3 -c \"import socket; socket.getaddrinfo('pypi.org', 443)\"; echo rc=$?"))
    assert b"rc=0" not in r.stdout


async def test_no_docker_socket_or_host_socket_inside(runtime_backend: DockerBackend, user_workspace: Path) -> None:
    box = await runtime_backend.get(user_workspace)
    r = await box.exec(
        ExecRequest(
            "ls -l /var/run/docker.sock /run/docker.sock 2>&1; "
            "find / -xdev -type s 2>/dev/null; find /run /var/run /tmp -type s 2>/dev/null; echo END"
        )
    )
    out = r.stdout.decode()
    assert out.count("cannot access") == 2, out
    assert out.strip().splitlines()[-1] == "END"
    assert ".sock" not in out.replace("/var/run/docker.sock", "").replace("/run/docker.sock", "")


async def test_process_identity_and_privileges(runtime_backend: DockerBackend, user_workspace: Path) -> None:
    box = await runtime_backend.get(user_workspace)
    r = await box.exec(ExecRequest("id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status"))
    lines = r.stdout.decode().split("\n")
    assert lines[0] == "1000" and lines[1] == "1000"
    status = dict(line.split(":\t") for line in lines[2:] if line)
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapPrm"], 16) == 0
    if "NoNewPrivs" in status:  # gVisor's /proc does not show it; prctl below asks the kernel
        assert status["NoNewPrivs"].strip() == "1"
    r = await box.exec(ExecRequest("python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'"))
    assert r.stdout == b"1\n"  # PR_GET_NO_NEW_PRIVS
    r = await box.exec(
        ExecRequest("touch /etc/owned 2>&1; touch /usr/bin/owned 2>&1; (echo x > /owned) 2>&1; echo done")
    )
    out = r.stdout.decode()
    # as uid 1000 gVisor reports the permission check first; runc the read-only mount
    assert out.count("Read-only file system") + out.count("Permission denied") == 3, out
    r = await box.exec(ExecRequest("awk '$2 == \"/\" {print $4}' /proc/mounts"))
    assert r.stdout.decode().split(",")[0] == "ro", r.stdout


async def test_setuid_binary_does_not_escalate(runtime_backend: DockerBackend, user_workspace: Path) -> None:
    suid = user_workspace / "suid-id"
    shutil.copy("/usr/bin/id", suid)
    os.chown(suid, 0, 0)
    os.chmod(suid, 0o4755)
    box = await runtime_backend.get(user_workspace)
    r = await box.exec(ExecRequest("./suid-id -u; ./suid-id -ru"))
    assert r.stdout.decode().split() == ["1000", "1000"], r
    # the image's own setuid programs do not help either
    r = await box.exec(ExecRequest("su -c id root </dev/null 2>&1; mount -t tmpfs none /mnt 2>&1; echo done"))
    assert b"uid=0" not in r.stdout


async def test_files_created_inside_are_owned_by_workspace_owner(
    runtime_backend: DockerBackend, user_workspace: Path
) -> None:
    box = await runtime_backend.get(user_workspace)
    await box.write("made/by/agent.txt", b"x")
    await box.exec(ExecRequest("mkdir -p shell && echo y > shell/file.txt"))
    for p in (user_workspace / "made/by/agent.txt", user_workspace / "made", user_workspace / "shell/file.txt"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (1000, 1000), p


async def test_root_owned_workspace_runs_as_uid0_without_capabilities(
    docker_backend: DockerBackend, workspace: Path
) -> None:
    box = await docker_backend.get(workspace)
    r = await box.exec(ExecRequest("id -u; grep CapEff /proc/self/status"))
    uid, capeff = r.stdout.decode().split("\n")[:2]
    assert uid == "0"
    assert int(capeff.split()[1], 16) == 0
    # without CAP_DAC_OVERRIDE root cannot read a file it does not own and may not read
    (workspace / "private").write_text("secret")
    os.chown(workspace / "private", 1000, 1000)
    os.chmod(workspace / "private", 0o600)
    r = await box.exec(ExecRequest("cat private"))
    assert r.exit_code != 0 and b"secret" not in r.stdout


async def test_commands_cannot_forge_agent_replies_or_read_its_memory(
    runtime_backend: DockerBackend, workspace: Path
) -> None:
    """The agent is non-dumpable: under runc a command (same uid, even uid 0 without
    capabilities) cannot open its /proc fds or read its memory. gVisor does not honour
    that for /proc/<pid>/fd, so every message also carries a per-connection secret: lines
    a command writes into the stream are dropped, and replies stay genuine."""
    box = await runtime_backend.get(workspace)
    await box.write("real.txt", b"genuine")
    info = await box.info()
    pid = info.pid
    forged = "".join(
        f'{{"id":{i},"ok":true,"result":{{"data":"Zm9yZ2Vk","size":6,"truncated":false,"sha256":null,'
        f'"mtime_ns":1,"binary":false}}}}\n'
        for i in range(1, 400)
    )
    (workspace / "forged.jsonl").write_text(forged)
    r = await box.exec(
        ExecRequest(
            f"cat forged.jsonl > /proc/{pid}/fd/1 && echo WROTE; "
            f"head -c 16 /proc/{pid}/mem >/dev/null && echo READ_MEM; echo end"
        )
    )
    out = r.stdout.decode()
    assert "READ_MEM" not in out, out
    if runtime_backend.spec.runtime == "runc":
        assert "WROTE" not in out, out
    for _ in range(3):
        assert (await box.read("real.txt")).data == b"genuine"
    assert (await box.exec(ExecRequest("echo still-in-sync"))).stdout == b"still-in-sync\n"


async def test_default_seccomp_profile_is_on(docker_backend: DockerBackend, workspace: Path) -> None:
    await (await docker_backend.get(workspace)).info()
    attrs = await docker_backend.inspect(workspace)
    assert attrs is not None
    assert not any("unconfined" in opt for opt in attrs["HostConfig"]["SecurityOpt"] or [])
    box = await docker_backend.get(workspace)
    r = await box.exec(ExecRequest("grep Seccomp: /proc/self/status"))
    assert r.stdout.split()[-1] == b"2"  # filter mode
