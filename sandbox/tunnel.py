"""The host's end of a tunnel: one TCP connection to a port on the sandbox's loopback,
carried over the agent's channel (the agent's side is ``sandbox/agent/tunnel.py``, where
the wire format is described).

:class:`SandboxTunnel` is a byte stream (``read``, ``write``, ``write_eof``, ``close``)
with flow control both ways: at most :data:`WINDOW` bytes from the sandbox wait here
unread (the agent stops reading the server's socket until we acknowledge what was read),
and at most :data:`SEND_WINDOW` bytes of ours wait in the agent (``write`` waits for the
agent to report them written). :func:`relay` joins a tunnel to an asyncio stream (a
client connection of ``loom-worker port-forward``).

The bytes travel raw after a line announcing them (see :mod:`sandbox.connection`). The
agent is untrusted: a tunnel whose agent sends more than the window it was given is
dropped (``error`` says so), never buffered on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .connection import AgentConnection
from .errors import ProtocolError, SandboxLostError, TunnelClosedError
from .handover import FdChannel, SocketTunnel, adopt, adopt_unix

#: Bytes from the sandbox that may wait here unread (the window the agent is given).
WINDOW = 2 << 20
#: Bytes of ours that may wait in the agent, not yet written to the server.
SEND_WINDOW = 2 << 20
#: Most bytes per message to the agent (base64 in a JSON line).
CHUNK = 512 << 10
#: What was read is acknowledged once this much has accumulated (fewer messages).
ACK_EVERY = 256 << 10


#: Close notifications sent from callbacks, kept referenced until written.
_PENDING: set[asyncio.Task[None]] = set()


class SandboxTunnel:
    """One connection to ``port`` on the sandbox's loopback. Use :meth:`open`."""

    def __init__(self, conn: AgentConnection, tid: int, port: int) -> None:
        self._conn = conn
        self.id = tid
        self.port = port
        self.address = ""  # the loopback address the agent reached (127.0.0.1 or ::1)
        self._chunks: deque[bytes] = deque()
        self._buffered = 0  # received, not yet read
        self._granted = WINDOW  # bytes the agent may still send before our next ack
        self._to_ack = 0  # read, not yet acknowledged
        self._in_flight = 0  # sent, not yet reported written by the agent
        self._eof = False  # the server sent its last byte
        self._sent_eof = False
        self.closed = False
        #: Why the tunnel ended, when it broke (reset, the sandbox lost, a bad agent).
        self.error: str | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self.bytes_in = 0
        self.bytes_out = 0

    @classmethod
    async def open(cls, conn: AgentConnection, port: int, *, timeout: float = 15.0) -> SandboxTunnel | SocketTunnel:
        """Connect to ``port`` inside the sandbox over ``conn``: the socket itself when the
        agent can hand it over (``conn.fd_channel``, see :mod:`sandbox.handover`), else a
        tunnel relayed over the channel.

        Raises AgentError (``connection_refused``: nothing listens there), and
        SandboxLostError / SandboxTimeoutError from the request, ProtocolError when the
        agent hands over something else than the connection.
        """
        tunnel, _ = await cls._open(conn, {"port": port}, port, lambda fd: adopt(fd, port), timeout)
        return tunnel

    @classmethod
    async def open_process(
        cls, conn: AgentConnection, process_id: str, since: int | None, *, timeout: float = 15.0
    ) -> tuple[SandboxTunnel | SocketTunnel, dict[str, Any]]:
        """Background process ``process_id``'s byte stream (a terminal's: its output from
        ``since``, None for what it keeps, and its input), handed over or relayed as
        :meth:`open`'s, with the supervisor's attach answer (unchecked: the caller's).

        Raises AgentError (``not_found``: no such process), and what :meth:`open` raises.
        """
        target: dict[str, Any] = {"process": process_id, "since": since}
        tunnel, r = await cls._open(conn, target, 0, lambda fd: adopt_unix(fd, f"/{process_id}.sock"), timeout)
        attached = r.get("attached")
        if not isinstance(attached, dict):
            await tunnel.close()
            raise ProtocolError("the agent sent no attach answer")
        return tunnel, attached

    @classmethod
    async def _open(
        cls,
        conn: AgentConnection,
        target: dict[str, Any],
        port: int,
        adopt_fd: Callable[[int], socket.socket],
        timeout: float,
    ) -> tuple[SandboxTunnel | SocketTunnel, dict[str, Any]]:
        tid = conn.new_tunnel_id()
        tunnel = cls(conn, tid, port)
        conn.set_stream_handler("tunnel", tid, tunnel._on_event)
        chan: FdChannel | None = conn.fd_channel if conn.fd_channel is not None and not conn.fd_channel.closed else None
        handed = chan.expect(tid) if chan is not None else None
        args: dict[str, Any] = {"tunnel": tid, **target, "window": WINDOW}
        if chan is not None:
            args["pass"] = True
        try:
            r = await conn.request("tunnel_open", args, timeout=timeout)
            if r.get("passed") is True and chan is not None and handed is not None:
                conn.set_stream_handler("tunnel", tid, None)
                try:
                    fd = await asyncio.wait_for(handed, timeout)
                except (TimeoutError, TunnelClosedError) as e:
                    raise ProtocolError(
                        f"the agent said it handed over the connection, but it did not come: {e!r}"
                    ) from None
                address = r.get("address")
                return SocketTunnel(adopt_fd(fd), port, address if isinstance(address, str) else ""), r
        except BaseException as e:
            if chan is not None:
                chan.forget(tid)
            conn.set_stream_handler("tunnel", tid, None)
            if isinstance(e, asyncio.CancelledError) and not conn.closed:
                # Given up while the agent may have opened it: it must not stay open there.
                task = asyncio.get_running_loop().create_task(conn.notify("tunnel_close", {"tunnel": tid}))
                _PENDING.add(task)
                task.add_done_callback(_PENDING.discard)
            raise
        if chan is not None:
            chan.forget(tid)
        address = r.get("address")
        tunnel.address = address if isinstance(address, str) and len(address) < 64 else ""
        return tunnel, r

    # -- events from the agent (on the event loop) --------------------------------------

    def _on_event(self, msg: dict[str, Any]) -> None:
        if "data" in msg:
            data = msg.get("data")
            chunk = data if isinstance(data, bytes) else None
            if chunk is None:
                return self._end("the agent sent a malformed tunnel message")
            self._granted -= len(chunk)
            if self._granted < 0:
                return self._end("the agent sent more than the tunnel's window")
            if chunk:
                self._chunks.append(chunk)
                self._buffered += len(chunk)
                self.bytes_in += len(chunk)
                self._readable.set()
        elif "acked" in msg:
            n = msg.get("acked")
            if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= self._in_flight:
                self._in_flight -= n
                if self._in_flight < SEND_WINDOW:
                    self._writable.set()
            else:
                self._end("the agent acknowledged bytes it was not sent")
        elif msg.get("eof") is True:
            self._eof = True
            self._readable.set()
        elif msg.get("closed") is True:
            err = msg.get("error")
            self._end(err[:300] if isinstance(err, str) and err else None, tell_agent=False)
        elif msg.get("event") == "lost":
            reason = msg.get("reason")
            self._end(f"the sandbox connection was lost ({reason})", tell_agent=False)

    def _end(self, error: str | None, *, tell_agent: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        if error is not None:
            self.error = error
        self._conn.set_stream_handler("tunnel", self.id, None)
        self._readable.set()
        self._writable.set()
        if tell_agent and not self._conn.closed:
            task = asyncio.get_running_loop().create_task(self._notify("tunnel_close", {}))
            _PENDING.add(task)
            task.add_done_callback(_PENDING.discard)

    async def _notify(self, op: str, args: dict[str, Any], raw: memoryview | None = None) -> None:
        try:
            await self._conn.notify(op, {"tunnel": self.id, **args}, raw=raw)
        except SandboxLostError as e:
            self._end(f"the sandbox connection was lost ({e})", tell_agent=False)

    # -- the stream ------------------------------------------------------------------------

    async def read(self) -> bytes:
        """The next bytes from the server; ``b""`` once it sent its last byte or the
        tunnel ended (then :attr:`error` says whether it broke)."""
        while not self._chunks:
            if self._eof or self.closed:
                return b""
            self._readable.clear()
            await self._readable.wait()
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        self._to_ack += len(chunk)
        if self._to_ack >= ACK_EVERY or (not self._chunks and self._granted < ACK_EVERY):
            n, self._to_ack = self._to_ack, 0
            self._granted += n
            if not self.closed:
                await self._notify("tunnel_ack", {"n": n})
        return chunk

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the server, waiting while the agent holds a full window of
        ours. Raises TunnelClosedError once the tunnel has ended or after
        :meth:`write_eof`."""
        view = memoryview(data)
        while view:
            while self._in_flight >= SEND_WINDOW and not self.closed:
                self._writable.clear()
                await self._writable.wait()
            if self.closed or self._sent_eof:
                raise TunnelClosedError(self.error or "the tunnel is closed")
            piece = view[: min(CHUNK, SEND_WINDOW - self._in_flight)]
            view = view[len(piece) :]
            self._in_flight += len(piece)
            self.bytes_out += len(piece)
            await self._notify("tunnel_send", {}, raw=piece)

    async def write_eof(self) -> None:
        """Tell the server we will send no more (a half-close: reading goes on)."""
        if not self.closed and not self._sent_eof:
            self._sent_eof = True
            await self._notify("tunnel_send", {"eof": True})

    async def close(self) -> None:
        """End the tunnel now (the server sees the connection closed). Idempotent."""
        self._end(None)


#: Either kind of tunnel the agent makes: relayed over the channel, or the socket handed over.
AgentTunnel = SandboxTunnel | SocketTunnel


class Tunnel(Protocol):
    """What every tunnel has, whoever carries it (the agent's two kinds; a cluster's,
    through another node): bytes both ways, a half-close, the end, and why it broke."""

    error: str | None
    closed: bool  # ended: closed by either side, or broken

    async def read(self) -> bytes:
        """The next bytes from the server; b"" at the end (``error`` then says why, if it
        broke)."""
        ...

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the server. Raises TunnelClosedError."""
        ...

    async def write_eof(self) -> None:
        """Send no more (reading goes on)."""
        ...

    async def close(self) -> None:
        """End the tunnel now. Idempotent."""
        ...


async def relay(tunnel: Tunnel, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str | None:
    """Pass bytes both ways between ``tunnel`` and a client connection until both sides
    are done (half-closes passed on), then close both. Returns why it broke, or None."""

    async def upstream() -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    await tunnel.write_eof()
                    return
                await tunnel.write(data)
        except (ConnectionError, TunnelClosedError):
            await tunnel.close()

    async def downstream() -> None:
        try:
            while True:
                data = await tunnel.read()
                if not data:
                    if tunnel.error is not None:
                        writer.transport.abort()  # a reset, passed on as one
                    elif writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            await tunnel.close()

    up = asyncio.ensure_future(upstream())
    try:
        await downstream()
        if tunnel.closed:
            up.cancel()
        await asyncio.gather(up, return_exceptions=True)
    finally:
        up.cancel()
        await tunnel.close()
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    return tunnel.error
