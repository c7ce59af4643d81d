"""A WebSocket under a workspace, on its node: run in the node's own service app for a
cluster's front door (:class:`.wsrelay.WebSocketRelay`), as :mod:`.nodeapp` runs a request.

The client's messages are queued in, the app's queued out, at most :data:`QUEUED` each
way, so a slow client makes the app wait (a terminal then stops reading its program's
output) and a fast typist waits for the app. The connection enters the app as one from
the node's loopback would (``Host: 127.0.0.1``, the node's own token, no ``Origin``): the
front door's guard has already judged the browser's handshake, its token included; the
``loom.bearer.`` subprotocol that may carry it is not passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from sandbox.logs import get_logger

from ...auth import is_bearer_subprotocol

log = get_logger("worker.integrations.ray")

#: Messages queued each way (the app, or the client, waits beyond).
QUEUED = 16
#: Seconds a connection left by its front door (no ask) lives before it is ended.
ABANDONED = 300.0
#: Seconds an app is given to end after its client left, before it is cancelled.
GRACE = 5.0
#: Headers the front door's guard has already judged, and the connection's own.
_DROPPED = frozenset(
    {b"authorization", b"host", b"origin", b"cookie", b"connection", b"sec-websocket-protocol", b"upgrade"}
)


def ws_scope(
    path: str,
    raw_path: bytes,
    query: bytes,
    headers: list[tuple[bytes, bytes]],
    subprotocols: list[str],
    token: str | None,
) -> dict[str, Any]:
    """The ASGI scope of a relayed WebSocket, as a client on the node's loopback opens it."""
    hdrs = [(k, v) for k, v in headers if k.lower() not in _DROPPED]
    hdrs.append((b"host", b"127.0.0.1"))
    if token:
        hdrs.append((b"authorization", b"Bearer " + token.encode()))
    return {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "scheme": "ws",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": hdrs,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
        "subprotocols": [p for p in subprotocols if not is_bearer_subprotocol(p)],
        "state": {},
    }


def closing(message: dict[str, Any]) -> bool:
    return message["type"] == "websocket.close"


class NodeSocket:
    """One relayed WebSocket running in the node's app (see the module docstring)."""

    def __init__(self, app: Any, scope: dict[str, Any]) -> None:
        self._in: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=QUEUED)
        self._out: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=QUEUED)
        self._in.put_nowait({"type": "websocket.connect"})
        self.done = False  # its close went out
        self.asked = time.monotonic()
        self.asking = 0  # asks under way (an idle terminal's ask waits: it is not abandoned)
        self._task = asyncio.create_task(app(scope, self._in.get, self._out.put))

    async def _get(self) -> dict[str, Any]:
        """The app's next message; a close (1011) once it ended without one."""
        if not self._out.empty():
            return self._out.get_nowait()
        get = asyncio.ensure_future(self._out.get())
        await asyncio.wait({get, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
        if not self._task.cancelled() and self._task.exception() is not None:
            log.warning("ray.ws_app_failed", error=repr(self._task.exception())[:300])
        return {"type": "websocket.close", "code": 1011, "reason": ""}

    async def next(self, first: bool = False) -> list[dict[str, Any]]:
        """The app's messages queued now (waiting for one); with ``first``, all of them
        up to its acceptance or close."""
        self.asking += 1
        try:
            out = [await self._get()]
            waiting = first and out[-1]["type"] != "websocket.accept"
            while not closing(out[-1]) and (waiting or not self._out.empty()):
                out.append(await self._get())
                waiting = waiting and out[-1]["type"] != "websocket.accept"
        finally:
            self.asking -= 1
            self.asked = time.monotonic()
        self.done = closing(out[-1])
        return out

    async def push(self, messages: list[dict[str, Any]]) -> None:
        """The client's messages to the app (waiting while it has :data:`QUEUED` unread)."""
        self.asked = time.monotonic()
        for m in messages:
            if self._task.done():
                return
            await self._in.put(m)

    def left(self, code: int = 1000) -> None:
        """The client went away: the app is told so, and cancelled if it has not ended
        within :data:`GRACE` seconds."""
        with contextlib.suppress(asyncio.QueueFull):
            self._in.put_nowait({"type": "websocket.disconnect", "code": code})
        asyncio.get_running_loop().call_later(GRACE, self._task.cancel)

    def abandoned(self, now: float) -> bool:
        return not self.asking and now - self.asked > ABANDONED


__all__ = ["QUEUED", "NodeSocket", "closing", "ws_scope"]
