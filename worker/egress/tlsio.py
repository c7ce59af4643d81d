"""TLS over a non-blocking socket on the event loop, with memory BIOs.

The gateway has already read the sandbox's ClientHello (to check its server name) when it
decides to terminate TLS, so the handshake must start from bytes in hand: asyncio's
``start_tls`` cannot take them back, an ``ssl.SSLObject`` over a ``MemoryBIO`` can (the
pattern the ``ssl`` documentation gives for exactly this). The same class speaks to the
upstream, so both sides of an intercepted connection work alike.

Every send goes out through one queue and one writer task: a read may make TLS records of
its own (a key update, an alert) that must not interleave with a write's records on the
socket, and the next read must not wait for the peer to take the last write.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable

RECV = 256 << 10
#: A sender waits while more than this is queued for the socket.
HIGH_WATER = 4 << 20


class TLSStream:
    """One TLS connection over ``sock`` (non-blocking). ``raw_in``/``raw_out`` count the
    socket's bytes; ``charge(n)`` (if given) is told of each, and a False answer ends
    the stream (a rate limit)."""

    def __init__(
        self,
        sock: socket.socket,
        obj: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        charge: Callable[[int], bool] | None = None,
    ) -> None:
        self.sock = sock
        self.obj = obj
        self.incoming = incoming
        self.outgoing = outgoing
        self.charge = charge
        self.loop = asyncio.get_running_loop()
        self.raw_in = 0
        self.raw_out = 0
        self.limited = False
        self._queued: list[bytes] = []
        self._queued_bytes = 0
        self._writer: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        self._error: OSError | None = None

    @classmethod
    def server(cls, sock: socket.socket, ctx: ssl.SSLContext, first: bytes, **kw: object) -> TLSStream:
        """The server side, ``first`` being what the client already sent."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        incoming.write(first)
        return cls(sock, ctx.wrap_bio(incoming, outgoing, server_side=True), incoming, outgoing, **kw)  # type: ignore[arg-type]

    @classmethod
    def client(cls, sock: socket.socket, ctx: ssl.SSLContext, server_hostname: str, **kw: object) -> TLSStream:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
        return cls(sock, obj, incoming, outgoing, **kw)  # type: ignore[arg-type]

    async def _fill(self) -> bool:
        """More bytes from the socket into TLS; False at the socket's end."""
        data = await self.loop.sock_recv(self.sock, RECV)
        if not data:
            self.incoming.write_eof()
            return False
        self.raw_in += len(data)
        self._charge(len(data))
        self.incoming.write(data)
        return True

    def _charge(self, n: int) -> None:
        if self.charge is not None and not self.charge(n):
            self.limited = True
            raise ConnectionAbortedError("over the workspace's egress byte budget")

    async def _flush(self) -> None:
        """Queue what TLS has made for the socket; wait only while more than
        :data:`HIGH_WATER` is still queued (the writer sends it meanwhile)."""
        out = self.outgoing.read() if self.outgoing.pending else b""
        if out:
            self.raw_out += len(out)
            self._charge(len(out))
            self._queued.append(out)
            self._queued_bytes += len(out)
            if self._writer is None:
                self._writer = self.loop.create_task(self._write())
        if self._error is not None:
            raise self._error
        if self._queued_bytes > HIGH_WATER:
            self._drained.clear()
            await self._drained.wait()
            if self._error is not None:
                raise self._error

    async def _write(self) -> None:
        # One task sends, in order, what every flush queued: reading the next bytes and
        # encrypting them go on while the socket takes these (a send would otherwise wait
        # for the peer to read before the next read could start).
        try:
            while self._queued:
                chunk = self._queued.pop(0)  # (one by one: joining them would copy every byte again)
                await self.loop.sock_sendall(self.sock, chunk)
                self._queued_bytes -= len(chunk)
                if self._queued_bytes <= HIGH_WATER // 2:
                    self._drained.set()
        except OSError as e:
            self._error = e
            self._queued.clear()
            self._queued_bytes = 0
            self._drained.set()
        finally:
            self._writer = None

    async def drain(self) -> None:
        """Wait until everything queued has been sent (or the socket failed)."""
        while self._writer is not None:
            await asyncio.shield(self._writer)

    async def handshake(self) -> None:
        """Raises ssl.SSLError (a refused or failed handshake), OSError, EOFError."""
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    with contextlib.suppress(ssl.SSLError):
                        self.obj.do_handshake()  # the alert the peer sent, if it did
                    raise EOFError("the peer closed the connection during the TLS handshake") from None
            except ssl.SSLError:
                with contextlib.suppress(OSError):
                    await self._flush()  # our alert, so the peer learns why
                raise
        await self._flush()

    async def recv(self, n: int = RECV) -> bytes:
        """Up to ``n`` bytes; b"" at the end (close_notify, or the socket's end).
        Raises ssl.SSLError, OSError."""
        while True:
            try:
                data = self.obj.read(n)
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    try:
                        return self.obj.read(n)
                    except (ssl.SSLZeroReturnError, ssl.SSLEOFError, ssl.SSLWantReadError):
                        return b""
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            # A read gives one TLS record (16 KiB at most): take every whole record the
            # socket's bytes already hold, so what follows (parsing, a write, a send) runs
            # once per socket read instead of once per record.
            if len(data) < n and self.incoming.pending:
                parts = [data]
                total = len(data)
                while total < n:
                    try:
                        more = self.obj.read(n - total)
                    except ssl.SSLError:  # (want-read, or the end: the next recv says so)
                        break
                    if not more:
                        break
                    parts.append(more)
                    total += len(more)
                data = b"".join(parts) if len(parts) > 1 else data
            if self.outgoing.pending:
                await self._flush()
            return data

    async def send(self, data: bytes) -> None:
        """Raises OSError, ssl.SSLError."""
        if data:
            self.obj.write(data)
            await self._flush()

    async def close(self, *, graceful: bool = True) -> None:
        """Send what is queued and close_notify (best effort, a few seconds at most;
        nothing when not ``graceful``), then close the socket."""
        if graceful:
            with contextlib.suppress(ssl.SSLError, OSError, ValueError):
                self.obj.unwrap()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._flush_all(), 5.0)
        if self._writer is not None:
            self._writer.cancel()
        self.sock.close()

    async def _flush_all(self) -> None:
        self._error = None  # (what failed before: the close_notify may still go)
        await self._flush()
        await self.drain()
