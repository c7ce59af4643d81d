"""The dashboard's own responses (``/`` and ``/ui/*``) hardened against framing, sniffing
and injection: a strict Content-Security-Policy (only this origin's scripts, styles and
connections; no inline script or style; ``frame-ancestors 'none'``), ``X-Frame-Options:
DENY``, ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``.

Who may call the service at all (the token, loopback-only mode, the Host check against
DNS rebinding, cross-site requests) is decided for every route, the dashboard's
included, in :mod:`worker.auth`.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
#: The dashboard's paths: its page and its assets (public: they hold no data).
PAGE = "/"
ASSETS_PREFIX = "/ui/"


def is_dashboard_path(path: str) -> bool:
    return path == PAGE or path.startswith(ASSETS_PREFIX)


class DashboardHeaders:
    """ASGI middleware adding :data:`DASHBOARD_HEADERS` to the dashboard's responses."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_dashboard_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *DASHBOARD_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)
