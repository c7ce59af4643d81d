"""The request body limit (``LOOM_MAX_BODY_BYTES``): 413 beyond it, by ``Content-Length``
or while the body streams in, before any route reads it."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import BodyTooLarge, answer


class BodyLimit:
    """Refuse bodies larger than ``limit`` bytes with 413, by Content-Length or while
    streaming; not on paths ``exempt`` accepts (the port proxy streams bodies through,
    holding none)."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        on_reject: Callable[[], None] = lambda: None,
        exempt: Callable[[str], bool] = lambda _path: False,
        limit_for: Callable[[str], int | None] = lambda _path: None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.on_reject = on_reject
        self.exempt = exempt
        #: A path's own limit, where it takes larger bodies (a file's bytes), else None.
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.exempt(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", "")) or self.limit
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    too_big = int(v) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(scope, receive, send, limit)
                    return
        seen = 0
        exceeded = False
        replaced = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _TooLarge
            return msg

        async def guarded_send(msg: Message) -> None:
            # The framework may turn the receive error into its own 400: answer 413 instead.
            nonlocal replaced
            if exceeded:
                if msg["type"] == "http.response.start" and not replaced:
                    replaced = True
                    await self._reject(scope, receive, send, limit)
                return
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not replaced:
                await self._reject(scope, receive, send, limit)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        self.on_reject()
        await answer(BodyTooLarge(f"Request body larger than {limit} bytes"))(scope, receive, send)


class _TooLarge(Exception):
    pass
