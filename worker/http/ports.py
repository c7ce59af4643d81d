"""The service's port proxy: ``/v1/workspaces/{id}/ports/{port}/{path}``, any method, to a
server listening on ``port`` of the workspace sandbox's own loopback (the sandbox still has
no network interface: each request goes through a tunnel over the agent's channel, see
:mod:`sandbox.tunnel`), so a person can open what the agent built in a browser.

What it does to a request, and nothing more: hop-by-hop headers (RFC 9110 7.6.1, and any
header the ``Connection`` header names) are dropped both ways, the service's own
credentials are never passed on (``Authorization`` carried the service's token), one
header is added (``X-Forwarded-Prefix: /v1/workspaces/{id}/ports/{port}``, for frameworks
that can serve under a prefix), and the request is sent with ``Connection: close`` (one
tunnel per request). Paths, ``Host``, cookies, ``Location`` and bodies pass unchanged, so
an app's links must be relative to work under the prefix (``href="static/app.js"``, not
``"/static/app.js"``). Request and response bodies stream both ways, held to the
tunnel's windows (``LOOM_MAX_BODY_BYTES``, the API's limit, does not apply to them).
WebSockets are carried by the same paths, message by message (:mod:`.ports_ws`); the
``Upgrade`` header of a plain HTTP request is hop-by-hop and is not.

Who may use it is decided by :mod:`worker.auth`, before the request reaches the proxy.
Only a service with a token (``LOOM_API_TOKEN``) proxies, and every answer is served as a
sandboxed document (``Content-Security-Policy: sandbox ...``, see SANDBOX_CSP): the app is
served from the service's own origin, and its scripts (the agent's code) must not act as
the dashboard or the API's user. Sandboxed, its origin is opaque: it cannot read the
token the dashboard keeps in the tab, register a service worker over the origin, or send
the API a request the guard takes as same-origin; without a token configured, any page of
this origin could call every route. Browsers send the token here with
HTTP Basic authentication (any user name, the token as the password; the browser asks for
it once and sends it again for this prefix), scripts with ``Authorization: Bearer``.

Answers of the proxy itself (not of the app) are JSON ``{"detail": ...}``: 401 no or a
wrong token, 403 no token configured, 404 no such workspace, 422 a port out of range, 502
nothing listens on the port or the server's answer was not HTTP, 503 the sandbox is
unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any
from urllib.parse import quote

import h11
from fastapi import APIRouter
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from sandbox.errors import AgentError, SandboxError
from sandbox.logs import get_logger

from ..registry.contract import OpensTunnels, PortTunnel
from ..service import InvalidWorkspaceId, WorkspaceNotFound
from .errors import Invalid, PortUnreachable, Unforwardable, answer
from .state import NotHeldHere, service_of

log = get_logger("worker.http.ports")

PREFIX = "/v1/workspaces/{workspace_id}/ports/{port:int}"
#: Dropped both ways (RFC 9110 7.6.1), with whatever ``Connection`` names. ``expect`` too:
#: the service answers ``100-continue`` itself.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"expect",
    }
)
#: Largest response head accepted from the app.
MAX_HEAD = 64 << 10


_PROXIED = re.compile(r"^/v1/workspaces/[^/]+/ports/[0-9]+/")
_PORTS = re.compile(r"^/v1/workspaces/[^/]+/ports/[0-9]+(?:/|$)")


def is_proxied(path: str) -> bool:
    """Whether ``path`` is one the proxy carries to an app (its bodies are streamed
    through under flow control, so the API's body limit does not apply to them)."""
    return _PROXIED.match(path) is not None


def is_port_path(path: str) -> bool:
    """Whether ``path`` is one of the proxy's routes (the carried paths, and the bare
    prefix that redirects to them): :mod:`worker.auth`'s rules for the proxy apply."""
    return _PORTS.match(path) is not None


class PortProxy:
    """A server listening on ``port`` in the workspace's sandbox, any method, proxied.

    (The ASGI endpoint of the proxy routes. Who may use it, a service with a token and
    the token as a bearer or the Basic password, is decided before, by
    :class:`worker.auth.AccessGuard`, for every path :func:`is_port_path` accepts.)"""

    async def bare(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``.../ports/{port}`` without the slash: to ``.../ports/{port}/``, so relative
        links resolve under the prefix."""
        query = scope.get("query_string", b"")
        target = quote(scope["path"]) + "/" + ("?" + query.decode("latin-1") if query else "")
        await send({"type": "http.response.start", "status": 308, "headers": [(b"location", target.encode())]})
        await send({"type": "http.response.body", "body": b""})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = await self._proxy(scope, receive, send)
        if refused is not None:
            await refused(scope, receive, send)

    # -- the proxying ----------------------------------------------------------------------

    async def _proxy(self, scope: Scope, receive: Receive, send: Send) -> Response | None:
        opened = await open_port(scope)
        if isinstance(opened, Response):
            return opened
        tunnel, ws_id, port = opened
        try:
            return await _Exchange(tunnel, scope, receive, send, ws_id, port).run()
        finally:
            await tunnel.close()


async def open_port(scope: Scope) -> tuple[PortTunnel, str, int] | Response:
    """A tunnel to the port a proxy route's ``scope`` names, with the workspace's id and
    the port; or the proxy's answer when there is none (404 no such workspace, 422 a port
    out of range, 502 nothing listens, 503 the sandbox unavailable, 501 a registry that
    does not reach ports)."""
    params = scope.get("path_params", {})
    ws_id, port = params.get("workspace_id", ""), params.get("port", 0)
    service = service_of(scope["app"])
    try:
        path = await service.workspaces.locate(ws_id)
    except (InvalidWorkspaceId, WorkspaceNotFound) as e:  # (an id that cannot exist is not here)
        return answer(WorkspaceNotFound(str(e)))
    if not 1 <= port <= 65535:
        return answer(Invalid(("path", "port"), f"port {port} is out of range (1-65535)"))
    try:
        registry = service.registry
        if not isinstance(registry, OpensTunnels):
            return answer(NotHeldHere("this service does not reach its sandboxes' ports"))
        # Stopped with the others when the service stops (LOOM_STOP_SANDBOXES_ON_EXIT).
        service.runner.opened.add(path)
        tunnel = await registry.open_tunnel(path, port)
    except AgentError as e:
        if e.code == "connection_refused":
            return answer(PortUnreachable(f"Nothing listens on port {port} in the sandbox of workspace {ws_id!r}"))
        return answer(PortUnreachable(f"Cannot reach port {port} in the sandbox: {e}"))
    except SandboxError as e:
        return answer(e)
    return tunnel, ws_id, port


class _Bare:
    """Redirects (308) to the same path with a slash, so the app's relative links resolve
    under the prefix.

    (The ASGI endpoint of the route without the slash: Starlette takes a bound method for
    a request-response function, not for an ASGI app.)"""

    def __init__(self, proxy: PortProxy) -> None:
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.proxy.bare(scope, receive, send)


_PROXY = PortProxy()
#: The two routes (any method); mounted by :func:`worker.http.create_app`.
router = APIRouter()
router.routes.append(Route(PREFIX, endpoint=_Bare(_PROXY), methods=None))
router.routes.append(Route(PREFIX + "/{path:path}", endpoint=_PROXY, methods=None))


def target_of(scope: Scope, prefix: str) -> bytes:
    """The request target for the app: the path after ``prefix`` as the client sent it
    (``/`` for none), and the query."""
    raw = scope.get("raw_path") or scope["path"].encode()
    rest = raw[len(prefix) :] if raw.startswith(prefix.encode()) else quote(scope["path"][len(prefix) :]).encode()
    query = scope.get("query_string", b"")
    return (rest or b"/") + (b"?" + query if query else b"")


def connection_named(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    """``connection`` and the headers it names (hop-by-hop too)."""
    named = {b"connection"}
    for k, v in headers:
        if k.lower() == b"connection":
            named |= {t.strip().lower() for t in v.split(b",")}
    return named


def _request_headers(scope: Scope, prefix: str) -> tuple[list[tuple[bytes, bytes]], bool]:
    """What goes to the app, and whether the body is chunked (no length known)."""
    raw = scope.get("headers", [])
    named = connection_named(raw)
    headers = []
    chunked = False
    for k, v in raw:
        if k == b"transfer-encoding":
            chunked = True
        if k in HOP_BY_HOP or k in named or k == b"authorization":
            continue
        headers.append((k, v))
    if chunked and any(k == b"content-length" for k, _ in headers):
        headers = [(k, v) for k, v in headers if k != b"content-length"]
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"x-forwarded-prefix", prefix.encode()))
    headers.append((b"connection", b"close"))
    return headers, chunked


#: Every proxied answer runs as a sandboxed document with an opaque origin. The app is
#: served from the service's own origin, and the agent wrote it: without this its scripts
#: would be same-origin with the dashboard, could read the token the dashboard keeps in
#: the tab's sessionStorage, call the API with it, or register a service worker over the
#: dashboard. Sandboxed, they still run (forms, popups, dialogs, downloads too), but get no
#: storage, no cookies of the origin, no same-origin access, and their requests to the API
#: carry ``Origin: null`` (refused by the guard). An app that needs an origin of its own
#: (local storage, its own API through fetch without CORS, WebSockets from its pages: their
#: handshakes carry ``Origin: null`` too) is opened through ``loom-worker port-forward``.
SANDBOX_CSP = (
    b"content-security-policy",
    b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads",
)

#: Answer headers of the app never passed on: ``Service-Worker-Allowed`` would let a worker
#: registered under the prefix control the whole origin (the sandbox already prevents the
#: registration; this is the second lock); ``Date`` is the service's own (uvicorn sends one:
#: two would make an answer with two dates).
DROPPED_ANSWER_HEADERS = frozenset({b"service-worker-allowed", b"date"})


def response_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    named = connection_named(headers)
    kept = [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in named and k not in DROPPED_ANSWER_HEADERS]
    return [*kept, SANDBOX_CSP]


class _Exchange:
    """One request through one tunnel: the request out as it comes in, the answer back as
    it comes out."""

    def __init__(self, tunnel: PortTunnel, scope: Scope, receive: Receive, send: Send, ws_id: str, port: int) -> None:
        self.tunnel = tunnel
        self.scope = scope
        self.receive = receive
        self.send = send
        self.prefix = f"/v1/workspaces/{ws_id}/ports/{port}"
        self.port = port
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        self.disconnected = asyncio.Event()

    async def _out(self, event: Any) -> None:
        data = self.h11.send(event)
        if data:
            await self.tunnel.write(data)

    async def run(self) -> Response | None:
        headers, _chunked = _request_headers(self.scope, self.prefix)
        method = self.scope["method"].encode()
        try:
            await self._out(h11.Request(method=method, target=target_of(self.scope, self.prefix), headers=headers))
        except h11.LocalProtocolError as e:
            return answer(Unforwardable(f"The request cannot be passed on: {e}"))
        sender = asyncio.ensure_future(self._send_body())
        try:
            return await self._answer(sender)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender

    async def _send_body(self) -> None:
        """The request's body to the app, then watch for the client going away."""
        while True:
            msg: Message = await self.receive()
            if msg["type"] == "http.disconnect":
                self.disconnected.set()
                await self.tunnel.close()
                return
            body = msg.get("body", b"")
            if body:
                await self._out(h11.Data(data=body))
            if not msg.get("more_body", False):
                break
        await self._out(h11.EndOfMessage())
        msg = await self.receive()
        while msg["type"] != "http.disconnect":
            msg = await self.receive()
        self.disconnected.set()
        await self.tunnel.close()

    async def _next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.tunnel.read()
            self.h11.receive_data(data)

    async def _answer(self, sender: asyncio.Future[None]) -> Response | None:
        try:
            while True:
                event = await self._next_event()
                if isinstance(event, h11.Response):
                    break
                if isinstance(event, h11.ConnectionClosed):
                    raise h11.RemoteProtocolError("the connection closed before an answer")
                # h11.InformationalResponse (100 Continue, 103 Early Hints): not passed on.
        except h11.RemoteProtocolError as e:
            if self.disconnected.is_set():
                return None
            why = self.tunnel.error or str(e)
            return answer(
                PortUnreachable(f"The server on port {self.port} in the sandbox sent no valid HTTP answer: {why}")
            )
        await self.send(
            {
                "type": "http.response.start",
                "status": event.status_code,
                "headers": response_headers(list(event.headers)),
            }
        )
        try:
            while True:
                event = await self._next_event()
                if isinstance(event, h11.Data):
                    await self.send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
        except h11.RemoteProtocolError as e:
            # The answer has begun: it can only be cut short. Without its last message the
            # server closes the connection, so the client sees a broken body, not a whole one.
            log.info("ports.answer_broken", port=self.port, error=str(self.tunnel.error or e)[:200])
            return None
        await self.send({"type": "http.response.body", "body": b""})
        return None
