"""The sandbox's own seccomp profile (sandbox/docker/seccomp.py): what a command may call,
probed from inside the sandbox under runc and gVisor, the profile as the engine kept it,
and what agents need still working (compilers, threads, tracing their own children).

Under gVisor the OCI profile is applied inside the sandbox only when runsc is registered
with ``--oci-seccomp``; without it the sandbox kernel's own answers are expected (the
second column), and they are what docs/seccomp.md lists.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend, container_name, gvisor, seccomp
from sandbox.docker.checks import runsc_applies_seccomp
from sandbox.errors import RuntimeUnavailableError
from tests.conftest import REQUIRE_DOCKER
from tests.docker.conftest import make_backend, own_backend, require_runtime

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DEBUG_IMAGE = "loom-test-debug:latest"
MARKER = "987.654"

#: probe -> (under runc; under gVisor's own kernel). "ok" means the call succeeded; anything
#: else is the errno it must fail with.
OUTCOMES: dict[str, tuple[str, str]] = {
    "io_uring_setup": ("EPERM", "ENOSYS"),
    "ptrace_attach_pid1": ("EPERM", "EPERM"),
    "ptrace_seize_pid1": ("EPERM", "EPERM"),
    "ptrace_attach_other_call": ("EPERM", "EPERM"),  # gVisor: Yama's ptrace_scope 1
    "ptrace_seize_other_call": ("EPERM", "EPERM"),
    "ptrace_traceme_own_child": ("ok", "ok"),  # gdb ./prog, strace cmd
    "ptrace_seize_own_child": ("EPERM", "ok"),  # runc: attaching is refused, even to a child
    "process_vm_readv_pid1": ("EPERM", "EPERM"),
    "process_vm_writev_other_call": ("EPERM", "EPERM"),
    "proc_mem_pid1": ("EACCES", "EACCES"),  # runc: PID 1 is the runtime's unreadable tini: not dumpable
    "proc_mem_other_call": ("ok", "EACCES"),  # runc: same uid, dumpable, no Yama (docs/seccomp.md)
    "keyctl": ("EPERM", "ok"),  # gVisor: a keyring of its own kernel
    "add_key": ("EPERM", "EACCES"),
    "bpf": ("EPERM", "EPERM"),
    "perf_event_open": ("EPERM", "ENODEV"),
    "userfaultfd": ("EPERM", "ENOSYS"),
    "unshare_user": ("EPERM", "ok"),  # gVisor: namespaces of its own kernel, nothing of the host's
    "unshare_mnt": ("EPERM", "EPERM"),
    "unshare_pid": ("EPERM", "EPERM"),
    "unshare_net": ("EPERM", "EPERM"),
    "unshare_uts": ("EPERM", "EPERM"),
    "unshare_ipc": ("EPERM", "EPERM"),
    "unshare_cgroup": ("EPERM", "ok"),
    "unshare_time": ("EPERM", "ok"),
    "mount": ("EPERM", "EPERM"),
    "init_module": ("EPERM", "EPERM"),
    "finit_module": ("EPERM", "EPERM"),
    "kexec_load": ("EPERM", "EPERM"),
    "open_by_handle_at": ("EPERM", "ENOTSUP"),
    "name_to_handle_at": ("EPERM", "ENOTSUP"),
    # runc: ENOSYS, glibc falls back to clone, whose flags are checked; gVisor answers every
    # refusal with EPERM (no fallback then), so its profile allows clone3 (seccomp.build)
    "clone3": ("ENOSYS", "EINVAL"),
    "socket_af_unix": ("ok", "ok"),
    "socket_af_inet": ("ok", "ok"),
    "socket_af_inet6": ("ok", "ok"),
    "socket_af_netlink": ("ok", "ok"),
    "socket_af_packet": ("EPERM", "EPERM"),
    "socket_af_alg": ("EPERM", "EAFNOSUPPORT"),
    "socket_af_vsock": ("EPERM", "EAFNOSUPPORT"),
}


#: The probes whose runc answer is the profile's (the rest are the kernel's own): what gVisor
#: answers instead when runsc applies the profile (--oci-seccomp).
FILTERED = {name for name, (runc, _) in OUTCOMES.items() if runc in ("EPERM", "ENOSYS")} - {"clone3"}


def _expected(runtime: str, profile_applies: bool) -> dict[str, str]:
    if runtime == "runc":
        return {name: runc for name, (runc, _) in OUTCOMES.items()}
    return {name: runc if profile_applies and name in FILTERED else own for name, (runc, own) in OUTCOMES.items()}


async def _profile_applies(backend: DockerBackend) -> bool:
    """Whether the OCI profile is enforced for this backend's runtime."""
    if backend.spec.runtime == "runc":
        return True
    info = await backend.daemon_info()
    runtimes = info.get("Runtimes") or {}
    return runsc_applies_seccomp(runtimes.get(gvisor.engine_runtime(runtimes, backend.spec.gvisor_platform)))


@pytest.mark.parametrize("owner", [1000, 0], ids=["user", "root"])
async def test_system_calls_from_inside_get_the_answers_in_the_table(
    runtime_backend: DockerBackend, workspace: Path, owner: int
) -> None:
    """The same answers whether the sandbox runs as an ordinary uid or, for a root-owned
    workspace, as uid 0 without capabilities."""
    os.chown(workspace, owner, owner)
    shutil.copy(FIXTURES / "syscall_probe.py", workspace / "syscall_probe.py")
    box = await runtime_backend.get(workspace)
    # A process of another call: a background process started before the probe runs.
    other = await box.spawn(["sleep", MARKER])  # type: ignore[attr-defined]
    try:
        r = await box.exec(ExecRequest(f"python3 syscall_probe.py {MARKER}", timeout=60))
        assert r.exit_code == 0, r.stderr
        got = json.loads(r.stdout)
    finally:
        await other.close(grace=0)
    assert got == _expected(runtime_backend.spec.runtime, await _profile_applies(runtime_backend))


async def test_the_profile_is_in_effect_on_the_container_as_inspected(
    runtime_backend: DockerBackend, workspace: Path
) -> None:
    box = await runtime_backend.get(workspace)
    info = await box.info()
    attrs = await runtime_backend.inspect(workspace)
    assert attrs is not None
    opts = attrs["HostConfig"]["SecurityOpt"]
    assert "no-new-privileges" in opts
    (profile,) = [o for o in opts if o.startswith("seccomp=")]
    runtime = runtime_backend.spec.runtime
    assert json.loads(profile.removeprefix("seccomp=")) == seccomp.build(runtime)
    assert attrs["Config"]["Labels"]["dev.loom.seccomp"] == seccomp.digest(runtime)
    # What the kernel says of the agent's own process: a filter (2) wherever it applies.
    assert info.extra["seccomp"] == (2 if await _profile_applies(runtime_backend) else 0)
    # A command runs under a filter on both runtimes: the agents add one of their own (no
    # setuid/setgid bits, no devices: sandbox/agent/modeguard.py), also where gVisor
    # applies no profile.
    assert info.extra["modeguard"] == "on"
    r = await box.exec(ExecRequest("grep Seccomp: /proc/self/status"))
    assert r.stdout.split()[-1] == b"2"


async def test_a_32_bit_system_call_ends_the_program(runtime_backend: DockerBackend, workspace: Path) -> None:
    """Only the 64-bit system call tables are in the profile: `int $0x80` (i386 getpid)
    from a 64-bit program is killed by the filter (SIGSYS) under runc; gVisor has no 32-bit
    table at all, profile or not: the call fails (EINVAL on its ptrace platform, ENOSYS on
    systrap)."""
    (workspace / "i386.c").write_text(
        "#include <stdio.h>\n"
        'int main(void) { long r; __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");'
        ' printf("%ld\\n", r); return 0; }\n'
    )
    box = await runtime_backend.get(workspace)
    r = await box.exec(ExecRequest("gcc -o i386 i386.c && ./i386; echo status=$?", timeout=60))
    if runtime_backend.spec.runtime == "runc":
        assert r.stdout.endswith(b"status=159\n"), r  # 128 + SIGSYS
    else:
        errno = 22 if runtime_backend.spec.gvisor_platform == "ptrace" else 38
        assert r.stdout == b"-%d\nstatus=0\n" % errno, r


async def test_compilers_threads_and_runtimes_work_under_the_profile(
    runtime_backend: DockerBackend, workspace: Path
) -> None:
    (workspace / "hello.c").write_text(
        "#include <pthread.h>\n#include <stdio.h>\n"
        "static void *run(void *a) { return a; }\n"
        "int main(void) { pthread_t t; void *r; pthread_create(&t, 0, run, (void *)42);"
        ' pthread_join(t, &r); printf("thread %ld\\n", (long)r); return 0; }\n'
    )
    (workspace / "threads.py").write_text(
        "import concurrent.futures, multiprocessing\n"
        "print(sum(concurrent.futures.ThreadPoolExecutor(4).map(abs, range(-9, 0))))\n"
        "if __name__ == '__main__':\n    print(multiprocessing.Pool(2).map(abs, [-1, -2]))\n"
    )
    (workspace / "worker.js").write_text(
        'const { Worker } = require("worker_threads");\n'
        "new Worker(\"require('worker_threads').parentPort.postMessage(7)\", { eval: true })\n"
        '  .on("message", (m) => console.log("worker", m));\n'
        'require("fs").promises.readFile("hello.c").then((b) => console.log("read", b.length > 0));\n'
    )
    box = await runtime_backend.get(workspace)
    r = await box.exec(
        ExecRequest(
            "gcc -O1 -pthread -o hello hello.c && ./hello && python3 threads.py && node worker.js | sort"
            " && git init -q g && git -C g -c user.email=a@b -c user.name=n commit -q --allow-empty -m x && echo git",
            timeout=120,
        )
    )
    assert r.exit_code == 0, r
    assert r.stdout.decode().split("\n") == ["thread 42", "45", "[1, 2]", "read true", "worker 7", "git", ""]


@pytest.fixture
def debug_image() -> str:
    """The sandbox image with strace and gdb (images/test/build-test-images.sh)."""
    try:
        client = docker.from_env()
        try:
            client.images.get(DEBUG_IMAGE)
        finally:
            client.close()
    except docker.errors.ImageNotFound:
        if REQUIRE_DOCKER:
            pytest.fail(f"REQUIRE_DOCKER=1 but {DEBUG_IMAGE} is not built (images/test/build-test-images.sh)")
        pytest.skip(f"{DEBUG_IMAGE} is not built (images/test/build-test-images.sh)")
    return DEBUG_IMAGE


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_strace_and_gdb_of_a_program_they_start_work(
    docker_ready: None, debug_image: str, workspace: Path, runtime: str
) -> None:
    """Tracing one's own children stays: strace (which falls back to PTRACE_TRACEME when
    it may not seize) and gdb (which always starts its program that way). Attaching to a
    process the tracer did not start (strace -p) is refused."""
    require_runtime(runtime)
    (workspace / "t.c").write_text(
        '#include <stdio.h>\nint main(void) {\n  int x = 41;\n  x++;\n  printf("x=%d\\n", x);\n}\n'
    )
    async with own_backend(runtime, image=debug_image) as backend:
        box = await backend.get(workspace)
        r = await box.exec(
            ExecRequest(
                "gcc -g -O0 -o t t.c"
                " && strace -f -e trace=write -o trace.txt ./t && grep -c 'write(1, \"x=42' trace.txt"
                " && gdb -q -batch -ex 'break 5' -ex run -ex 'print x' ./t 2>&1 | grep '^\\$1'"
                " && { sleep 30 & sleep 0.5; strace -p $! 2>&1 | head -1; kill $!; }",
                timeout=120,
            )
        )
    lines = r.stdout.decode().splitlines()
    assert lines[:3] == ["x=42", "1", "$1 = 42"], r  # the program's output, strace's record, gdb's answer
    assert len(lines) == 4 and "attach" in lines[3] and "Operation not permitted" in lines[3], r


class _EngineDropsTheProfile(DockerBackend):
    """An engine that creates the container without the profile (an engine without seccomp
    support, or one that rewrites security options): the backend must refuse to run."""

    def container_config(self, ws: Path) -> dict[str, Any]:
        cfg = super().container_config(ws)
        cfg["security_opt"] = ["no-new-privileges"]
        return cfg


async def test_a_container_without_the_profile_is_refused(docker_ready: None, workspace: Path) -> None:
    from sandbox.spec import SandboxSpec
    from tests.conftest import SANDBOX_IMAGE

    backend = _EngineDropsTheProfile(SandboxSpec(image=SANDBOX_IMAGE), worker_id="test")
    try:
        box = await backend.get(workspace)
        with pytest.raises(RuntimeUnavailableError, match="seccomp profile"):
            await box.exec(ExecRequest("true"))
        assert await backend.inspect(workspace) is None  # removed before anything ran
    finally:
        await backend.remove_all_started()
        await backend.aclose()


async def test_a_running_container_made_with_another_profile_is_replaced(docker_ready: None, workspace: Path) -> None:
    """A container of an earlier worker (the engine's default profile, same labels otherwise)
    is not reused: it is replaced by one with this profile."""
    backend = make_backend()
    client = docker.from_env()
    try:
        await backend.prepare()
        cfg = backend.container_config(workspace.resolve())
        cfg["security_opt"] = ["no-new-privileges"]
        old = await asyncio.to_thread(client.containers.create, **cfg)
        await asyncio.to_thread(old.start)
        box = await backend.get(workspace)
        assert (await box.exec(ExecRequest("grep Seccomp: /proc/self/status"))).stdout.split()[-1] == b"2"
        attrs = await backend.inspect(workspace)
        assert attrs is not None and attrs["Id"] != old.id
        assert seccomp.security_opt(backend.spec.runtime) in attrs["HostConfig"]["SecurityOpt"]
    finally:
        for c in client.containers.list(all=True, filters={"name": container_name(workspace.resolve())}):
            c.remove(force=True)
        client.close()
        await backend.aclose()


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_doctor_says_whether_the_profile_is_in_effect(docker_ready: None, runtime: str) -> None:
    import subprocess
    import sys

    from tests.conftest import SANDBOX_IMAGE

    require_runtime(runtime)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_RUNTIME": runtime,
        "LOOM_LOG_LEVEL": "warning",
        "PYTHONPATH": str(root),
    }
    p = await asyncio.to_thread(
        subprocess.run,
        [str(Path(sys.executable).with_name("loom-worker")), "doctor"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    backend = make_backend(runtime)
    try:
        applies = await _profile_applies(backend)
    finally:
        await backend.aclose()
    if applies:
        expected = (
            f"[ok] seccomp profile: loom profile {seccomp.digest(runtime)} ({runtime}) kept by the engine and in effect"
        )
    else:
        expected = (
            f"[note] seccomp profile: loom profile {seccomp.digest(runtime)} ({runtime}) passed, but runsc ignores it"
        )
    assert expected in p.stdout, p.stdout
