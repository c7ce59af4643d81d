"""TLS over a non-blocking socket on the event loop, with memory BIOs.

The gateway has already read the sandbox's ClientHello (to check its server name) when it
decides to terminate TLS, so the handshake must start from bytes in hand: asyncio's
``start_tls`` cannot take them back, an ``ssl.SSLObject`` over a ``MemoryBIO`` can (the
pattern the ``ssl`` documentation gives for exactly this). The same class speaks to the
upstream, so both sides of an intercepted connection work alike.

Every send goes out under one lock: a read may make TLS records of its own (a key update,
an alert) that must not interleave with a write's records on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable

RECV = 256 << 10


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
        self._send = asyncio.Lock()

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
        if not self.outgoing.pending:
            return
        # Shielded: a cancelled reader must not leave half a record on the wire.
        await asyncio.shield(self._flush_locked())

    async def _flush_locked(self) -> None:
        async with self._send:
            out = self.outgoing.read()
            if out:
                self.raw_out += len(out)
                self._charge(len(out))
                await self.loop.sock_sendall(self.sock, out)

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
            if self.outgoing.pending:
                await self._flush()
            return data

    async def send(self, data: bytes) -> None:
        """Raises OSError, ssl.SSLError."""
        if data:
            self.obj.write(data)
            await self._flush()

    async def close(self) -> None:
        """Send close_notify (best effort) and close the socket."""
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self.obj.unwrap()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._flush(), 1.0)
        self.sock.close()
