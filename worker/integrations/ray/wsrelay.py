"""A WebSocket under a workspace (a terminal's screen: ``/v1/workspaces/{id}/terminals/
{tid}/ws``), relayed by a cluster's front door to the workspace's node, where the node's own
service app runs it (:mod:`.nodews`).

:class:`WebSocketRelay` carries the client's handshake and messages over the node's call
channel (``ws_begin``, ``ws_send``, ``ws_next``, ``ws_close`` of
:class:`.nodeapp.NodeApp`; each ask takes what is queued there) and the app's back, ASGI
message for message: the same subprotocol chosen, the same frames, the same close code and
reason as on one machine. Typing is one call per message; output comes back in batches of
what the node has queued (at most :data:`.nodews.QUEUED` messages), asked for one batch at
a time, so a slow client holds the app back rather than filling the front door.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from ...service import WorkspaceNotFound
from .errors import CallInterruptedError, NodeLostError
from .nodews import closing

if TYPE_CHECKING:
    from .client import ClusterRegistry
    from .workspaces import _Loc


class WebSocketRelay:
    """A client's WebSocket at the front door, relayed to the workspace's node."""

    def __init__(self, cluster: ClusterRegistry, ws_id: str, loc: _Loc, scope: Scope, receive: Receive, send: Send):
        self.cluster, self.ws_id, self.loc = cluster, ws_id, loc
        self.scope, self.receive, self.send = scope, receive, send

    async def _invoke(self, op: str, *args: Any) -> Any:
        return await self.cluster._invoke(self.ws_id, self.loc, op, *args)

    @staticmethod
    async def refuse(receive: Receive, send: Send, code: int, reason: str, *, connected: bool = False) -> None:
        """Refuse a handshake as the route would: accepted, so that the client reads the
        code and why, then closed."""
        if not connected and (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept", "subprotocol": None, "headers": []})
        await send({"type": "websocket.close", "code": code, "reason": reason.encode()[:123].decode("utf-8", "ignore")})

    async def run(self) -> None:
        s = self.scope
        if (await self.receive())["type"] != "websocket.connect":
            return
        request = (s["path"], s.get("raw_path") or s["path"].encode(), s.get("query_string", b""))
        try:
            messages, token = await self._invoke(
                "ws_begin", self.ws_id, *request, list(s.get("headers", [])), list(s.get("subprotocols") or [])
            )
        except (NodeLostError, CallInterruptedError) as e:
            why = f"the workspace's node is unavailable: {e}"
            await self.refuse(self.receive, self.send, 4503, why, connected=True)
            return
        except WorkspaceNotFound as e:
            await self.refuse(self.receive, self.send, 4404, str(e), connected=True)
            return
        for message in messages:
            await self.send(message)
        if token is None:
            return
        up = asyncio.create_task(self._up(token))
        try:
            await self._down(token)
        finally:
            up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await up

    async def _down(self, token: int) -> None:
        """The app's messages to the client, until its close (or the client left)."""
        try:
            while True:
                messages = await self._invoke("ws_next", token)
                for message in messages:
                    await self.send(message)
                if closing(messages[-1]):
                    return
        except (NodeLostError, CallInterruptedError, LookupError) as e:
            with contextlib.suppress(Exception):
                await self.send({"type": "websocket.close", "code": 1011, "reason": str(e)[:100]})
        except OSError:
            pass  # (a send to a client that left)

    async def _up(self, token: int) -> None:
        """The client's messages to the app, until it leaves."""
        while True:
            message = await self.receive()
            if message["type"] == "websocket.disconnect":
                with contextlib.suppress(Exception):
                    await self._invoke("ws_close", token, message.get("code", 1000))
                return
            await self._invoke("ws_send", token, [message])


__all__ = ["WebSocketRelay"]
