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
     OPTIONS, the port proxy carrying any to the app) is refused unless its ``Origin``
     is this service itself; without ``Origin`` (scripts) unless the browser marks it
     ``Sec-Fetch-Site: cross-site`` or ``same-site`` (another port of the same host is
     the same site).
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

The token is a header, never a cookie, so a page of another site cannot make a browser
send it. Comparisons are constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from worker.egress.authority import SCHEME_PORTS, of_netloc

#: The names answered without a token, and the bind addresses allowed without one.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
#: Methods that change nothing (RFC 9110 9.2.1); any other is judged as state-changing.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values of a request from this very origin, or the user's own action
#: (an address typed, a bookmark).
OWN_FETCH_SITES = frozenset({"same-origin", "none"})
PORTS_REALM = "loom-worker sandbox ports"


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


@dataclass(frozen=True)
class Refusal:
    """A request refused: the answer, and the ``loom_http_rejected_total`` reason
    (None: not counted)."""

    status: int
    detail: str
    reason: str | None
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": self.detail}, status_code=self.status, headers=self.headers or None)


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

    @classmethod
    def of(cls, scope: Scope) -> Facts:
        """The facts of an ASGI HTTP scope (the first of a repeated header, as Starlette reads it)."""
        found: dict[bytes, str] = {}
        for k, v in scope.get("headers") or []:
            if k in _READ and k not in found:
                found[k] = v.decode("latin-1")
        return cls(
            method=scope.get("method", "GET"),
            scheme=scope.get("scheme", "http"),
            host=found.get(b"host"),
            origin=found.get(b"origin"),
            fetch_site=found.get(b"sec-fetch-site"),
            fetch_mode=found.get(b"sec-fetch-mode"),
            fetch_dest=found.get(b"sec-fetch-dest"),
            authorization=found.get(b"authorization", ""),
        )


_READ = frozenset({b"host", b"origin", b"sec-fetch-site", b"sec-fetch-mode", b"sec-fetch-dest", b"authorization"})


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


class Access:
    """The service's rules for one token (None: loopback-only mode)."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None

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

    def check(self, facts: Facts, kind: Kind) -> Refusal | None:
        """The refusal of a request to a path of ``kind``, or None when it may go on."""
        if self.token is None and not is_loopback_host(facts.host, facts.scheme):
            return Refusal(
                403,
                f"Host {facts.host!r} is not a loopback name: without LOOM_API_TOKEN this service answers only "
                "127.0.0.1, localhost and [::1] (protection against DNS rebinding)",
                "host",
            )
        if facts.method not in SAFE_METHODS:
            if not same_origin(facts.origin, facts.fetch_site, facts.host, facts.scheme):
                return Refusal(
                    403, f"Cross-site request refused: Origin {facts.origin!r} is not this service", "origin"
                )
        elif kind is not Kind.PORTS and foreign_read(facts):
            return Refusal(
                403,
                f"Cross-site request refused: a read from another origin (Origin {facts.origin!r}, "
                f"Sec-Fetch-Site {facts.fetch_site!r}) that is not a navigation",
                "origin",
            )
        if kind is Kind.API and not self.bearer_ok(facts.authorization):
            return Refusal(401, "Missing or wrong bearer token", "auth", {"WWW-Authenticate": "Bearer"})
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
            if not self.ports_ok(facts.authorization):
                return Refusal(
                    401,
                    "Missing or wrong token (a bearer token, or the token as the Basic password)",
                    "auth",
                    {"WWW-Authenticate": f'Basic realm="{PORTS_REALM}", charset="UTF-8"'},
                )
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
        return Kind.API


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
            await self.app(scope, receive, send)
            return
        if refusal.reason is not None and self.on_reject is not None:
            self.on_reject(refusal.reason)
        if scope["type"] == "http":
            await refusal.response()(scope, receive, send)
        else:  # a WebSocket handshake (no route has one today): closed before it is accepted
            await receive()
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.detail[:120]})


__all__ = [
    "LOOPBACK_HOSTS",
    "Access",
    "AccessGuard",
    "Facts",
    "Kind",
    "Paths",
    "Refusal",
    "UnsafeBindError",
    "check_bind",
    "foreign_read",
    "is_loopback_host",
    "same_origin",
]
