"""The port proxy's WebSockets: a handshake to ``/v1/workspaces/{id}/ports/{port}/{path}``
opens a tunnel to the port, as an HTTP request does (:mod:`.ports`), and speaks WebSocket
to the app in the sandbox as a client over the tunnel's bytes (wsproto).

- **The handshake** goes to the app with the client's path and query, ``Host``,
  ``Origin``, cookies and other end-to-end headers, ``X-Forwarded-Prefix``, and the
  subprotocols the client offered; never the service's credentials (``Authorization``,
  the token's ``loom.bearer.`` subprotocol, see :mod:`worker.auth`), nor the hop-by-hop
  and handshake headers (each side has its own key and extensions). The client's side is
  accepted only once the app accepted, with the subprotocol the app chose.
- **Then** each message passes whole both ways, text as text and binary as binary (an
  app's fragments are joined: an ASGI message is whole), and the close code and reason
  both ways. Pings are answered by each side's own end: uvicorn answers the client's,
  this module the app's.
- **When it goes wrong** before the app accepted (no such workspace, nothing listens,
  the app refused the handshake or did not answer as a WebSocket server): the client
  gets the HTTP answer, the proxy's own (``{"detail": ...}``: 404, 422, 502, 503) or the
  app's refusal (its status, headers and body) through the ASGI denial extension; on a
  server without it, the handshake is closed (1008 for the request, 1011 for the app or
  the sandbox). After: the connection to the app breaking closes the client's side with
  1011 and why; a message from the app larger than :data:`MAX_MESSAGE`, with 1009.
- **Flow control**: one message at a time each way. The next message is read from the
  client only once the last one is in the tunnel (which holds at most its window), and
  the tunnel is read again only once the client's server took the last message (uvicorn
  waits while the client's socket is full), so neither side makes the proxy buffer
  more than one message (at most :data:`MAX_MESSAGE`) and a tunnel's chunk. The answers
  to the app's pings never wait behind a message (at most one is pending).

Who may open one is decided by :mod:`worker.auth` as for the proxy's HTTP (the token as a
bearer, the Basic password or the ``loom.bearer.`` subprotocol), with one more rule: a
handshake is state-changing, so a browser's is refused unless its ``Origin`` is the
service. The app's own pages are served sandboxed (an opaque origin: ``Origin: null``),
so a browser page of the app cannot open one here; such an app is opened through
``loom-worker port-forward`` (its own origin). Scripts and tools (no ``Origin``) can.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import h11
from fastapi import APIRouter
from starlette.responses import Response
from starlette.routing import WebSocketRoute
from starlette.types import Receive, Scope, Send
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from sandbox.errors import TunnelClosedError
from sandbox.logs import get_logger

from ..auth import deny_websocket, offered_subprotocols
from ..registry.contract import PortTunnel
from .errors import PortUnreachable, Unforwardable, answer
from .ports import DROPPED_ANSWER_HEADERS, HOP_BY_HOP, PREFIX, connection_named, open_port, response_headers, target_of

log = get_logger("worker.http.ports")

#: The largest message of the app's passed on (uvicorn's own limit on the client's).
MAX_MESSAGE = 16 << 20
#: How long the app may take to answer the handshake.
HANDSHAKE_TIMEOUT = 30.0
#: How long the app may take to answer a close.
CLOSE_TIMEOUT = 5.0
#: Headers of the client's handshake not passed on: the service's credentials, and the
#: handshake's own (the proxy makes its own handshake with the app).
NOT_PASSED = frozenset(
    {
        b"host",
        b"authorization",
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-protocol",
        b"sec-websocket-extensions",
        b"sec-websocket-accept",
    }
)


def handshake_headers(scope: Scope, prefix: str) -> list[tuple[bytes, bytes]]:
    """The client's headers the app's handshake carries, and ``X-Forwarded-Prefix``."""
    raw = scope.get("headers", [])
    named = connection_named(raw)
    kept = [(k, v) for k, v in raw if k not in HOP_BY_HOP and k not in named and k not in NOT_PASSED]
    return [*kept, (b"x-forwarded-prefix", prefix.encode())]


def _accept_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    # (uvicorn adds its own Date; the handshake's own headers wsproto has already taken)
    dropped = HOP_BY_HOP | DROPPED_ANSWER_HEADERS | {b"server", b"content-length"}
    return [(k, v) for k, v in headers if k.lower() not in dropped]


class WebSocketPortProxy:
    """A WebSocket to a server listening on ``port`` in the workspace's sandbox, passed
    on message by message.

    (The ASGI endpoint of the proxy's WebSocket routes. Who may open one is decided
    before, by :class:`worker.auth.AccessGuard`.)"""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        opened = await open_port(scope)
        if isinstance(opened, Response):
            await deny_websocket(scope, receive, send, opened, code=1008 if opened.status_code < 500 else 1011)
            return
        tunnel, ws_id, port = opened
        try:
            await _Bridge(tunnel, scope, receive, send, f"/v1/workspaces/{ws_id}/ports/{port}", port).run()
        finally:
            await tunnel.close()


class _Bridge:
    """One WebSocket through one tunnel: the client's side (ASGI) to the app's (wsproto)."""

    def __init__(self, tunnel: PortTunnel, scope: Scope, receive: Receive, send: Send, prefix: str, port: int) -> None:
        self.tunnel = tunnel
        self.scope = scope
        self.receive = receive
        self.send = send
        self.prefix = prefix
        self.port = port
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.writing = asyncio.Lock()  # the tunnel's bytes, in the order wsproto made them
        self.replies: deque[Event] = deque()  # pongs and a close owed to the app
        self.replier: asyncio.Future[None] | None = None
        self.client_done = False  # the client left, or its side was closed
        self.eof = False  # the app's side of the tunnel ended

    # -- the handshake -----------------------------------------------------------------------

    async def _refuse(self, response: Response, code: int) -> None:
        with contextlib.suppress(OSError):
            await deny_websocket(self.scope, self.receive, self.send, response, code=code)

    async def _next_event(self) -> Event:
        """The next event from the app, reading the tunnel as needed (its end is fed to
        wsproto as such: an open connection's is a CloseConnection with 1006). Raises
        RemoteProtocolError (also for the end of a handshake not yet answered)."""
        while True:
            event = next(self.ws.events(), None)
            if event is not None:
                return event
            if self.eof:
                raise RemoteProtocolError("the connection closed")
            data = await self._read()
            self.eof = not data
            self.ws.receive_data(data or None)

    async def _read(self) -> bytes:
        try:
            return await self.tunnel.read()
        except TunnelClosedError:
            return b""

    async def _handshake(self) -> bool:
        """Whether the app accepted (and so the client's side); else the client was
        refused."""
        host = next((v.decode("latin-1") for k, v in self.scope.get("headers", []) if k == b"host"), "localhost")
        request = Request(
            host=host,
            target=target_of(self.scope, self.prefix).decode("latin-1"),
            subprotocols=offered_subprotocols(self.scope),
            extra_headers=handshake_headers(self.scope, self.prefix),
        )
        try:
            data = self.ws.send(request)
        except (LocalProtocolError, h11.LocalProtocolError, UnicodeError) as e:  # (a header, a Host h11 refuses)
            await self._refuse(answer(Unforwardable(f"The WebSocket handshake cannot be passed on: {e}")), 1008)
            return False
        try:
            await self.tunnel.write(data)
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                event = await self._next_event()
        except (RemoteProtocolError, TunnelClosedError, TimeoutError) as e:
            why = "no answer in time" if isinstance(e, TimeoutError) else (self.tunnel.error or str(e))
            unreachable = PortUnreachable(
                f"The server on port {self.port} in the sandbox sent no valid WebSocket answer: {why}"
            )
            await self._refuse(answer(unreachable), 1011)
            return False
        if isinstance(event, AcceptConnection):
            headers = _accept_headers(list(event.extra_headers))
            accept = {"type": "websocket.accept", "subprotocol": event.subprotocol, "headers": headers}
            try:
                await self.send(accept)
            except OSError:
                return False  # (the client left meanwhile)
            return True
        assert isinstance(event, RejectConnection), event
        await self._pass_refusal(event)
        return False

    async def _pass_refusal(self, event: RejectConnection) -> None:
        """The app's answer that is not 101, to the client: as the handshake's answer
        where the server can send one, else the handshake closed with 1011."""
        if "websocket.http.response" not in (self.scope.get("extensions") or {}) or event.status_code < 200:
            why = f"The server on port {self.port} in the sandbox refused the WebSocket handshake: {event.status_code}"
            await self._refuse(answer(PortUnreachable(why)), 1011)
            return
        headers = response_headers(list(event.headers))
        try:
            await self.send({"type": "websocket.http.response.start", "status": event.status_code, "headers": headers})
            more = event.has_body
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):  # (the client's going away is not watched)
                while more:
                    ev = await self._next_event()
                    if isinstance(ev, RejectData):
                        more = not ev.body_finished
                        body = {"type": "websocket.http.response.body", "body": bytes(ev.data), "more_body": more}
                        await self.send(body)
            if not event.has_body:
                await self.send({"type": "websocket.http.response.body", "body": b""})
        except (OSError, RemoteProtocolError, TimeoutError) as e:
            # The answer has begun: it can only be cut short (the server closes the connection).
            log.info("ports.ws_refusal_broken", port=self.port, error=str(e)[:200])

    # -- the messages ------------------------------------------------------------------------

    async def _to_app(self, event: Event) -> bool:
        """Send ``event`` to the app; False when its side can take no more."""
        async with self.writing:
            try:
                data = self.ws.send(event)
            except LocalProtocolError:
                return False  # (its side is closing)
            try:
                await self.tunnel.write(data)
            except TunnelClosedError:
                return False
        return True

    def _reply(self, event: Event) -> None:
        """Owe the app ``event`` (a pong, a close) without waiting behind a message."""
        if isinstance(event, Pong):  # only the last ping needs its pong (RFC 6455 5.5.3)
            self.replies = deque(e for e in self.replies if not isinstance(e, Pong))
        self.replies.append(event)
        if self.replier is None or self.replier.done():
            self.replier = asyncio.ensure_future(self._send_replies())

    async def _send_replies(self) -> None:
        while self.replies:
            if not await self._to_app(self.replies.popleft()):
                self.replies.clear()

    async def _to_client(self, message: dict[str, Any]) -> bool:
        if self.client_done:
            return False
        try:
            await self.send(message)
        except OSError:  # (uvicorn's ClientDisconnected)
            self.client_done = True
            return False
        if message["type"] == "websocket.close":
            self.client_done = True
        return True

    async def _close_client(self, code: int, reason: str) -> None:
        await self._to_client(
            {"type": "websocket.close", "code": code, "reason": reason.encode()[:123].decode("utf-8", "ignore")}
        )

    async def _up(self) -> None:
        """The client's messages to the app, then its close."""
        while True:
            msg = await self.receive()
            if msg["type"] == "websocket.receive":
                data = msg.get("bytes")
                if not await self._to_app(Message(data=data if data is not None else msg.get("text") or "")):
                    return
            elif msg["type"] == "websocket.disconnect":
                self.client_done = True
                code = msg.get("code") or 1005
                # A client gone without a close (1006) is one going away, to the app.
                await self._to_app(CloseConnection(code=1001 if code == 1006 else code, reason=msg.get("reason")))
                return

    async def _down(self) -> None:
        """The app's messages to the client, then its close (or its connection's end)."""
        parts: list[Any] = []
        size = 0
        while True:
            event = await self._next_event()
            if isinstance(event, TextMessage | BytesMessage):
                parts.append(event.data)
                size += len(event.data.encode()) if isinstance(event, TextMessage) else len(event.data)
                if size > MAX_MESSAGE:
                    self._reply(CloseConnection(code=1009, reason="message too big for the proxy"))
                    await self._close_client(1009, f"the app sent a message larger than {MAX_MESSAGE} bytes")
                    return
                if event.message_finished:
                    message: dict[str, Any]
                    if isinstance(event, TextMessage):
                        message = {"type": "websocket.send", "text": "".join(parts)}
                    else:
                        message = {"type": "websocket.send", "bytes": b"".join(parts)}
                    parts, size = [], 0
                    if not await self._to_client(message):
                        return
            elif isinstance(event, Ping):
                self._reply(event.response())
            elif isinstance(event, CloseConnection):
                await self._closed_by_app(event)
                return
            # (a Pong: the app answering nothing we sent)

    async def _closed_by_app(self, event: CloseConnection) -> None:
        state = self.ws.state
        if state is ConnectionState.REMOTE_CLOSING:  # the app's close: answered, passed on
            self._reply(event.response())
            await self._close_client(event.code, event.reason or "")
        elif state is ConnectionState.OPEN or state is ConnectionState.LOCAL_CLOSING:
            # (wsproto's own close: what the app sent is not WebSocket)
            if state is ConnectionState.OPEN:
                self._reply(CloseConnection(code=event.code, reason=event.reason))
            await self._close_client(1011, f"the app on port {self.port} broke the protocol: {event.reason}")
        elif event.code == 1006 and not self.client_done:  # the connection's end without a close
            why = self.tunnel.error or "the app closed the connection without a WebSocket close"
            log.info("ports.ws_broken", port=self.port, error=why[:200])
            await self._close_client(1011, f"the connection to port {self.port} in the sandbox broke: {why}")
        # (else: the app's answer to our close, the client's)

    async def run(self) -> None:
        if not await self._handshake():
            return
        up = asyncio.ensure_future(self._up())
        down = asyncio.ensure_future(self._down())
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if not down.done():  # the client left (its close is on its way to the app), or the tunnel broke
                await asyncio.wait({down}, timeout=CLOSE_TIMEOUT)
            for task in (up, down):
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            if not self.client_done:
                await self._close_client(1011, f"the connection to port {self.port} in the sandbox ended")
            if self.ws.state is ConnectionState.OPEN:
                self._reply(CloseConnection(code=1001, reason="the client went away"))
            if self.replier is not None:
                await asyncio.wait({self.replier}, timeout=CLOSE_TIMEOUT)
                self.replier.cancel()


_PROXY = WebSocketPortProxy()
#: The WebSocket routes of the port proxy (beside its HTTP routes, :mod:`.ports`); mounted
#: by :func:`worker.http.create_app`.
router = APIRouter()
router.routes.append(WebSocketRoute(PREFIX, endpoint=_PROXY))
router.routes.append(WebSocketRoute(PREFIX + "/{path:path}", endpoint=_PROXY))
