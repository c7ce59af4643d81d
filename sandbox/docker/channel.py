"""The agent channel: how the host talks to a container's agents.

The container's main process is an agent reached over the engine's attach stream
(:meth:`AgentChannels.attach_agent`); other processes start their own with one ``docker exec``
(:meth:`AgentChannels.exec_agent`). Under runc a connection then moves to the agent's unix
socket on the container's /tmp, reached through ``/proc/<pid>/root`` (the direct
channel, :meth:`AgentChannels.go_direct`), and takes an fd channel for tunnels beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import secrets
import socket
import stat as statmod
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from .. import protocol
from ..connection import AgentConnection, SocketTransport, StreamProtocol, StreamTransport
from ..errors import (
    ImageUnusableError,
    RuntimeUnavailableError,
    SandboxError,
    SandboxLostError,
    SandboxUnavailableError,
)
from ..handover import FdChannel, take_fd_channel
from ..logs import get_logger
from ..spec import ACTIVITY_FILE, AGENT_COMMAND, CHANNEL_MOUNT, WORKSPACE_MOUNT, SandboxSpec
from .checks import RuntimeCheck, check_seccomp_mode
from .config import channel_dir, owner
from .engine import Engine
from .slots import workspace_of

log = get_logger("sandbox.docker")


class _AttachProtocol(StreamProtocol):
    """The attach stream: Docker's frames are demuxed as they arrive and handed on."""

    def __init__(self) -> None:
        super().__init__()
        self.demux = protocol.Demuxer()

    def buffer_updated(self, nbytes: int) -> None:
        # The demuxer copies what it keeps: the buffer is reused by the next read.
        out, err = self.demux.feed(self._buffer[:nbytes])
        if out or err:
            self.feed.data(out, err)


class DockerExecTransport(StreamTransport):
    """An attached ``docker exec`` stream (hijacked HTTP connection) on an
    ``asyncio.Protocol`` that pushes each response to the connection as it arrives
    (see :class:`~sandbox.connection.ProtocolFeed`)."""

    def __init__(self, sock_io: Any, transport: asyncio.Transport, proto: _AttachProtocol) -> None:
        super().__init__(transport, proto)
        self._keep = sock_io  # keeps the HTTP response (and so the socket) alive

    @classmethod
    async def open(cls, sock_io: Any, early: bytes = b"") -> DockerExecTransport:
        """Over the hijacked connection ``sock_io`` (a socket, or the SDK's wrapper of
        one); ``early``: bytes of the stream read with the engine's answer. Closes
        ``sock_io`` and raises SandboxUnavailableError when it holds no plain socket."""
        raw = getattr(sock_io, "_sock", sock_io)
        if not isinstance(raw, socket.socket):
            with contextlib.suppress(Exception):
                sock_io.close()
            raise SandboxUnavailableError("Docker endpoint gives no plain socket (TLS/SSH hosts are not supported)")
        raw.setblocking(False)
        try:
            transport, proto = await asyncio.get_running_loop().create_connection(_AttachProtocol, sock=raw)
        except BaseException:
            with contextlib.suppress(OSError):
                sock_io.close()
            raise
        if early:
            proto.feed.data(*proto.demux.feed(early))
        return cls(sock_io, cast(asyncio.Transport, transport), proto)

    async def close(self) -> None:
        await super().close()
        with contextlib.suppress(OSError):
            self._keep.close()


_AGENT_SOCKET = re.compile(r"/tmp/(loom-direct-[A-Za-z0-9_]{1,64})/s")


async def connect_agent_socket(pid: int, path: str) -> SocketTransport:
    """Connect to the agent's socket at ``path`` inside the container whose process
    ``pid`` (host pid namespace) is given, without following any link the sandbox could
    have planted on the way.

    A command in the container runs as the agent's uid, so between the agent's offer and
    this connect it could swap the directory or the socket for a symlink, say to
    ``/var/run/docker.sock``: resolved from the host, an absolute link leaves the
    container. So the path is walked from ``/proc/<pid>/root`` one component at a time
    with ``O_NOFOLLOW``, the last one must be a socket, and the connect goes through
    ``/proc/self/fd`` to exactly that inode. (The handshake's secret would expose a
    foreign listener anyway; this keeps a root worker from even connecting to one.)

    Raises OSError when the path is malformed, unreachable, a link, or not a socket.
    """
    with _agent_socket_path(pid, path) as safe:
        return await SocketTransport.connect(safe)


async def connect_fd_channel(pid: int, path: str) -> FdChannel:
    """Connect to the agent's fd channel at ``path`` (a ``SOCK_SEQPACKET`` socket; see
    ``sandbox/agent/tunnel.py``), walked as :func:`connect_agent_socket` walks it.
    Raises OSError as it does."""
    with _agent_socket_path(pid, path) as safe:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, safe)
        except OSError:
            sock.close()
            raise
        return FdChannel(sock)


@contextlib.contextmanager
def _agent_socket_path(pid: int, path: str) -> Iterator[str]:
    """A ``/proc/self/fd/N`` path to exactly the socket inode at ``path`` in the container,
    valid inside the ``with``. Raises OSError (see :func:`connect_agent_socket`)."""
    m = _AGENT_SOCKET.fullmatch(path)
    if m is None:
        raise OSError(errno.EINVAL, "unexpected agent socket path", path)
    fds: list[int] = []
    try:
        fds.append(os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        for name in ("tmp", m.group(1)):
            fds.append(os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        fds.append(os.open("s", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        if not statmod.S_ISSOCK(os.fstat(fds[-1]).st_mode):
            raise OSError(errno.ENOTSOCK, "the agent's socket is not a socket", path)
        yield f"/proc/self/fd/{fds[-1]}"
    finally:
        for fd in fds:
            os.close(fd)


class AgentChannels:
    """Opens agent connections to the containers of one backend, and remembers where the
    direct channel does not work: nowhere from this process (:attr:`unreachable`: no
    access to ``/proc/<pid>/root`` at all) or in some containers (:attr:`failed`: the
    handshake failed there, possibly a command interfering); those stay on the attach
    stream."""

    def __init__(self, engine: Engine, runtime_check: RuntimeCheck) -> None:
        self._engine = engine
        self._runtime_check = runtime_check
        self.unreachable = False
        self.failed: set[str] = set()
        #: Main agents being booted, by container id (:meth:`abort_boots`).
        self._booting: dict[str, set[AgentConnection]] = {}

    def abort_boots(self, container_id: str) -> None:
        """The container was removed: end the boots of its main agent under way. (The
        engine may leave the attach stream of a container removed under it open and
        unread; the boot would wait for its write until its timeout.)"""
        for conn in self._booting.pop(container_id, set()):
            task = asyncio.ensure_future(conn.close("its container was removed"))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def attach_agent(
        self, container: Any, spec: SandboxSpec, preloaded: DockerExecTransport | None = None, *, keeper: bool = True
    ) -> AgentConnection:
        """Talk to the container's main process (an agent waiting for its source), or with
        ``preloaded`` (a warm sandbox's attach stream, :mod:`.pool`) to one that has its
        source already and waits for its config. ``keeper``: whether it becomes the
        container's keeper now (else at its ``keeper`` request; until then it ends when
        this process goes)."""
        if preloaded is None:
            transport = await DockerExecTransport.open(*await self._engine.attach(container.id, "attach sandbox agent"))
        else:
            transport = preloaded
        conn = AgentConnection(transport, label=container.name)
        booting = self._booting.setdefault(container.id, set())
        booting.add(conn)
        try:
            hello = await self._boot(conn, container, spec, preloaded is not None, keeper)
        finally:
            booting.discard(conn)
            if not booting and self._booting.get(container.id) is booting:
                del self._booting[container.id]
        await self.check_hello(conn, hello, spec)
        return conn

    async def _boot(
        self, conn: AgentConnection, container: Any, spec: SandboxSpec, preloaded: bool, keeper: bool
    ) -> dict[str, Any]:
        """Send the main agent its config (and its code unless ``preloaded``); its hello."""
        return await conn.start(
            {
                "root": WORKSPACE_MOUNT,
                "activity_file": ACTIVITY_FILE,
                **({"keeper_ttl": spec.idle_ttl} if keeper else {}),
                # allow_root: the container's main process starts as root; the agent
                # becomes the owner before anything else.
                **({"run_as": list(owner(_workspace(container), spec))} if spec.allow_root else {}),
                **spec.agent_config(),
            },
            timeout=spec.agent_start_timeout,
            preloaded=preloaded,
        )

    async def check_hello(self, conn: AgentConnection, hello: dict[str, Any], spec: SandboxSpec) -> None:
        """What a new agent's hello must show: the seccomp profile in effect
        (:func:`~.checks.check_seccomp_mode`), and an image the tools can work in (the
        agent itself runs in any image). Closes ``conn`` and raises
        RuntimeUnavailableError or ImageUnusableError otherwise."""
        try:
            check_seccomp_mode(hello, runtime=spec.runtime, runsc_oci_seccomp=self._runtime_check.runsc_oci_seccomp)
        except RuntimeUnavailableError:
            await conn.close("seccomp profile not in effect")
            raise
        if hello.get("shell") is False:
            await conn.close()
            raise ImageUnusableError(
                f"image {spec.image} has no /bin/sh: shell_execute runs commands with the image's own "
                "/bin/sh, so this image cannot be a sandbox. Add a shell to it (for example busybox) or use "
                "another image."
            )

    async def exec_agent(
        self, container: Any, spec: SandboxSpec, user: tuple[int, int] | None = None
    ) -> AgentConnection:
        """Start another agent in the running container (one ``docker exec``) and talk to
        it: as the workspace owner, or as ``user`` (uid, gid: a harness's command as
        another user, see ``DockerSandbox.as_user``), from ``/`` (another user may not
        enter the workspace)."""
        api = (await self._engine.connect()).api
        uid, gid = user if user is not None else owner(_workspace(container), spec)

        def start() -> Any:
            ex = api.exec_create(
                container.id,
                [*AGENT_COMMAND, protocol.BOOTSTRAP],
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                workdir=WORKSPACE_MOUNT if user is None else "/",
                user=f"{uid}:{gid}",  # always said: with allow_root the container's user is root
            )
            return api.exec_start(ex["Id"], socket=True)

        sock_io = await self._engine.call("start sandbox agent", start)
        transport = await DockerExecTransport.open(sock_io)
        conn = AgentConnection(transport, label=container.name)
        config: dict[str, Any] = {"root": WORKSPACE_MOUNT, "activity_file": ACTIVITY_FILE, **spec.agent_config()}
        if user is not None:
            config["as_user"] = True
        hello = await conn.start(config, timeout=spec.agent_start_timeout)
        await self.check_hello(conn, hello, spec)
        return conn

    async def go_direct(
        self, conn: AgentConnection, container: Any, spec: SandboxSpec, user: tuple[int, int] | None = None
    ) -> AgentConnection:
        """Move ``conn`` to the agent's direct channel: a unix socket on the container's
        /tmp, reached through ``/proc/<pid>/root`` (~0.04 ms per round trip instead of
        ~0.4 ms through the engine). Stays on the attach stream when that path is not
        reachable (a worker without ptrace-read access to the container, or inside
        another pid namespace) and from then on stops trying. gVisor never gets here:
        its /tmp lives inside the sandbox kernel. ``user``: the agent's, when it is not the
        owner's (:meth:`exec_agent`); a replacement agent runs as that user too.

        Raises SandboxLostError/SandboxUnavailableError only when starting a plain
        replacement agent fails as well.
        """
        pid = (container.attrs.get("State") or {}).get("Pid") or 0
        if not pid:
            await self._engine.call("inspect sandbox", container.reload)
            pid = (container.attrs.get("State") or {}).get("Pid") or 0
        if not isinstance(pid, int) or pid <= 0:
            return conn
        try:
            os.close(os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as e:
            # No access to the container's processes from here (another pid namespace, no
            # ptrace-read access): true of every container, so do not ask again.
            log.info("sandbox.direct_unavailable", container=container.name, error=repr(e))
            self.unreachable = True
            return conn

        async def open_socket(path: str) -> SocketTransport:
            return await connect_agent_socket(pid, path)

        try:
            if await conn.go_direct(open_socket, timeout=spec.agent_start_timeout):
                await self._take_fd_channel(conn, pid, container.name, spec)
                return conn
            # The container's root was reachable but the socket was not (a command may
            # have moved it): this container stays on the attach stream.
            self._failed(container, user)
            return conn
        except SandboxLostError as e:
            # The agent may have moved already: this connection is closed. Start a plain
            # one (the container is fine) and stay on attach streams from now on.
            log.warning("sandbox.direct_failed", container=container.name, error=str(e))
            self._failed(container, user)
            return await self.exec_agent(container, spec, user)

    async def dial_direct(
        self, conn: AgentConnection, container: Any, spec: SandboxSpec, ws: Path, user: tuple[int, int] | None = None
    ) -> AgentConnection:
        """Under gVisor, move ``conn`` to a direct channel the agent dials: this process
        listens on a unix socket of its own in the workspace's channel directory (mounted
        read-only at CHANNEL_MOUNT: :func:`~.config.channel_dir`), the agent connects and
        proves itself with the connection's secret (``go_direct``), and the socket file
        is removed at once. ~0.05 ms per round trip instead of ~0.5 ms through the engine.

        Only this container's gVisor (its gofer makes the connection on the sandbox's
        behalf) is taken as the peer where its process is visible; the socket is the
        sandbox user's alone (0600) where this process may give it away, and the secret
        decides in any case. Stays on the attach stream when the directory is missing or
        the agent cannot connect. ``user``: the agent's, when it is not the owner's
        (:meth:`exec_agent`): the socket is given to that user, and a replacement agent
        runs as that user too. Raises SandboxLostError/SandboxUnavailableError only
        when starting a plain replacement agent fails as well.
        """
        d = channel_dir(ws, spec)
        if d is None:
            return conn
        d = _mounted_channel(container) or d  # a warm sandbox's is its slot's, made before its claim
        name = f"c-{secrets.token_hex(8)}.sock"
        path = d / name
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            # Bound through the directory's descriptor: a unix socket's path may not exceed
            # 107 bytes, and a data directory's path can be long.
            dfd = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                lst.bind(f"/proc/self/fd/{dfd}/{name}")
            finally:
                os.close(dfd)
            _give_to_sandbox(path, (user or owner(ws, spec))[0])
            lst.listen(4)
            lst.setblocking(False)
        except OSError as e:
            lst.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            log.warning("sandbox.direct_unavailable", container=container.name, error=repr(e))
            return conn
        loop = asyncio.get_running_loop()
        cid = str(getattr(container, "id", "") or "")

        async def take(_path: str) -> SocketTransport:
            while True:
                sock, _ = await loop.sock_accept(lst)
                if _peer_is(sock, cid):
                    return await SocketTransport.of_socket(sock)
                sock.close()  # a process of this host that is not this container's gVisor

        try:
            if await conn.go_direct(take, timeout=spec.agent_start_timeout, dial=f"{CHANNEL_MOUNT}/{name}"):
                return conn
            self._failed(container, user)
            return conn
        except SandboxLostError as e:
            log.warning("sandbox.direct_failed", container=container.name, error=str(e))
            self._failed(container, user)
            return await self.exec_agent(container, spec, user)
        finally:
            lst.close()
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _failed(self, container: Any, user: tuple[int, int] | None) -> None:
        """Remember a container where the owner's agent could not go direct; another
        user's agent failing says nothing of the owner's (its /tmp access differs)."""
        if user is None:
            self.failed.add(container.name)

    async def _take_fd_channel(self, conn: AgentConnection, pid: int, name: str, spec: SandboxSpec) -> None:
        """Where the direct channel works, the agent can also hand tunnels' sockets over
        whole (:mod:`sandbox.tunnel`): a port-forward at the speed of the sandbox's own
        loopback. Best effort: on any failure tunnels are relayed over the channel."""

        async def open_channel(path: str) -> FdChannel:
            return await connect_fd_channel(pid, path)

        try:
            await take_fd_channel(conn, open_channel, timeout=spec.agent_start_timeout)
        except (SandboxError, OSError, TimeoutError) as e:
            log.info("sandbox.fd_channel_unavailable", container=name, error=repr(e))


def _workspace(container: Any) -> Path:
    """The workspace ``container`` serves (its label, or a warm sandbox's claim). Raises
    SandboxLostError when it serves none any more (its claim's bind is gone)."""
    ws = workspace_of(container.labels)
    if ws is None:
        raise SandboxLostError(f"{container.name} serves no workspace")
    return Path(ws)


def _mounted_channel(container: Any) -> Path | None:
    """The channel directory the engine mounted in ``container`` (its inspect), if any."""
    for m in (getattr(container, "attrs", None) or {}).get("Mounts") or []:
        if m.get("Destination") == CHANNEL_MOUNT and m.get("Source"):
            return Path(m["Source"])
    return None


def prepare_channel_dir(d: Path) -> None:
    """Make workspace channel directory ``d`` (see :func:`~.config.channel_dir`) so a
    container can mount it: the root traversable only, ``d`` readable by the sandbox's
    user (any uid), as the egress gateway's. Raises OSError."""
    d.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o755)


def _give_to_sandbox(path: Path, uid: int) -> None:
    """Let the sandbox's user connect to our socket at ``path`` (gVisor checks the
    file's mode against the sandboxed process): theirs alone where possible."""
    if uid == os.geteuid():
        os.chmod(path, 0o600)
    elif os.geteuid() == 0:
        os.chown(path, uid, -1)
        os.chmod(path, 0o600)
    else:  # another user's sandbox and no right to give the file away: the secret decides
        os.chmod(path, 0o666)


def _peer_is(sock: socket.socket, container_id: str) -> bool:
    """Whether the peer of ``sock`` can be this container's gVisor (its gofer connects
    on the sandbox's behalf, a process whose command line names the container): True
    also when the peer's process is not visible from here (another pid namespace)."""
    try:
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, struct.error):
        return True
    return not pid or not container_id or container_id.encode() in cmdline
