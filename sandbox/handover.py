"""The fast path of tunnels under runc: the agent hands the connected socket itself to the
host, which then reads and writes it directly, at the speed of the sandbox's own loopback
(the agent's side and its rules are in ``sandbox/agent/tunnel.py``).

Where the worker reached the agent's direct channel (it can open ``/proc/<pid>/root`` of
the container), it also takes the agent's *fd channel*: a ``SOCK_SEQPACKET`` unix socket
that only a peer outside the container may take, whose first message carries the
connection's secret (:func:`take_fd_channel`). A tunnel opened with ``"pass": true``
then comes back as one message ``b"<id>\\n"`` with the socket (``SCM_RIGHTS``), and the
answer ``"passed": true``. Nowhere else (gVisor, a worker in a container as under
``docker compose up``) is there an fd channel: tunnels are relayed over the channel.

The agent is untrusted, so is what it hands over: it must be a TCP socket connected to the
sandbox's loopback, at the port asked for (:func:`adopt`); anything else is closed unused.
The bytes are then exactly what a relayed tunnel would carry, from the same server: the
socket lives in the container's network namespace, which has no other interface.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import ProtocolError, TunnelClosedError

#: Most bytes one read takes from a handed-over socket.
READ_SIZE = 256 << 10


class FdChannel:
    """The host's end of an agent's fd channel: sockets handed over, by tunnel id."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False
        self._waiting: dict[int, asyncio.Future[int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def first_message(self) -> bytes:
        """The agent's first message (its handshake). Raises OSError."""
        return await asyncio.get_running_loop().sock_recv(self.sock, 4096)

    def start(self) -> None:
        """Take handed-over sockets as they come (on the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.fileno(), self._readable)

    def expect(self, tid: int) -> asyncio.Future[int]:
        """The descriptor the agent will hand over for tunnel ``tid`` (register it before
        asking: the socket may come before the answer is read)."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_exception(TunnelClosedError("the fd channel is closed"))
        else:
            self._waiting[tid] = fut
        return fut

    def forget(self, tid: int) -> None:
        fut = self._waiting.pop(tid, None)
        if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
            os.close(fut.result())  # came after all: nobody will use it
        elif fut is not None:
            fut.cancel()

    def _readable(self) -> None:
        while True:
            try:
                msg, anc, flags, _ = self.sock.recvmsg(64, socket.CMSG_SPACE(8 * 4))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            fds: list[int] = []
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(data[: len(data) - len(data) % got.itemsize])
                    fds.extend(got)
            if not msg and not fds:
                self.close()  # the agent is gone
                return
            fut = None
            try:
                tid = int(msg.strip()) if msg.strip().isdigit() else -1
            except ValueError:
                tid = -1
            if len(fds) == 1 and not flags & socket.MSG_CTRUNC:
                fut = self._waiting.pop(tid, None)
            if fut is not None and not fut.done():
                fut.set_result(fds[0])
            else:
                for fd in fds:  # malformed, or nobody waits for it: never used
                    os.close(fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(TunnelClosedError("the fd channel closed"))
        self._waiting.clear()


async def take_fd_channel(conn: Any, open_channel: Callable[[str], Awaitable[FdChannel]], *, timeout: float) -> None:
    """Ask ``conn``'s agent for its fd channel, connect with ``open_channel(path)``, check
    the handshake carries the connection's secret, and attach it (``conn.fd_channel``).

    Raises AgentError (the agent refused), OSError / TimeoutError (unreachable),
    ProtocolError (a bad path or handshake; the channel is then closed, tunnels relayed).
    """
    r = await conn.request("tunnel_fds", {}, timeout=timeout)
    path = r.get("path")
    if not isinstance(path, str) or not path.startswith("/tmp/"):
        raise ProtocolError("agent answered tunnel_fds with a bad path")
    chan = await asyncio.wait_for(open_channel(path), timeout)
    try:
        first = await asyncio.wait_for(chan.first_message(), min(timeout, 5.0))
        msg = json.loads(first.decode())
        if not isinstance(msg, dict) or msg.get("fds") is not True or not conn.owns_secret(msg.get("k")):
            raise ProtocolError("the fd channel did not answer with this connection's secret")
    except BaseException:
        chan.close()
        raise
    chan.start()
    conn.fd_channel = chan


def adopt(fd: int, port: int) -> socket.socket:
    """The socket behind descriptor ``fd`` from the agent, if it is a TCP connection to
    the sandbox's loopback at ``port``, non-blocking. Raises ProtocolError (``fd`` closed)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ProtocolError("the agent handed over something that is not a socket")
        sock = socket.socket(fileno=fd)
    except (OSError, ProtocolError):
        os.close(fd)
        raise
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            raise ProtocolError("the agent handed over a socket that is not TCP")
        peer = sock.getpeername()
        if peer[0] not in ("127.0.0.1", "::1") or peer[1] != port:
            raise ProtocolError(f"the agent handed over a connection to {peer[0]}:{peer[1]}, not port {port}")
        sock.setblocking(False)
    except (OSError, ProtocolError):
        sock.close()
        raise
    return sock


def adopt_unix(fd: int, suffix: str) -> socket.socket:
    """The socket behind descriptor ``fd`` from the agent, if it is a unix stream
    connection to a socket whose path ends in ``suffix`` (a process's supervisor),
    non-blocking. Raises ProtocolError."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ProtocolError("the agent handed over something that is not a socket")
        sock = socket.socket(fileno=fd)
    except (OSError, ProtocolError):
        os.close(fd)
        raise
    try:
        if sock.type != socket.SOCK_STREAM or sock.family != socket.AF_UNIX:
            raise ProtocolError("the agent handed over a socket that is not a unix stream")
        peer = sock.getpeername()
        if not isinstance(peer, str) or not peer.endswith(suffix):
            raise ProtocolError(f"the agent handed over a connection to {peer!r}, not a process's")
        sock.setblocking(False)
    except (OSError, ProtocolError):
        sock.close()
        raise
    return sock


class SocketTunnel:
    """A tunnel whose socket the agent handed over: the interface of
    :class:`sandbox.tunnel.SandboxTunnel` on a plain socket."""

    def __init__(self, sock: socket.socket, port: int, address: str) -> None:
        self.sock = sock
        self.port = port
        self.address = address
        self.closed = False
        self.error: str | None = None
        self.bytes_in = 0
        self.bytes_out = 0
        self._eof = False
        #: Writes under way: the socket is closed only after them. (Its descriptor closed
        #: under a pending ``sock_sendall`` would leave the event loop's writer registered
        #: for that number, and the next socket to get it would be written by the stale one.)
        self._pending = 0
        #: The loop watching the socket for reads (a reader left in place between reads, so
        #: a stream of small reads, a terminal's keystrokes' echoes, costs no epoll_ctl
        #: each), removed before the socket is closed, and while nobody reads.
        self._watching: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None

    @contextlib.contextmanager
    def _op(self) -> Any:
        self._pending += 1
        try:
            yield
        finally:
            self._pending -= 1
            if self.closed and not self._pending:
                self.sock.close()

    async def read(self) -> bytes:
        """The next bytes from the server; ``b""`` at its end or the tunnel's (then
        :attr:`error` says whether it broke)."""
        while True:
            if self.closed or self._eof:
                return b""
            try:
                data = self.sock.recv(READ_SIZE)
                break
            except (BlockingIOError, InterruptedError):
                await self._readable()
            except OSError as e:
                self.error = e.strerror or str(e)
                await self.close()
                return b""
        if not data:
            self._eof = True
        self.bytes_in += len(data)
        return data

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = fut = loop.create_future()
        if self._watching is None:
            loop.add_reader(self.sock.fileno(), self._on_readable)
            self._watching = loop
        try:
            await fut
        finally:
            self._waiter = None

    def _on_readable(self) -> None:
        fut = self._waiter
        if fut is None:  # nobody reads now: stop watching until someone does
            self._unwatch()
        elif not fut.done():
            fut.set_result(None)

    def _unwatch(self) -> None:
        loop, self._watching = self._watching, None
        if loop is not None and self.sock.fileno() != -1:
            loop.remove_reader(self.sock.fileno())

    async def write(self, data: bytes) -> None:
        """Raises TunnelClosedError once the tunnel has ended."""
        if self.closed:
            raise TunnelClosedError(self.error or "the tunnel is closed")
        try:
            with self._op():
                await asyncio.get_running_loop().sock_sendall(self.sock, data)
        except OSError as e:
            self.error = e.strerror or str(e)
            await self.close()
            raise TunnelClosedError(self.error) from e
        self.bytes_out += len(data)

    def try_write(self, data: bytes) -> int:
        """As much of ``data`` as the socket takes now, without waiting (0 when it is
        full): for a caller that would otherwise wake a task to write a keystroke. Only
        while no :meth:`write` is under way. Raises TunnelClosedError once the tunnel
        has ended."""
        if self.closed:
            raise TunnelClosedError(self.error or "the tunnel is closed")
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            self.error = e.strerror or str(e)
            self._end()
            raise TunnelClosedError(self.error) from e
        self.bytes_out += n
        return n

    async def write_eof(self) -> None:
        if not self.closed:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)

    async def close(self) -> None:
        """End the tunnel; a read under way returns ``b""``, a write raises."""
        self._end()

    def _end(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._unwatch()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # (wakes a pending write)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)  # (a read under way returns b"")
        if not self._pending:
            self.sock.close()
