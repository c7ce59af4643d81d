"""The dashboard's own responses (``/`` and ``/ui/*``) hardened against framing, sniffing
and injection: a strict Content-Security-Policy (only this origin's scripts, styles and
connections, WebSockets included; no inline script or style; ``frame-ancestors 'none'``),
``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff``, ``Referrer-Policy:
no-referrer``.

One exception, for the page alone: a ``<style>`` element carrying the nonce of its
response (:func:`page_csp`). The terminal (xterm.js) writes its colours and cell sizes into
style elements it makes; the page's scripts give those the nonce
(``static/js/views/terminal.js``), markup could not. Style attributes stay refused.

Who may call the service at all (the token, loopback-only mode, the Host check against
DNS rebinding, cross-site requests) is decided for every route, the dashboard's
included, in :mod:`worker.auth`.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'{nonce}; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
#: The policy of every dashboard response but the page's (:func:`page_csp`). ``connect-src
#: 'self'`` covers the page's own WebSockets (ws: and wss: of its origin, CSP Level 3).
CSP = _CSP.format(nonce="")


def page_csp(style_nonce: str) -> str:
    """The page's policy: :data:`CSP`, and style elements carrying ``style_nonce``."""
    return _CSP.format(nonce=f" 'nonce-{style_nonce}'")


CSP_HEADER = b"content-security-policy"
DASHBOARD_HEADERS: list[tuple[bytes, bytes]] = [
    (CSP_HEADER, CSP.encode()),
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
    """ASGI middleware adding :data:`DASHBOARD_HEADERS` to the dashboard's responses (a
    response with a policy of its own, the page's, keeps it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_dashboard_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                own = any(k.lower() == CSP_HEADER for k, _v in headers)
                headers += [(k, v) for k, v in DASHBOARD_HEADERS if not (own and k == CSP_HEADER)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
