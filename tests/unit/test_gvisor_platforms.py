"""Which engine runtime runs gVisor on a platform, and what counts as the platform in
effect (sandbox/docker/gvisor.py); the real engine: tests/docker/test_gvisor_platform.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sandbox.docker import gvisor
from sandbox.errors import RuntimeUnavailableError
from sandbox.spec import SandboxSpec

RUNSC = "/usr/local/lib/loom/runsc"


def entry(*args: str) -> dict[str, object]:
    return {"path": RUNSC, "runtimeArgs": list(args)}


def test_platform_of_arguments() -> None:
    assert gvisor.platform_of_args(["--platform=ptrace", "--network=none"]) == "ptrace"
    assert gvisor.platform_of_args(["--network=none"]) == "systrap"  # runsc's own default
    assert gvisor.platform_of_args(["--platform", "kvm"]) == "kvm"
    assert gvisor.platform_of_args(["--platform=ptrace", "--platform=systrap"]) == "systrap"  # the last wins


def test_the_platforms_own_runtime_comes_first() -> None:
    runtimes = {
        "runc": {"path": "runc"},
        "runsc": entry("--platform=ptrace"),
        "runsc-systrap": entry("--platform=systrap"),
    }
    assert gvisor.engine_runtime(runtimes, "systrap") == "runsc-systrap"
    assert gvisor.engine_runtime(runtimes, "ptrace") == "runsc"  # runsc itself, registered for it


def test_runsc_registered_without_a_platform_runs_the_default() -> None:
    assert gvisor.engine_runtime({"runsc": entry("--network=none")}, "systrap") == "runsc"


def test_no_runtime_for_the_platform_is_refused_naming_what_there_is() -> None:
    with pytest.raises(RuntimeUnavailableError, match="LOOM_GVISOR_PLATFORM=systrap") as e:
        gvisor.engine_runtime({"runsc": entry("--platform=ptrace")}, "systrap")
    assert "runsc (--platform=ptrace)" in str(e.value) and "runsc-systrap" in str(e.value)
    with pytest.raises(RuntimeUnavailableError, match="no runsc runtime registered"):
        gvisor.engine_runtime({"runc": {"path": "runc"}}, "systrap")


def test_a_platform_runtime_registered_with_another_platform_is_refused() -> None:
    with pytest.raises(RuntimeUnavailableError, match="registered with --platform=ptrace, not systrap"):
        gvisor.engine_runtime({"runsc-systrap": entry("--platform=ptrace")}, "systrap")


def _container(runtime: str, pid: int = 0) -> SimpleNamespace:
    return SimpleNamespace(attrs={"HostConfig": {"Runtime": runtime}, "State": {"Pid": pid}})


def test_the_platform_in_effect_must_be_the_one_asked_for() -> None:
    runtimes = {"runsc-systrap": entry("--platform=systrap"), "runsc-ptrace": entry("--platform=ptrace")}
    # No process to read (pid 0): the registration of the runtime it runs on stands in.
    assert gvisor.check_platform(_container("runsc-systrap"), runtimes, "systrap") == ("systrap", "registration")
    with pytest.raises(RuntimeUnavailableError, match="runs on ptrace"):
        gvisor.check_platform(_container("runsc-ptrace"), runtimes, "systrap")
    with pytest.raises(RuntimeUnavailableError, match="runtime 'runc'"):
        gvisor.check_platform(_container("runc"), runtimes, "systrap")


def test_a_process_that_is_not_gvisors_says_nothing(tmp_path) -> None:
    import os

    assert gvisor.platform_in_effect(os.getpid()) is None  # this test's python, no `runsc ... boot`
    assert gvisor.platform_in_effect(2**22 + 12345) is None  # no such process


def test_the_host_pids_limit_follows_the_platform() -> None:
    assert SandboxSpec(runtime="runc", pids=256).host_pids_limit() == 256
    assert SandboxSpec(runtime="runsc", gvisor_platform="systrap", pids=256).host_pids_limit() == 256 * 3 + 128
    assert SandboxSpec(runtime="runsc", gvisor_platform="ptrace", pids=256).host_pids_limit() == 256 * 4 + 128


def test_the_platform_is_part_of_a_gvisor_sandboxs_fingerprint_only() -> None:
    """A change of platform replaces gVisor sandboxes, not runc ones."""
    assert (
        SandboxSpec(runtime="runc", gvisor_platform="ptrace").fingerprint() == SandboxSpec(runtime="runc").fingerprint()
    )
    assert (
        SandboxSpec(runtime="runsc", gvisor_platform="ptrace").fingerprint()
        != SandboxSpec(runtime="runsc", gvisor_platform="systrap").fingerprint()
    )


def test_the_agent_dials_where_the_host_mounts_its_sockets() -> None:
    from sandbox.agent import channel
    from sandbox.spec import CHANNEL_MOUNT

    assert channel.DIAL_DIR == CHANNEL_MOUNT + "/"


def test_only_this_containers_gvisor_is_taken_as_the_channels_peer() -> None:
    import socket

    from sandbox.docker.channel import _peer_is

    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        assert not _peer_is(a, "f00dfeed" * 8)  # the peer is this test's python, not that container's gVisor
        assert _peer_is(a, "")  # no container id to check against: the secret decides
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("path", ["/tmp/x.sock", "/.loom-host/../etc/x", "/.loom-host/a/b.sock", 3])
def test_the_agent_dials_nothing_but_a_socket_of_the_hosts(path: object) -> None:
    from sandbox.agent import channel
    from sandbox.agent.errors import Refused

    with pytest.raises(Refused):
        channel.dial_direct(path, lambda reader: None)


async def test_the_gvisor_check_waits_for_the_hello_as_long_as_the_start_does() -> None:
    """The hello that proves gVisor's kernel is part of the sandbox's start: it waits the
    start's deadline (``agent_start_timeout``), not a liveness check's 10 s, which 100
    gVisor sandboxes starting at once on two cores overran."""
    from typing import Any

    from sandbox.docker.checks import RuntimeCheck, verify_gvisor

    asked: list[float] = []

    class Conn:
        async def request(self, op: str, args: dict[str, Any], *, timeout: float) -> dict[str, Any]:
            asked.append(timeout)
            hello = {"version": "1", "uid": 1000, "gid": 1000, "pid": 7, "python": "3.11.2", "kernel": "4.4.0"}
            return hello

    class Engine:
        async def call(self, what: str, fn: Any, *args: Any) -> Any:
            return fn(*args)

    container = SimpleNamespace(reload=lambda: None, **vars(_container("runsc-systrap")))
    checks = RuntimeCheck(Engine())  # type: ignore[arg-type]
    checks.runtimes = {"runsc-systrap": entry("--platform=systrap")}
    spec = SandboxSpec(image="loom-sandbox:latest", runtime="runsc", agent_start_timeout=45.0)
    await verify_gvisor(Engine(), Conn(), container, checks, spec)  # type: ignore[arg-type]
    assert asked == [45.0]
