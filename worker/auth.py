"""Who may call the service: the one place that decides, for every surface the service
serves (the HTTP API, the MCP endpoint ``/v1/workspaces/{id}/mcp``, the port proxy
``/v1/workspaces/{id}/ports/...``, the dashboard and its assets).

The rules, in the order :class:`AccessGuard` applies them to every request:

1. **Bind** (before anything listens): never beyond loopback without a token
   (:func:`check_bind`); anyone who could reach the port could run commands.
2. **Host** (DNS rebinding): without a token (loopback-only mode) only loopback names
   (:data:`LOOPBACK_HOSTS`) are answered in ``Host``: a page of another site could
   otherwise make its own name resolve to 127.0.0.1 and be "same-origin" with the
   service. 403, reason ``host``.
3. **Cross-site** (CSRF and cross-site reads), token or not; 403, reason ``origin``.
   A client that is not a browser sends neither ``Origin`` nor ``Sec-Fetch-*`` and is
   never affected.

   - A state-changing request (POST, PUT, PATCH, DELETE: any method but GET, HEAD and
     OPTIONS, the port proxy carrying any to the app; and every WebSocket handshake,
     which opens a channel both ways) is refused unless its ``Origin`` is this service
     itself; without ``Origin`` (scripts) unless the browser marks it
     ``Sec-Fetch-Site: cross-site`` or ``same-site`` (another port of the same host is
     the same site). A browser sends ``Origin`` with every WebSocket handshake, and
     cannot be kept from opening one to any site (WebSockets have no CORS): this rule is
     the only thing between another site's page and a channel opened with the browser's
     credentials (cross-site WebSocket hijacking).
   - A read (GET, HEAD, OPTIONS; the Server-Sent Event streams are GETs) is refused when
     the browser says it comes from another origin (``Sec-Fetch-Site: cross-site`` or
     ``same-site``) unless it is a navigation the user sees (``Sec-Fetch-Mode:
     navigate``: a link to the dashboard or to a route still works); a browser without
     Fetch Metadata sends ``Origin`` on a script's cross-origin read, and a foreign one is
     refused. This is the "resource isolation policy" of Fetch Metadata (web.dev,
     "Protect your resources from web attacks with Fetch Metadata"). Why refuse reads at
     all, when a foreign page cannot read the answer (no CORS headers) nor send the
     token: without a token its ``<img>``/``EventSource`` could still open the streams and
     start sandboxes (a diff runs in one), and time answers to learn what exists.
   - The port proxy's reads are the exception: the agent's app runs there as a sandboxed
     document (an opaque origin, see :mod:`worker.http.ports`), so the browser marks the
     app's own scripts, styles and images ``cross-site``. Its writes are checked as all
     others (its forms and scripts send ``Origin: null``: refused).
4. **Token**: with ``LOOM_API_TOKEN`` every route but the public ones (``/healthz``, the
   OpenAPI document and its pages, the dashboard's page and assets: they hold no data)
   needs ``Authorization: Bearer <token>`` (401 ``WWW-Authenticate: Bearer``, reason
   ``auth``). The port proxy also takes the token as the password of HTTP Basic
   authentication (a browser opening the app has no other way to send it; 401 with a
   Basic challenge), and answers only on a service with a token (403 otherwise: the app
   shares the service's origin, see :mod:`worker.http.ports`).

   A WebSocket handshake may carry the token as for every route, and also as a
   subprotocol, because a browser's ``WebSocket`` cannot set a header:
   ``Sec-WebSocket-Protocol: loom.bearer.<token as base64url without padding>``
   (:func:`bearer_subprotocol`; Kubernetes does the same with
   ``base64url.bearer.authorization.k8s.io.<token>``). The browser must offer a second
   subprotocol, one the route speaks, and the route accepts with that one, never with
   the token's (a browser fails a handshake answered without a subprotocol when it
   offered some): routes call :func:`accept_subprotocol`, and the guard refuses to send
   an acceptance naming the token's. The port proxy never passes the token's on.

5. **E2B's API** (:mod:`worker.integrations.e2b`, when served): its control plane
   (``/sandboxes``, ``/v2/sandboxes``, ...: :func:`e2b_kind`) takes the token as E2B's API
   key, ``X-API-KEY`` (or as the bearer token); a sandbox's own API (envd's and the code
   interpreter's routes, the sandbox named by ``E2b-Sandbox-Id``) also takes that
   sandbox's access token, ``X-Access-Token`` (:meth:`Access.envd_token`: an HMAC of the
   sandbox's id under the token, so it opens that sandbox and no other), also as its
   ``E2B-Traffic-Access-Token`` (the code interpreter's SDK sends only that one on some
   requests: the control plane gives the same token as ``trafficAccessToken``). A ``/files`` URL
   signed with that token (E2B's ``download_url``/``upload_url``) passes the guard and is
   checked by its route with :meth:`Access.signed_file_sandbox`, the only place signatures
   are checked (the URL does not name its sandbox: the route knows which exist). 401
   otherwise, in E2B's shape (``{"code": 401, "message": ...}``).

A WebSocket handshake refused is answered with the same status and body as an HTTP
request (the ASGI denial extension, which uvicorn and Starlette's test client have);
on a server without it, it is closed before it is accepted with code 1008 (the client
sees the handshake fail either way).

The token is a header, never a cookie, so a page of another site cannot make a browser
send it. Comparisons are constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum
from urllib.parse import urlsplit

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.egress.authority import SCHEME_PORTS, of_netloc

#: The names answered without a token, and the bind addresses allowed without one.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
#: Methods that change nothing (RFC 9110 9.2.1); any other is judged as state-changing.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values of a request from this very origin, or the user's own action
#: (an address typed, a bookmark).
OWN_FETCH_SITES = frozenset({"same-origin", "none"})
PORTS_REALM = "loom-worker sandbox ports"
#: A WebSocket subprotocol carrying the token (base64url, no padding, after the prefix).
BEARER_SUBPROTOCOL = "loom.bearer."
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_OR_SUBPROTOCOL = f" (a WebSocket may carry it as the subprotocol {BEARER_SUBPROTOCOL}<token as base64url>)"


class UnsafeBindError(ValueError):
    """A non-loopback bind address without an API token."""


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a token. Raises UnsafeBindError."""
    if host not in LOOPBACK_HOSTS and not token:
        raise UnsafeBindError(
            f"Refusing to bind to {host} without LOOM_API_TOKEN: anyone who can reach the port "
            "could run commands in the sandboxes. Set LOOM_API_TOKEN or bind to 127.0.0.1."
        )


class Kind(Enum):
    """What a path is, for the token rule."""

    PUBLIC = "none"  # no token asked
    API = "bearer"  # Authorization: Bearer <token>
    PORTS = "bearer or Basic"  # the port proxy: bearer, or the token as the Basic password
    E2B = "X-API-KEY or bearer"  # E2B's control plane
    E2B_SANDBOX = "X-Access-Token (or E2B-Traffic-Access-Token), X-API-KEY, bearer or a signed URL"  # envd's


@dataclass(frozen=True)
class Refusal:
    """A request refused: the answer, and the ``loom_http_rejected_total`` reason
    (None: not counted)."""

    status: int
    detail: str
    reason: str | None
    headers: dict[str, str] = field(default_factory=dict)
    #: Answered in E2B's shape (``{"code", "message"}``: its SDKs read ``message``).
    e2b: bool = False

    def response(self) -> JSONResponse:
        body = {"code": self.status, "message": self.detail} if self.e2b else {"detail": self.detail}
        return JSONResponse(body, status_code=self.status, headers=self.headers or None)


@dataclass(frozen=True)
class Facts:
    """What the rules read from a request."""

    method: str
    scheme: str = "http"
    host: str | None = None
    origin: str | None = None
    fetch_site: str | None = None
    fetch_mode: str | None = None
    fetch_dest: str | None = None
    authorization: str = ""
    #: E2B's headers (``X-API-KEY``, ``X-Access-Token`` or else ``E2B-Traffic-Access-Token``,
    #: ``E2b-Sandbox-Id``), and whether the query carries a ``signature`` (a signed URL).
    api_key: str = ""
    access_token: str = ""
    sandbox_id: str = ""
    signed: bool = False
    #: A WebSocket handshake (judged as state-changing), and the subprotocols it offers.
    websocket: bool = False
    subprotocols: tuple[str, ...] = ()

    @classmethod
    def of(cls, scope: Scope) -> Facts:
        """The facts of an ASGI HTTP or WebSocket scope (the first of a repeated header, as
        Starlette reads it)."""
        found: dict[bytes, str] = {}
        for k, v in scope.get("headers") or []:
            if k in _READ and k not in found:
                found[k] = v.decode("latin-1")
        websocket = scope.get("type") == "websocket"
        return cls(
            method=scope.get("method", "GET"),
            scheme=scope.get("scheme", "http"),
            host=found.get(b"host"),
            origin=found.get(b"origin"),
            fetch_site=found.get(b"sec-fetch-site"),
            fetch_mode=found.get(b"sec-fetch-mode"),
            fetch_dest=found.get(b"sec-fetch-dest"),
            authorization=found.get(b"authorization", ""),
            api_key=found.get(b"x-api-key", ""),
            access_token=found.get(b"x-access-token") or found.get(b"e2b-traffic-access-token", ""),
            sandbox_id=found.get(b"e2b-sandbox-id", ""),
            signed=b"signature=" in (scope.get("query_string") or b""),
            websocket=websocket,
            subprotocols=tuple(scope.get("subprotocols") or ()) if websocket else (),
        )


_READ = frozenset(
    {
        b"host",
        b"origin",
        b"sec-fetch-site",
        b"sec-fetch-mode",
        b"sec-fetch-dest",
        b"authorization",
        b"x-api-key",
        b"x-access-token",
        b"e2b-traffic-access-token",
        b"e2b-sandbox-id",
    }
)


def _host_port(netloc: str, scheme: str) -> tuple[str, str]:
    """(host, port) of ``netloc``, the port made explicit from the scheme; ("", "") when
    it is not ``host[:port]`` (:func:`worker.egress.authority.of_netloc`)."""
    a = of_netloc(netloc, scheme if scheme in SCHEME_PORTS else "http")
    if a is None or a.port is None:
        return "", ""
    return a.host, str(a.port)


def is_loopback_host(host: str | None, scheme: str = "http") -> bool:
    """Whether a ``Host`` header names this machine's loopback (no header: an HTTP/1.0
    client on the socket itself)."""
    name = _host_port(host, scheme)[0] if host else "127.0.0.1"
    return name in LOOPBACK_HOSTS


def same_origin(origin: str | None, fetch_site: str | None, host: str | None, scheme: str) -> bool:
    """Whether a state-changing request comes from this service's own origin (or from a
    client that is not a browser)."""
    if origin is None:
        # Browsers send Origin with every request but GET and HEAD; without one it
        # is a script or a tool, unless the browser says the request is cross-site.
        return fetch_site not in ("cross-site", "same-site")
    if origin == "null" or host is None:
        return False  # a sandboxed frame, a file: page, a redirect across sites
    try:
        o = urlsplit(origin)
    except ValueError:
        return False
    if not o.scheme or not o.netloc:
        return False
    # The Host names this service as the browser reached it; behind a TLS-terminating
    # proxy the scheme seen here is http while the page's is https, so the port is
    # made explicit from each side's own scheme.
    theirs = _host_port(o.netloc, o.scheme)
    if not theirs[0]:
        return False  # (two unreadable authorities are not one origin)
    return theirs == _host_port(host, o.scheme) or theirs == _host_port(host, scheme)


def foreign_read(facts: Facts) -> bool:
    """Whether a read (GET, HEAD, OPTIONS) comes from another origin's page and is not a
    navigation (see the module docstring)."""
    if facts.fetch_site is not None:
        if facts.fetch_site in OWN_FETCH_SITES:
            return False
        # <object> and <embed> navigate too, but inside another site's page.
        navigation = facts.fetch_mode == "navigate" and facts.fetch_dest not in ("object", "embed")
        return not (navigation and facts.method == "GET")
    if facts.origin is not None:  # a browser without Fetch Metadata: a script's CORS read
        return not same_origin(facts.origin, None, facts.host, facts.scheme)
    return False


def _token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def bearer_subprotocol(token: str) -> str:
    """The WebSocket subprotocol that carries ``token`` (for a client that cannot send
    ``Authorization``: a browser's ``WebSocket``)."""
    return BEARER_SUBPROTOCOL + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def is_bearer_subprotocol(subprotocol: str | None) -> bool:
    return subprotocol is not None and subprotocol.startswith(BEARER_SUBPROTOCOL)


def subprotocol_token(subprotocols: Collection[str]) -> str | None:
    """The token the first ``loom.bearer.`` subprotocol offered carries; None without one,
    or when it is not base64url of UTF-8."""
    for p in subprotocols:
        if is_bearer_subprotocol(p):
            encoded = p[len(BEARER_SUBPROTOCOL) :]
            if not _BASE64URL.fullmatch(encoded) or len(encoded) % 4 == 1:
                return None
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
            except (binascii.Error, ValueError):
                return None
    return None


def offered_subprotocols(scope: Scope) -> list[str]:
    """The subprotocols a WebSocket handshake offers, but the token's."""
    return [p for p in scope.get("subprotocols") or () if not is_bearer_subprotocol(p)]


def accept_subprotocol(scope: Scope, supported: Collection[str]) -> str | None:
    """The subprotocol a WebSocket route accepts ``scope``'s handshake with: the first
    the client offered that the route speaks (``supported``), never the token's; None
    when it offered none of them (a browser that offered any, the token's alone
    included, then fails the handshake: it must offer one of the route's too).

    A route: ``await websocket.accept(subprotocol=accept_subprotocol(websocket.scope,
    ("loom.terminal.v1",)))``."""
    for p in offered_subprotocols(scope):
        if p in supported:
            return p
    return None


async def deny_websocket(scope: Scope, receive: Receive, send: Send, response: Response, *, code: int) -> None:
    """Refuse a WebSocket handshake not yet accepted: ``response`` is the HTTP answer
    where the server has the ASGI denial extension (uvicorn does), else the handshake is
    closed with ``code`` and the response's ``detail`` as the reason (a client sees the
    handshake fail either way)."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await response(scope, receive, send)
        return
    reason = bytes(response.body).decode("utf-8", "replace")
    with contextlib.suppress(ValueError):
        body = json.loads(reason)
        reason = str(body["detail"]) if isinstance(body, dict) and "detail" in body else reason
    # (a close frame's reason is at most 123 bytes of UTF-8)
    await send({"type": "websocket.close", "code": code, "reason": reason.encode()[:123].decode("utf-8", "ignore")})


class Access:
    """The service's rules for one token (None: loopback-only mode)."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        # What E2B's sandbox tokens are derived from: the token, or (loopback-only mode)
        # a key of this process's own.
        self._e2b_key = (self.token or secrets.token_hex(32)).encode()

    def envd_token(self, sandbox_id: str) -> str:
        """E2B's access token of sandbox ``sandbox_id`` (its ``envdAccessToken``): opens
        that sandbox's own API and no other's, and signs its file URLs."""
        return hmac.new(self._e2b_key, b"e2b-envd:" + sandbox_id.encode(), hashlib.sha256).hexdigest()

    def api_key_ok(self, api_key: str) -> bool:
        """Whether ``X-API-KEY`` carries the token (always, without a token)."""
        return self.token is None or _token_matches(api_key, self.token)

    def signed_file_sandbox(
        self,
        sandbox_ids: Collection[str],
        *,
        path: str,
        operation: str,
        username: str | None,
        signature: str,
        expiration: int | None,
        now: float,
    ) -> str | None:
        """Which of ``sandbox_ids`` signed this ``/files`` URL (E2B's v1 signature:
        ``v1_`` + unpadded base64 of SHA-256 of ``path:operation:username:token[:expiration]``
        under the sandbox's access token); None when none did or it expired."""
        if expiration is not None and expiration < now:
            return None
        for sid in sandbox_ids:
            raw = f"{path}:{operation}:{username or ''}:{self.envd_token(sid)}"
            if expiration is not None:
                raw += f":{expiration}"
            digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
            if _token_matches(signature, "v1_" + digest):
                return sid
        return None

    @property
    def token_required(self) -> bool:
        return self.token is not None

    def bearer_ok(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header carries the token as a bearer token
        (always, without a token)."""
        if self.token is None:
            return True
        scheme, _, given = authorization.partition(" ")
        return scheme.lower() == "bearer" and _token_matches(given.strip(), self.token)

    def ports_ok(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header carries the token as a bearer token or as
        the Basic password (any user name). False without a token."""
        if self.token is None:
            return False
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
            except (binascii.Error, ValueError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return _token_matches(value, self.token)

    def _subprotocol_ok(self, facts: Facts) -> bool:
        """Whether a WebSocket handshake carries the token as its ``loom.bearer.`` subprotocol."""
        if self.token is None or not facts.websocket:
            return False
        given = subprotocol_token(facts.subprotocols)
        return given is not None and _token_matches(given, self.token)

    def check(self, facts: Facts, kind: Kind) -> Refusal | None:
        """The refusal of a request to a path of ``kind``, or None when it may go on."""
        if self.token is None and not is_loopback_host(facts.host, facts.scheme):
            return Refusal(
                403,
                f"Host {facts.host!r} is not a loopback name: without LOOM_API_TOKEN this service answers only "
                "127.0.0.1, localhost and [::1] (protection against DNS rebinding)",
                "host",
            )
        if facts.websocket or facts.method not in SAFE_METHODS:
            if not same_origin(facts.origin, facts.fetch_site, facts.host, facts.scheme):
                what = "WebSocket handshake" if facts.websocket else "request"
                return Refusal(
                    403,
                    f"Cross-site request refused: Origin {facts.origin!r} is not this service (a {what} from "
                    "another site's page)",
                    "origin",
                )
        elif kind is not Kind.PORTS and foreign_read(facts):
            return Refusal(
                403,
                f"Cross-site request refused: a read from another origin (Origin {facts.origin!r}, "
                f"Sec-Fetch-Site {facts.fetch_site!r}) that is not a navigation",
                "origin",
            )
        if kind is Kind.API and not (self.bearer_ok(facts.authorization) or self._subprotocol_ok(facts)):
            detail = "Missing or wrong bearer token" + (_OR_SUBPROTOCOL if facts.websocket else "")
            return Refusal(401, detail, "auth", {"WWW-Authenticate": "Bearer"})
        if kind in (Kind.E2B, Kind.E2B_SANDBOX):
            return self._e2b_check(facts, kind)
        if kind is Kind.PORTS:
            if self.token is None:
                return Refusal(
                    403,
                    "The port proxy needs a service with an API token (LOOM_API_TOKEN): a page it serves shares "
                    "the service's origin and, without a token, could call the whole API from the browser. Set a "
                    "token, or use `loom-worker port-forward --workspace DIR PORT`, which gives the app its own "
                    "origin.",
                    None,
                )
            if not (self.ports_ok(facts.authorization) or self._subprotocol_ok(facts)):
                return Refusal(
                    401,
                    "Missing or wrong token (a bearer token, or the token as the Basic password)"
                    + (_OR_SUBPROTOCOL if facts.websocket else ""),
                    "auth",
                    {"WWW-Authenticate": f'Basic realm="{PORTS_REALM}", charset="UTF-8"'},
                )
        return None

    def _e2b_check(self, facts: Facts, kind: Kind) -> Refusal | None:
        if self.token is None or self.api_key_ok(facts.api_key) or self.bearer_ok(facts.authorization):
            return None
        if kind is Kind.E2B_SANDBOX:
            if facts.sandbox_id and _token_matches(facts.access_token, self.envd_token(facts.sandbox_id)):
                return None
            if facts.signed and not facts.access_token:
                return None  # (the route checks the signature: signed_file_sandbox)
        what = "sandbox access token (X-Access-Token) or " if kind is Kind.E2B_SANDBOX else ""
        return Refusal(401, f"Missing or wrong {what}API key (X-API-KEY: the service's token)", "auth", e2b=True)


#: E2B's control plane paths, and a sandbox's own (envd's, the code interpreter's).
E2B_API_PREFIXES = (
    "/sandboxes",
    "/v2/sandboxes",
    "/snapshots",
    "/templates",
    "/v2/templates",
    "/v3/templates",
    "/volumes",
    "/secrets",
    "/teams",
    "/nodes",
    "/access-tokens",
    "/api-keys",
)
E2B_SANDBOX_PATHS = frozenset({"/files", "/health", "/execute", "/contexts", "/envs", "/init"})
E2B_SANDBOX_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/", "/contexts/")


def e2b_kind(path: str) -> Kind | None:
    """The kind of an E2B path (None: not one of E2B's)."""
    if path in E2B_SANDBOX_PATHS or path.startswith(E2B_SANDBOX_PREFIXES):
        return Kind.E2B_SANDBOX
    for prefix in E2B_API_PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            return Kind.E2B
    return None


@dataclass(frozen=True)
class Paths:
    """Which paths are which :class:`Kind` (everything else is :attr:`Kind.API`)."""

    public: Collection[str] = ()
    public_prefixes: tuple[str, ...] = ()
    ports: Callable[[str], bool] = lambda _path: False

    def kind(self, path: str) -> Kind:
        if path in self.public or path.startswith(self.public_prefixes):
            return Kind.PUBLIC
        if self.ports(path):
            return Kind.PORTS
        return e2b_kind(path) or Kind.API


class AccessGuard:
    """ASGI middleware applying :meth:`Access.check` to every HTTP request, before any
    route sees it: a route added later is covered without asking. ``on_reject(reason)``
    counts refusals."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        access: Access,
        paths: Paths,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.access = access
        self.paths = paths
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.access.check(Facts.of(scope), self.paths.kind(scope.get("path", "")))
        if refusal is None:
            await self.app(scope, receive, send if scope["type"] == "http" else _never_echo_token(send))
            return
        if refusal.reason is not None and self.on_reject is not None:
            self.on_reject(refusal.reason)
        if scope["type"] == "http":
            await refusal.response()(scope, receive, send)
        else:  # a WebSocket handshake: refused before it is accepted
            await receive()  # (its websocket.connect)
            await deny_websocket(scope, receive, send, refusal.response(), code=1008)


def _never_echo_token(send: Send) -> Send:
    """``send`` refusing a WebSocket acceptance that names the token's subprotocol (the
    answer would show the token to whatever logs the handshake; routes accept with
    :func:`accept_subprotocol`)."""

    async def guarded(message: Message) -> None:
        if message["type"] == "websocket.accept" and is_bearer_subprotocol(message.get("subprotocol")):
            raise RuntimeError(
                "a WebSocket route accepted with the token's subprotocol: accept with one of its own "
                "(worker.auth.accept_subprotocol)"
            )
        await send(message)

    return guarded


__all__ = [
    "BEARER_SUBPROTOCOL",
    "LOOPBACK_HOSTS",
    "Access",
    "AccessGuard",
    "Facts",
    "Kind",
    "Paths",
    "Refusal",
    "UnsafeBindError",
    "accept_subprotocol",
    "bearer_subprotocol",
    "check_bind",
    "deny_websocket",
    "e2b_kind",
    "foreign_read",
    "is_bearer_subprotocol",
    "is_loopback_host",
    "offered_subprotocols",
    "same_origin",
    "subprotocol_token",
]
