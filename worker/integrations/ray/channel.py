"""A node's call channel: the data path of a cluster's calls, beside Ray.

Why not Ray's own actor calls: on this machine an awaited call of a no-op method of an
async actor costs about 0.8 ms (Ray's floor: the owner's and the actor's core workers,
their gRPC and the event-loop handoffs), so a ``read_file`` through the cluster paid
1.6 ms more than the same call in-process. A request over an open TCP connection to the
node service's own event loop costs about 0.03 ms. Ray keeps everything else: membership,
placement, naming, the node service's life, failure detection, streaming; the channel only
carries request/answer calls, and a driver that cannot reach it uses Ray's actor calls.

Protocol (one connection per driver and node, several calls in flight, answers in any
order): the server sends a 32-byte nonce, the client answers HMAC-SHA256(key, nonce)
(the key is handed out by the node service over Ray, never sent here), then frames both
ways, a 4-byte big-endian length and a pickle: ``(id, op, args)`` asks, ``(id, ok,
value)`` answers (``value`` the result, or the exception raised on the node). Pickle is
read only from an authenticated peer, which holds what Ray gave it: such a peer can run
code on the cluster through Ray anyway. The bytes are not encrypted, as Ray's own traffic
is not unless Ray is set up with TLS.

A call whose connection ends before its answer raises :class:`ChannelBroken` (it may
have run: the caller asks Ray whether the node died); one that could not be sent
:class:`ChannelClosed` (it did not run). While calls wait, ``watch`` (Ray's view of the
node) is asked every :data:`WATCH_SECONDS`: a node Ray declares dead breaks the channel
even where TCP would not notice (a machine gone without a reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import pickle
import secrets
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from .portable import portable

HEADER = struct.Struct("!I")
NONCE = 32
#: Largest frame read (a tunnel's read, a big file's result): a peer sending more is cut.
MAX_FRAME = 256 << 20
HANDSHAKE_SECONDS = 10.0
WATCH_SECONDS = 2.0


class ChannelClosed(ConnectionError):
    """The channel is closed: the call was not sent."""


class ChannelBroken(ConnectionError):
    """The connection ended while the call waited for its answer: it may have run."""


def _mac(key: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, nonce, hashlib.sha256).digest()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ConnectionError(f"a frame of {size} bytes is over the channel's {MAX_FRAME}")
    return await reader.readexactly(size)


def _frame(value: Any) -> bytes:
    data = pickle.dumps(value, protocol=5)
    return HEADER.pack(len(data)) + data


class ChannelServer:
    """The node's side: answers each authenticated request with ``handle(op, args)``
    (ops other than ``ops`` are refused)."""

    def __init__(self, handle: Callable[[str, tuple[Any, ...]], Awaitable[Any]], ops: frozenset[str]) -> None:
        self.key = secrets.token_bytes(32)
        self._handle = handle
        self._ops = ops
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.address: tuple[str, int] | None = None

    async def start(self, host: str) -> tuple[str, int]:
        """Listen on ``host`` (the node's address), an ephemeral port. Returns (host, port).
        Raises OSError."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, host, 0)
            self.address = (host, int(self._server.sockets[0].getsockname()[1]))
        assert self.address is not None
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            nonce = secrets.token_bytes(NONCE)
            writer.write(nonce)
            mac = await asyncio.wait_for(reader.readexactly(32), HANDSHAKE_SECONDS)
            if not hmac.compare_digest(mac, _mac(self.key, nonce)):
                return
            while True:
                rid, op, args = pickle.loads(await _read_frame(reader))
                task = asyncio.create_task(self._one(writer, rid, op, args))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, pickle.UnpicklingError, ValueError):
            pass  # the peer went away, or was not one of ours
        finally:
            writer.close()

    async def _one(self, writer: asyncio.StreamWriter, rid: int, op: str, args: tuple[Any, ...]) -> None:
        # A call whose client went away runs to its end, as a Ray actor call does.
        try:
            if op not in self._ops:
                raise ValueError(f"{op!r} is not offered on the channel")
            frame = _frame((rid, True, await self._handle(op, args)))
        except Exception as e:
            try:
                frame = _frame((rid, False, portable(e)))
            except Exception:  # an error that cannot travel: its type and message do
                frame = _frame((rid, False, RuntimeError(f"{type(e).__name__}: {e}")))
        if writer.is_closing():
            return
        writer.write(frame)
        with contextlib.suppress(ConnectionError):
            await writer.drain()


def _keepalive(sock: socket.socket | None) -> None:
    # A peer gone without a reset is noticed by TCP within about 25 s even when idle
    # (the watch notices within seconds while a call waits).
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


class Channel:
    """The driver's side: one open connection to one node service, used from the event
    loop that opened it (:attr:`loop`)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        watch: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._reader, self._writer = reader, writer
        self._watch = watch
        #: The calls waiting for their answer, and when each was sent (the loop's clock).
        self._pending: dict[int, tuple[asyncio.Future[tuple[bool, Any]], float]] = {}
        self._next = 0
        #: Why it is no longer usable (None while it is).
        self.broken: str | None = None
        self._read_task = asyncio.create_task(self._read_answers())
        self._watch_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, host: str, port: int, key: bytes, *, timeout: float, watch: Callable[[], Awaitable[bool]] | None = None
    ) -> Channel:
        """Connect and authenticate. Raises OSError, TimeoutError."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        try:
            _keepalive(writer.get_extra_info("socket"))
            nonce = await asyncio.wait_for(reader.readexactly(NONCE), timeout)
            writer.write(_mac(key, nonce))
            await writer.drain()
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, watch)

    @property
    def usable(self) -> bool:
        return self.broken is None and self.loop is asyncio.get_running_loop()

    async def call(self, op: str, *args: Any) -> Any:
        """``op(*args)`` on the node: its result, or what it raised there. Raises
        ChannelClosed (not sent), ChannelBroken (sent, no answer)."""
        if self.broken is not None:
            raise ChannelClosed(self.broken)
        self._next += 1
        rid = self._next
        fut: asyncio.Future[tuple[bool, Any]] = self.loop.create_future()
        self._pending[rid] = (fut, self.loop.time())
        try:
            self._writer.write(_frame((rid, op, args)))
            if self._watch is not None and self._watch_task is None:
                self._watch_task = asyncio.create_task(self._watching())
            ok, value = await fut
        finally:
            self._pending.pop(rid, None)
        if ok:
            return value
        raise value

    async def _read_answers(self) -> None:
        why = "the node closed the channel"
        try:
            while True:
                rid, ok, value = pickle.loads(await _read_frame(self._reader))
                waiting = self._pending.get(rid)
                if waiting is not None and not waiting[0].done():
                    waiting[0].set_result((ok, value))
        except asyncio.CancelledError:
            why = "the channel was closed here"
            raise
        except Exception as e:
            why = f"the channel to the node ended ({type(e).__name__}: {e})" if str(e) else why
        finally:
            self._break(why)

    async def _watching(self) -> None:
        assert self._watch is not None
        try:
            while self._pending and self.broken is None:
                await asyncio.sleep(WATCH_SECONDS)
                # Only a call that has waited a while makes it ask (a GCS read): a steady
                # stream of short calls never does.
                oldest = min((t for _f, t in self._pending.values()), default=self.loop.time())
                if self.loop.time() - oldest >= WATCH_SECONDS and not await self._watch():
                    self._break("Ray reports the node dead")
        finally:
            self._watch_task = None

    def _break(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
        for fut, _t in self._pending.values():
            if not fut.done():
                fut.set_exception(ChannelBroken(why))
        self._writer.close()

    def close(self) -> None:
        self._read_task.cancel()
        self._break("the channel was closed here")
