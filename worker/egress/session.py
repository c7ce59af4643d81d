"""The HTTP/1.1 conversation of one intercepted connection (:mod:`worker.egress.intercept`),
request by request: h11 on both sides, each request rewritten (:mod:`worker.egress.rewrite`)
with the workspace's secrets as they are at that moment, each answer relayed and masked.

* ``Expect: 100-continue``: forwarded; the destination's ``100`` is relayed when it comes,
  and a final answer before the body (a 401) ends the connection after it.
* Chunked bodies and trailers: h11 decodes and re-frames them; trailers are not rewritten.
* Each request is checked on its own: its ``Host`` (and an absolute URI's host) must be the
  connection's host (else 421 Misdirected Request, nothing forwarded), and the secrets are
  read anew (a rotated value is used by the next request, a deleted secret no longer added).
* ``101 Switching Protocols`` (a WebSocket) or a ``CONNECT`` inside: from then on the
  bytes are relayed as they are (no more rewriting).
* A large ``Content-Length`` body is read past h11 (see :meth:`Session._body_down`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

import h11

from . import decide
from .log import EgressRecord
from .rewrite import BodyScan, Masker, Use, rewrite_request, stray_uses
from .tlsio import RECV, TLSStream

MAX_HEAD = 32 << 10
FIRST_REQUEST_WAIT = 30.0
#: A Content-Length body at least this large is read past h11 (see ``Session._body_down``).
FAST_BODY = 64 << 10


class Session:
    """The HTTP/1.1 conversation of one intercepted connection."""

    client: TLSStream
    up: TLSStream

    def __init__(self, store: Any, served: Any, host: str, port: int) -> None:
        self.store = store  # the secrets (a SecretStore): read anew for each request
        self.served = served
        self.host = host
        self.port = port
        self.s = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)  # the sandbox's side
        self.c = h11.Connection(h11.CLIENT)  # the destination's side
        self.requests = 0
        #: After an answer whose body bypassed ``c``: whether the destination keeps the
        #: connection (the next request gets a fresh ``c``); None otherwise.
        self.fresh: bool | None = None
        self.head = False

    async def run(self) -> None:
        while True:
            req = await self._head(watch_upstream=self.requests > 0)
            if req is None:
                return
            self.requests += 1
            if not await self._exchange(req):
                return
            if self.s.our_state is not h11.DONE or self.s.their_state is not h11.DONE:
                return
            if self.fresh is not None:  # the body went past h11 (see _body_down): a new one
                if not self.fresh:
                    return
                self.c, self.fresh = h11.Connection(h11.CLIENT), None
            elif self.c.our_state is not h11.DONE or self.c.their_state is not h11.DONE:
                return
            else:
                self.c.start_next_cycle()
            self.s.start_next_cycle()

    # -- the sandbox's requests ---------------------------------------------------------

    async def _head(self, *, watch_upstream: bool) -> h11.Request | None:
        """The next request's head; None when the sandbox closed, or (between requests)
        the destination did."""
        while True:
            event = self.s.next_event()
            if event is h11.NEED_DATA:
                data = await (self._client_unless_upstream_ends() if watch_upstream else self.client.recv())
                if data is None:
                    return None
                self.s.receive_data(data)
                continue
            return event if isinstance(event, h11.Request) else None

    async def _client_unless_upstream_ends(self) -> bytes | None:
        # Between requests the destination may close its side (an idle timeout): the
        # sandbox's connection is closed then too, before it sends a request into it.
        rc = asyncio.ensure_future(self.client.recv())
        ru = asyncio.ensure_future(self.up.recv())
        try:
            await asyncio.wait({rc, ru}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (rc, ru):
                if not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t
        if ru.done() and not ru.cancelled():
            return None
        return rc.result()

    async def _exchange(self, req: h11.Request) -> bool:
        """Forward one request and its answer; False when the connection must end."""
        path = req.target.decode("latin-1")[:300]
        method = req.method.decode("latin-1")
        hosts = [value for name, value in req.headers if name == b"host"]
        if not decide.same_host(req.target, hosts, self.host, self.port):
            reason = f"this connection is to {self.host}:{self.port}; a request for another Host is not forwarded"
            self._log([Use(None, "denied", reason)], method, path, 421)
            await self.refuse(421, reason)
            return False
        secrets = self.store.effective(self.served.root)
        rw = rewrite_request(list(req.headers.raw_items()), req.target, self.host, self.port, secrets)
        self.head = req.method == b"HEAD"  # (its answer declares a length it does not send)
        try:
            head = self.c.send(h11.Request(method=req.method, target=rw.target, headers=rw.headers))
        except h11.LocalProtocolError:  # (its message would quote the request: not logged)
            self._log(rw.uses, method, path, 400)
            await self.refuse(400, "the request could not be forwarded as HTTP/1.1")
            return False
        await self.up.send(head)
        scan, masker = BodyScan(), Masker(rw.masks)
        status: int | None = None
        switched, whole = False, True
        up = asyncio.ensure_future(self._body_up(scan))
        down = asyncio.ensure_future(self._answer(masker))
        try:
            (status, switched), whole = await _both(up, down)
        finally:
            uses = rw.uses + stray_uses(scan.found, "the body", self.host, self.port, secrets)
            if masker.masked:
                for u in uses:
                    if u.verdict == "allowed":
                        u.reason += "; its value came back in the answer: masked"
            self._log(uses, method, path, status)
        if switched:
            await self._relay()
            return False
        return whole

    async def _body_up(self, scan: BodyScan) -> None:
        while True:
            event = self.s.next_event()
            if event is h11.NEED_DATA:
                self.s.receive_data(await self.client.recv())
            elif isinstance(event, h11.Data):
                scan.feed(event.data)
                await self.up.send(self.c.send(h11.Data(data=event.data)) or b"")
            elif isinstance(event, h11.EndOfMessage):
                await self.up.send(self.c.send(h11.EndOfMessage(headers=event.headers)) or b"")
                return
            else:
                raise EOFError("the sandbox closed the request early")

    # -- the destination's answers ------------------------------------------------------

    async def _answer(self, masker: Masker) -> tuple[int | None, bool]:
        """Relay the answer; returns (status, switched to another protocol)."""
        status: int | None = None
        while True:
            event = self.c.next_event()
            if event is h11.NEED_DATA:
                self.c.receive_data(await self.up.recv())
                continue
            if isinstance(event, h11.InformationalResponse):
                headers = masker.headers(list(event.headers.raw_items()))
                info = h11.InformationalResponse(status_code=event.status_code, headers=headers, reason=event.reason)
                await self.client.send(self.s.send(info) or b"")
                if event.status_code == 101:
                    return 101, True
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = masker.headers(list(event.headers.raw_items()))
                resp = h11.Response(status_code=status, headers=headers, reason=event.reason)
                await self.client.send(self.s.send(resp) or b"")
                length = None if self.head else _fixed_length(event, self.s, self.c)
                if length is not None:
                    await self._body_down(event, length, masker)
                    return status, False
            elif isinstance(event, h11.Data):
                out = masker.feed(event.data)
                if out:
                    await self.client.send(self.s.send(h11.Data(data=out)) or b"")
            elif isinstance(event, h11.EndOfMessage):
                tail = masker.finish()
                out = (self.s.send(h11.Data(data=tail)) or b"") if tail else b""
                out += self.s.send(h11.EndOfMessage(headers=masker.headers(list(event.headers.raw_items())))) or b""
                await self.client.send(out)
                return status, False
            elif event is h11.PAUSED:  # a CONNECT answered 2xx
                return status, True
            else:
                raise EOFError("the destination closed the connection before answering")

    async def _body_down(self, resp: h11.Response, length: int, masker: Masker) -> None:
        """A Content-Length body, read past h11: its parser copies every byte three times
        (about half the gateway's time on a large download). What h11 holds already is
        taken from it first; the rest is exactly ``length`` more bytes of the stream,
        read as they are. ``c`` is then replaced by a fresh parser for the next request
        (between requests it has nothing else to keep)."""
        while length:
            event = self.c.next_event()
            if event is h11.NEED_DATA:
                break
            if isinstance(event, h11.Data):
                length -= len(event.data)
                await self._down(masker.feed(bytes(event.data)))
            else:
                raise h11.RemoteProtocolError("an unexpected event in a body")
        while length:
            data = await self.up.recv(min(length, RECV))
            if not data:
                raise EOFError("the destination closed the connection in the middle of a body")
            length -= len(data)
            await self._down(masker.feed(data))
        tail = masker.finish()
        out = (self.s.send(h11.Data(data=tail)) or b"") if tail else b""
        await self.client.send(out + (self.s.send(h11.EndOfMessage()) or b""))
        self.fresh = resp.http_version == b"1.1" and not any(
            name == b"connection" and b"close" in value.lower() for name, value in resp.headers
        )

    async def _down(self, data: bytes) -> None:
        if data:
            await self.client.send(self.s.send(h11.Data(data=data)) or b"")

    async def _relay(self) -> None:
        """After a protocol switch: bytes as they are, both ways, until either side ends."""
        if self.s.trailing_data[0]:
            await self.up.send(self.s.trailing_data[0])
        if self.c.trailing_data[0]:
            await self.client.send(self.c.trailing_data[0])

        async def pipe(src: TLSStream, dst: TLSStream) -> None:
            while data := await src.recv():
                await dst.send(data)

        ways = [asyncio.ensure_future(pipe(self.client, self.up)), asyncio.ensure_future(pipe(self.up, self.client))]
        try:
            await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in ways:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    # -- refusals and the log ------------------------------------------------------------

    async def refuse(self, status: int, reason: str, verdict: str = "denied") -> None:
        body = f"loom-worker egress gateway: {reason}.\n".encode()
        safe = reason.replace('"', "'")[:300]
        headers = [
            (b"Content-Type", b"text/plain; charset=utf-8"),
            (b"Content-Length", str(len(body)).encode()),
            (b"Connection", b"close"),
            (b"X-Loom-Egress", f'{verdict}; host="{self.host}:{self.port}"; reason="{safe}"'.encode()),
        ]
        with contextlib.suppress(h11.LocalProtocolError):
            out = self.s.send(h11.Response(status_code=status, headers=headers)) or b""
            out += (self.s.send(h11.Data(data=body)) or b"") + (self.s.send(h11.EndOfMessage()) or b"")
            await self.client.send(out)

    async def refuse_first(self, status: int, reason: str) -> None:
        """Answer the sandbox's first request with a refusal (the destination failed)."""
        with contextlib.suppress(TimeoutError, h11.ProtocolError, OSError, ssl.SSLError):
            if await asyncio.wait_for(self._head(watch_upstream=False), FIRST_REQUEST_WAIT) is not None:
                await self.refuse(status, reason, "error")

    def _log(self, uses: list[Use], method: str, path: str, status: int | None) -> None:
        for u in uses:
            self.served.record(
                EgressRecord(
                    workspace=self.served.label,
                    kind="secret",
                    host=self.host,
                    port=self.port,
                    verdict=u.verdict,  # type: ignore[arg-type]
                    reason=u.reason,
                    secret=u.secret,
                    method=method,
                    path=path,
                    status=status,
                )
            )


def _fixed_length(resp: h11.Response, s: h11.Connection, c: h11.Connection) -> int | None:
    """The body length of an answer whose body can be read past h11 (Content-Length
    framing, a whole request already sent, a large enough body); else None."""
    sent = (h11.DONE, h11.MUST_CLOSE)
    if c.our_state not in sent or s.their_state not in sent or c.their_state is not h11.SEND_BODY:
        return None
    if resp.status_code in (204, 304):
        return None
    lengths = [v for k, v in resp.headers if k == b"content-length"]
    if len(lengths) != 1 or any(k == b"transfer-encoding" for k, _ in resp.headers):
        return None
    n = int(lengths[0])
    return n if n >= FAST_BODY else None


async def _both(up: asyncio.Future[None], down: asyncio.Future[Any]) -> tuple[Any, bool]:
    """Wait for ``down`` (the answer) and ``up`` (the request's body): ``down``'s result,
    and whether ``up`` had ended by then (a destination may answer before the body is
    all there: ``up`` is then cancelled, and the connection cannot be reused). Either
    failing cancels the other and raises."""
    pending: set[asyncio.Future[Any]] = {up, down}
    try:
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if up in done:
                up.result()
            if down in done:
                return down.result(), up.done()
    finally:
        for t in (up, down):
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
