"""The byte streams an :class:`~sandbox.connection.AgentConnection` runs over.

A :class:`Transport` gives raw bytes to and from one agent process. It either pushes them
(:meth:`Transport.start`: an ``asyncio.Protocol`` calls the connection from
``data_received``, so a response resolves its caller's future without waking a reader
task first) or is pulled by a reader task (:meth:`Transport.read`). :class:`ProtocolFeed`
is that push-or-pull logic for transports built on an ``asyncio`` protocol;
:class:`StreamProtocol` and :class:`StreamTransport` are such a transport over any
``asyncio`` stream, :class:`SocketTransport` the agent's direct unix-socket channel.
"""

from __future__ import annotations

import abc
import asyncio
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import cast

from .errors import ProtocolError


class Transport(abc.ABC):
    """Raw bytes to and from one agent process."""

    def start(self, on_data: Callable[[bytes, bytes], None], on_eof: Callable[[str], None]) -> bool:
        """Push mode: from now on call ``on_data(stdout, stderr)`` with every chunk as it
        arrives and ``on_eof(reason)`` once when the stream ends (no more ``on_data`` after
        it). Both are called from the event loop, never re-entrantly. Returns False when
        this transport does not push; the connection then pulls with :meth:`read`.
        """
        return False

    @abc.abstractmethod
    async def read(self) -> tuple[bytes, bytes]:
        """Next (stdout, stderr) bytes; ``(b"", b"")`` only at end of stream."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes to the agent's stdin. Raises OSError when the stream is gone."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the stream; the agent sees EOF and exits, killing what it started."""


class ProtocolFeed:
    """The transport side of push mode, for a :class:`Transport` built on an
    ``asyncio.Protocol``: the protocol hands it what arrives (:meth:`data`, :meth:`eof`)
    and its write flow control (:meth:`pause_writing`, :meth:`resume_writing`); the
    transport delegates :meth:`Transport.start`, :meth:`Transport.read` and the waits of
    ``write`` and ``close`` to it.

    Once started, bytes go straight to the connection. Before that (or if it is never
    started) they are queued for :meth:`read`, and reading pauses above 1 MiB queued.
    """

    MAX_QUEUED = 1 << 20

    def __init__(self, reading: Callable[[bool], None] | None = None) -> None:
        self._reading = reading  # pause (False) / resume (True) the protocol's reading
        self._on_data: Callable[[bytes, bytes], None] | None = None
        self._on_eof: Callable[[str], None] | None = None
        self.lost: str | None = None  # why the stream ended, once it has
        self._queue: deque[tuple[bytes, bytes]] = deque()
        self._queued = 0
        self._read_waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._drain_waiters: deque[asyncio.Future[None]] = deque()
        self._closed_waiter: asyncio.Future[None] | None = None

    # -- from the protocol ---------------------------------------------------------------

    def data(self, out: bytes, err: bytes) -> None:
        if self._on_data is not None:
            self._on_data(out, err)
            return
        if self.lost is not None or not (out or err):
            return
        self._queue.append((out, err))
        self._queued += len(out) + len(err)
        if self._queued > self.MAX_QUEUED and self._reading is not None:
            self._reading(False)
        self._wake_reader()

    def eof(self, exc: BaseException | None = None) -> None:
        """The stream ended (``exc``: why, if it broke). Idempotent."""
        if self.lost is not None:
            return
        self.lost = "agent exited" if exc is None else f"stream error: {exc!r}"
        self._paused = False
        while self._drain_waiters:
            w = self._drain_waiters.popleft()
            if not w.done():
                w.set_exception(ConnectionResetError("Connection lost"))
        self._wake_reader()
        if self._closed_waiter is not None and not self._closed_waiter.done():
            self._closed_waiter.set_result(None)
        on_eof, self._on_eof, self._on_data = self._on_eof, None, None
        if on_eof is not None:
            on_eof(self.lost)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        while self._drain_waiters:
            w = self._drain_waiters.popleft()
            if not w.done():
                w.set_result(None)

    # -- for the transport ---------------------------------------------------------------

    def start(self, on_data: Callable[[bytes, bytes], None], on_eof: Callable[[str], None]) -> bool:
        """:meth:`Transport.start`: what is queued goes first, then everything as it comes."""
        while self._queue:
            on_data(*self._queue.popleft())
        self._queued = 0
        if self.lost is not None:
            on_eof(self.lost)
            return True
        self._on_data, self._on_eof = on_data, on_eof
        if self._reading is not None:
            self._reading(True)
        return True

    async def read(self) -> tuple[bytes, bytes]:
        """:meth:`Transport.read` (pull mode, when :meth:`start` was not called)."""
        while not self._queue:
            if self.lost is not None:
                return b"", b""
            self._read_waiter = asyncio.get_running_loop().create_future()
            await self._read_waiter
        out, err = self._queue.popleft()
        self._queued -= len(out) + len(err)
        if self._queued <= self.MAX_QUEUED // 2 and self.lost is None and self._reading is not None:
            self._reading(True)
        return out, err

    def check_open(self) -> None:
        """Raises ConnectionResetError once the stream has ended (before writing to it)."""
        if self.lost is not None:
            raise ConnectionResetError("Connection lost")

    async def drain(self) -> None:
        """Wait while the protocol's write buffer is above its high-water mark (a large
        write); returns at once otherwise. Raises ConnectionResetError if the stream ends."""
        while self._paused:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    async def wait_closed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for :meth:`eof`; False if it did not come."""
        if self.lost is not None:
            return True
        if self._closed_waiter is None:
            self._closed_waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._closed_waiter), timeout)
        except TimeoutError:
            return False
        return True

    def _wake_reader(self) -> None:
        w, self._read_waiter = self._read_waiter, None
        if w is not None and not w.done():
            w.set_result(None)


_READ_BUFFERS = threading.local()


class StreamProtocol(asyncio.BufferedProtocol):
    """A byte stream from an agent on an ``asyncio`` protocol, handed to a
    :class:`ProtocolFeed` as it arrives (``feed``), with the feed's flow control.

    Buffered: the socket is read into one preallocated buffer (``recv_into``). A plain
    ``Protocol`` gets a fresh ``recv(256 KiB)`` per read, whose allocation costs several
    times the read of a small answer. This class passes the bytes on as stdout (the
    agent's direct channel); :class:`~sandbox.docker` subclasses it to demux the engine's
    attach frames in :meth:`buffer_updated`.
    """

    BUFFER_SIZE = 256 << 10

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.feed = ProtocolFeed(self._reading)

    @property
    def _buffer(self) -> memoryview:
        # One buffer per thread, shared by every protocol of the thread's event loop: a
        # loop hands a protocol the buffer, reads into it and calls buffer_updated in one
        # step, and buffer_updated copies out what it keeps, so no two reads ever overlap
        # in it. A buffer per connection was 256 KiB of memory per workspace (two
        # connections each: half of what a workspace cost the worker).
        buf: memoryview | None = getattr(_READ_BUFFERS, "buf", None)
        if buf is None:
            buf = _READ_BUFFERS.buf = memoryview(bytearray(self.BUFFER_SIZE))
        return buf

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports (uvicorn picks uvloop when it
        # is installed) do not derive from asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        # A copy: the buffer is reused by the next read.
        self.feed.data(bytes(self._buffer[:nbytes]), b"")

    def eof_received(self) -> bool:
        return False  # the agent's side is done: close ours too (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.feed.eof(exc)

    def pause_writing(self) -> None:
        self.feed.pause_writing()

    def resume_writing(self) -> None:
        self.feed.resume_writing()

    def _reading(self, on: bool) -> None:
        if self.transport is not None and not self.transport.is_closing():
            if on:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()


class StreamTransport(Transport):
    """A :class:`Transport` over an ``asyncio`` transport and its :class:`StreamProtocol`:
    pushes what arrives (push mode) or queues it for :meth:`read`."""

    def __init__(self, transport: asyncio.Transport, proto: StreamProtocol) -> None:
        self._transport = transport
        self._feed = proto.feed

    def start(self, on_data: Callable[[bytes, bytes], None], on_eof: Callable[[str], None]) -> bool:
        return self._feed.start(on_data, on_eof)

    @property
    def lost(self) -> str | None:
        """Why the stream ended, None while it is open."""
        return self._feed.lost

    async def read(self) -> tuple[bytes, bytes]:
        return await self._feed.read()

    async def write(self, data: bytes) -> None:
        self._feed.check_open()
        if self._transport.is_closing():
            raise ConnectionResetError("Connection lost")
        self._transport.write(data)
        await self._feed.drain()  # returns at once unless the socket's buffer is full

    async def close(self) -> None:
        if not self._transport.is_closing():
            self._transport.close()  # flushes what is buffered, then closes
        if not await self._feed.wait_closed(2):
            self._transport.abort()  # the agent does not take what is still buffered


class SocketTransport(StreamTransport):
    """The agent's direct channel: a unix socket the host connected to."""

    def __init__(self, transport: asyncio.Transport, proto: StreamProtocol) -> None:
        super().__init__(transport, proto)
        self._rest = b""  # what came after the first line

    @classmethod
    async def connect(cls, path: str) -> SocketTransport:
        """Connect to the unix socket at ``path``. Raises OSError when it cannot."""
        transport, proto = await asyncio.get_running_loop().create_unix_connection(StreamProtocol, path)
        return cls(cast(asyncio.Transport, transport), proto)

    @classmethod
    async def of_socket(cls, sock: socket.socket) -> SocketTransport:
        """Over a connected unix socket (an accepted one). Raises OSError."""
        transport, proto = await asyncio.get_running_loop().create_unix_connection(StreamProtocol, sock=sock)
        return cls(cast(asyncio.Transport, transport), proto)

    async def first_line(self) -> bytes:
        """The first line the agent sends (pull mode, before :meth:`start`).

        Raises ConnectionResetError if the stream ends first, ProtocolError if it is long.
        """
        buf = b""
        while b"\n" not in buf:
            out, _ = await self._feed.read()
            if not out:
                raise ConnectionResetError("the direct channel closed during its handshake")
            buf += out
            if len(buf) > 4096:
                raise ProtocolError("the direct channel's first line is too long")
        line, _, self._rest = buf.partition(b"\n")
        return line

    def start(self, on_data: Callable[[bytes, bytes], None], on_eof: Callable[[str], None]) -> bool:
        if self._rest:
            on_data(self._rest, b"")
            self._rest = b""
        return super().start(on_data, on_eof)

    async def read(self) -> tuple[bytes, bytes]:
        if self._rest:
            rest, self._rest = self._rest, b""
            return rest, b""
        return await super().read()
