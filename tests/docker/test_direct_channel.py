"""The agent's direct channel: a unix socket on the container's /tmp that the host reaches
through /proc/<pid>/root, replacing the engine's attach stream for requests (runc only).

What must hold: traffic really moves to it; only the host can take it (a command racing
to connect is turned away, an impostor listener is detected by the secret); nothing is
left on /tmp; when the socket is out of reach the worker stays on the attach stream; a
host vanishing mid-answer does not take the container's keeper down with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import connection as connmod
from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend, connect_agent_socket
from sandbox.errors import SandboxLostError
from tests.docker.conftest import make_backend

pytestmark = pytest.mark.docker


def _host_socket(prefix: str) -> tuple[socket.socket, str]:
    """A listening, non-blocking unix socket on the host in a fresh directory, and its path."""
    path = os.path.join(tempfile.mkdtemp(prefix=prefix), "s")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)
    srv.setblocking(False)
    return srv, path


@contextlib.asynccontextmanager
async def fake_listener(first_line: bytes) -> AsyncIterator[str]:
    """A unix socket on the host that answers a connect with ``first_line`` (not knowing
    any connection's secret); yields its path."""
    srv, path = _host_socket("loom-impostor-")
    loop = asyncio.get_running_loop()

    async def serve() -> None:
        c, _ = await loop.sock_accept(srv)
        await loop.sock_sendall(c, first_line)
        await asyncio.sleep(2)
        c.close()

    server = asyncio.create_task(serve())
    try:
        yield path
    finally:
        server.cancel()
        srv.close()
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


@contextlib.asynccontextmanager
async def own_backend(**spec: Any) -> AsyncIterator[DockerBackend]:
    """A backend whose containers are removed when the block ends."""
    backend = make_backend(**spec)
    try:
        yield backend
    finally:
        await backend.remove_all_started()
        await backend.aclose()


async def assert_stays_on_attach(backend: DockerBackend, workspace: Path) -> None:
    """The direct channel failed for this container only: it works on the attach stream."""
    conn = await _conn(backend, workspace)
    assert not conn.direct
    box = await backend.get(workspace)
    assert (await box.exec(ExecRequest("echo carried-on"))).stdout == b"carried-on\n"
    assert backend.channels.failed == {box.container_name} and not backend.channels.unreachable


async def _conn(backend: DockerBackend, ws: Path) -> connmod.AgentConnection:
    box = await backend.get(ws)
    return await box.connection()  # type: ignore[attr-defined,no-any-return]


async def test_runc_agents_talk_over_the_direct_channel(docker_ready: None, workspace: Path) -> None:
    first = make_backend()
    second = make_backend()  # a second worker process: exec'd agent in the same container
    try:
        (workspace / "a.txt").write_text("hello")
        for backend in (first, second):
            conn = await _conn(backend, workspace)
            assert conn.direct, conn.close_reason
            box = await backend.get(workspace)
            assert (await box.read("a.txt")).data == b"hello"
            r = await box.exec(ExecRequest("echo out; echo err >&2; exit 3"))
            assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
        # the listener and its directory are gone once the host is connected
        r = await (await second.get(workspace)).exec(ExecRequest("ls -a /tmp"))
        assert "loom-direct" not in r.stdout.decode()
    finally:
        await second.aclose()
        await first.remove_all_started()
        await first.aclose()


async def test_direct_off_keeps_the_attach_stream(docker_ready: None, workspace: Path) -> None:
    async with own_backend(direct=False) as backend:
        conn = await _conn(backend, workspace)
        assert not conn.direct
        assert (await (await backend.get(workspace)).exec(ExecRequest("echo ok"))).stdout == b"ok\n"


async def test_a_command_in_the_sandbox_cannot_take_the_channel(docker_ready: None, workspace: Path) -> None:
    """Offer the channel by hand, let a command connect first: the agent hangs up on it
    (its pid is visible in the container's pid namespace) and still accepts the host."""
    backend = make_backend(direct=False)
    helper = make_backend(direct=False)
    try:
        conn = await _conn(backend, workspace)
        offer = await conn.request("direct", {}, timeout=10)
        path = offer["path"]
        probe = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            f"s.connect({path!r})\n"
            "s.settimeout(3)\n"
            "try:\n"
            "    d=s.recv(100)\n"
            "except OSError as e:\n"
            "    d=repr(e).encode()\n"
            "print('GOT', d)\n"
        )
        (workspace / "probe.py").write_text(probe)
        r = await (await helper.get(workspace)).exec(ExecRequest("python3 probe.py"))
        assert r.exit_code == 0, r.stderr
        assert r.stdout.strip() == b"GOT b''", r.stdout  # hung up on, nothing received
        # the host still gets in, and the secret proves it is talking to the agent
        attrs = await backend.inspect(workspace)
        assert attrs is not None
        sock = await connmod.SocketTransport.connect(f"/proc/{attrs['State']['Pid']}/root{path}")
        try:
            first = json.loads(await asyncio.wait_for(sock.first_line(), 10))
            assert first["direct"] is True
            assert first["k"] == conn._nonce
        finally:
            await sock.close()
    finally:
        await helper.remove_all_started()
        await helper.aclose()
        await backend.aclose()


async def test_unreachable_socket_falls_back_to_attach(
    docker_ready: None, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container's root is reachable but its socket is not (a command may have moved
    it): that container stays on the attach stream, and works."""

    async def refuse(path: str) -> connmod.SocketTransport:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(connmod.SocketTransport, "connect", staticmethod(refuse))
    async with own_backend() as backend:
        await assert_stays_on_attach(backend, workspace)


async def test_no_access_to_container_processes_stops_asking(
    docker_ready: None, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No access to /proc/<pid>/root at all (a worker in another pid namespace, as with
    docker compose, or without ptrace-read access): true for every container, so the
    process stays on attach streams without even asking the agents."""
    real_open = os.open

    def guarded_open(path: object, *a: object, **k: object) -> int:
        if isinstance(path, str) and path.startswith("/proc/") and path.endswith("/root"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", guarded_open)
    other = tmp_path / "other"
    other.mkdir()
    async with own_backend() as backend:
        assert not (await _conn(backend, workspace)).direct
        assert backend.channels.unreachable
        asked: list[int] = []
        real_go = connmod.AgentConnection.go_direct

        async def counting(self: connmod.AgentConnection, *a: Any, **k: Any) -> bool:
            asked.append(1)
            return await real_go(self, *a, **k)

        monkeypatch.setattr(connmod.AgentConnection, "go_direct", counting)
        conn2 = await _conn(backend, other)
        box2 = await backend.get(other)
        assert (await box2.exec(ExecRequest("echo ok"))).stdout == b"ok\n"
        assert asked == [] and not conn2.direct


async def test_an_impostor_listener_is_detected(
    docker_ready: None, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the path leads to someone else's listener (it cannot know the connection's
    secret), the handshake fails closed and the worker carries on with a plain agent."""
    real = connmod.SocketTransport.connect
    async with fake_listener(b'{"direct":true,"k":"not-the-secret"}\n') as fake:

        async def impostor(path: str) -> connmod.SocketTransport:
            return await real(fake)

        monkeypatch.setattr(connmod.SocketTransport, "connect", staticmethod(impostor))
        async with own_backend() as backend:
            await assert_stays_on_attach(backend, workspace)


async def test_handshake_failure_after_connect_is_reported(docker_ready: None, workspace: Path) -> None:
    """go_direct itself: a wrong secret closes that connection with SandboxLostError."""
    backend = make_backend(direct=False)
    async with fake_listener(b'{"direct":true}\n') as fake:
        try:
            conn = await _conn(backend, workspace)
            with pytest.raises(SandboxLostError, match="handshake"):
                await conn.go_direct(lambda path: connmod.SocketTransport.connect(fake), timeout=5)
            assert conn.closed
        finally:
            await backend.remove_all_started()
            await backend.aclose()


async def test_host_vanishing_mid_answer_leaves_the_keeper_running(docker_ready: None, workspace: Path) -> None:
    """The container's main agent writes its answers to the socket without SIGPIPE: a host
    that drops the connection during a large answer does not end the container."""
    (workspace / "big.bin").write_bytes(os.urandom(8 << 20))
    async with own_backend() as backend:
        conn = await _conn(backend, workspace)
        assert conn.direct
        pid_before = (await backend.inspect(workspace) or {})["State"]["Pid"]
        task = asyncio.create_task(conn.request("read", {"path": "big.bin", "max_bytes": 8 << 20}, timeout=30))
        await asyncio.sleep(0.005)
        await conn.close("test drops the host")
        with pytest.raises(SandboxLostError):
            await task
        await asyncio.sleep(0.5)
        attrs = await backend.inspect(workspace)
        assert attrs is not None and attrs["State"]["Running"] and attrs["State"]["Pid"] == pid_before
        box = await backend.get(workspace)
        assert (await box.exec(ExecRequest("echo alive"))).stdout == b"alive\n"
        assert (await box.connection()).direct  # type: ignore[attr-defined]


@pytest.mark.parametrize("direct", [True, False])
def test_doctor_checks_the_engine_and_names_the_agent_channel(docker_ready: None, direct: bool) -> None:
    """`loom-worker doctor` on a working machine: every check passes (exit 0) and it says
    which channel the agent answered on."""
    import subprocess

    from tests.conftest import SANDBOX_IMAGE

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_LOG_LEVEL": "warning",
        "LOOM_DIRECT_CHANNEL": "true" if direct else "false",
        "PYTHONPATH": str(root),  # this checkout's code, also from a git worktree without a .venv
    }
    p = subprocess.run(
        [str(Path(sys.executable).with_name("loom-worker")), "doctor"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[ok] docker daemon" in p.stdout and "[ok] sandbox image" in p.stdout
    assert "[ok] sandbox start" in p.stdout
    expected = "agent channel: unix socket (direct)" if direct else "agent channel: engine attach stream\n"
    assert expected in p.stdout, p.stdout


async def test_a_link_planted_at_the_socket_path_is_not_followed(docker_ready: None, workspace: Path) -> None:
    """Between the offer and the connect, a command (same uid as the agent) swaps the socket,
    then its directory, for a symlink to a socket on the host: the worker connects to
    neither (resolved from the host, an absolute link would leave the container)."""
    backend = make_backend(direct=False)
    helper = make_backend(direct=False)
    srv, trap = _host_socket("loom-trap-")
    trap_dir = os.path.dirname(trap)
    try:
        conn = await _conn(backend, workspace)
        attrs = await backend.inspect(workspace)
        assert attrs is not None
        pid = attrs["State"]["Pid"]
        path = (await conn.request("direct", {}, timeout=10))["path"]
        d = os.path.dirname(path)
        box = await helper.get(workspace)
        r = await box.exec(ExecRequest(f"rm {path} && ln -s {trap} {path} && echo swapped"))
        assert r.stdout == b"swapped\n", r.stderr
        with pytest.raises(OSError):
            await connect_agent_socket(pid, path)
        r = await box.exec(ExecRequest(f"mv {d} {d}.x && ln -s {trap_dir} {d} && echo swapped"))
        assert r.stdout == b"swapped\n", r.stderr
        with pytest.raises(OSError):
            await connect_agent_socket(pid, path)
        with pytest.raises(OSError):
            await connect_agent_socket(pid, "/etc/../tmp/x/s")  # only the agent's own shape of path
        with pytest.raises(BlockingIOError):
            srv.accept()  # nobody ever connected to the host socket
    finally:
        srv.close()
        os.unlink(trap)
        os.rmdir(trap_dir)
        await helper.remove_all_started()
        await helper.aclose()
        await backend.aclose()


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_another_users_agent_goes_direct_too(
    docker_ready: None, user_workspace: Path, tmp_path: Path, runtime: str
) -> None:
    """The harness's agent for another user (``as_user``) moves to the direct channel as
    the owner's does (runc: its socket reached through /proc; gVisor: it dials a socket
    given to that user), runs as that user, and leaves the owner's agent direct."""
    from sandbox.client import AgentSandbox
    from tests.docker.conftest import own_backend as backend_of
    from tests.docker.conftest import require_runtime

    require_runtime(runtime)
    spec: dict[str, Any] = {"channel_dir": str(tmp_path / "channels")} if runtime == "runsc" else {}
    async with backend_of(runtime, **spec) as backend:
        box = await backend.get(user_workspace)
        other = await box.as_user("nobody")  # type: ignore[attr-defined]
        assert isinstance(other, AgentSandbox) and other is not box
        r = await box.exec(
            ExecRequest("id -u", cwd="/", any_cwd=True, user="nobody")
        )  # another user may not enter the workspace
        assert (r.exit_code, r.stdout) == (0, b"65534\n"), r
        conn = await other.connection()
        assert conn.direct, conn.close_reason
        assert (await box.connection()).direct  # type: ignore[attr-defined]
        assert not backend.channels.failed
