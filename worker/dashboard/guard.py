"""The service's defences against the browser being used against it.

The API authenticates with a bearer token sent as a header, never a cookie, so a page of
another site cannot make a browser send it. What is left is guarded here, for every
route (the dashboard's and the API's):

- **Cross-site requests** (CSRF): a state-changing request (POST, PUT, PATCH, DELETE)
  whose ``Origin`` is not this service itself, or that the browser marks
  ``Sec-Fetch-Site: cross-site``, is refused with 403, token or not. A client that is
  not a browser sends no ``Origin`` and is not affected.
- **DNS rebinding**: without a token (loopback-only mode) a page of another site could
  make its own name resolve to 127.0.0.1 and be "same-origin" with the service. So
  without a token only loopback names are answered in ``Host`` (``127.0.0.1``,
  ``localhost``, ``[::1]``); anything else gets 403.
- **Framing, sniffing, injection** on the dashboard's own responses (``/`` and
  ``/ui/*``): a strict Content-Security-Policy (only this origin's scripts, styles and
  connections; no inline script or style; ``frame-ancestors 'none'``), ``X-Frame-Options:
  DENY``, ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
DASHBOARD_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]


def is_dashboard_path(path: str) -> bool:
    return path == "/" or path.startswith("/ui/")


def _host_port(netloc: str, scheme: str) -> tuple[str, str]:
    """(host, port) of ``netloc``, the port made explicit from the scheme."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return "", ""
    if port is None:
        port = 443 if scheme in ("https", "wss") else 80
    return host, str(port)


class Guard:
    """ASGI middleware; see the module docstring. ``token_required``: whether the
    service has an API token (without one, the Host check applies)."""

    def __init__(self, app: ASGIApp, *, token_required: bool, on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.token_required = token_required
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        host = origin = fetch_site = None
        for k, v in headers:
            if k == b"host":
                host = v.decode("latin-1")
            elif k == b"origin":
                origin = v.decode("latin-1")
            elif k == b"sec-fetch-site":
                fetch_site = v.decode("latin-1")
        scheme = scope.get("scheme", "http")
        if not self.token_required:
            name = _host_port(host or "", scheme)[0] if host else "127.0.0.1"
            if name not in LOOPBACK_NAMES:
                await self._refuse(
                    scope,
                    receive,
                    send,
                    "host",
                    f"Host {host!r} is not a loopback name: without LOOM_API_TOKEN this service answers only "
                    "127.0.0.1, localhost and [::1] (protection against DNS rebinding)",
                )
                return
        if scope.get("method") in UNSAFE_METHODS and not self._same_origin(origin, fetch_site, host, scheme):
            await self._refuse(
                scope,
                receive,
                send,
                "origin",
                f"Cross-site request refused: Origin {origin!r} is not this service",
            )
            return
        if not is_dashboard_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *DASHBOARD_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)

    @staticmethod
    def _same_origin(origin: str | None, fetch_site: str | None, host: str | None, scheme: str) -> bool:
        if origin is None:
            # Browsers send Origin with every POST, PUT, PATCH and DELETE; without one it
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
        return _host_port(o.netloc, o.scheme) == _host_port(host, o.scheme) or _host_port(
            o.netloc, o.scheme
        ) == _host_port(host, scheme)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, reason: str, detail: str) -> None:
        if self.on_reject is not None:
            self.on_reject(reason)
        await JSONResponse({"detail": detail}, status_code=403)(scope, receive, send)
