"""One request a front door hands whole to a workspace's node (:class:`Relay`): its body to
the node, the node's answer back as it comes (:meth:`.nodeapp.NodeApp.http_begin`, or
``e2b_begin`` for E2B's API, then ``http_next`` while it streams), the node's side
cancelled when the client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from ...service import WorkspaceNotFound, result_dict
from .client import ClusterRegistry, infrastructure_result
from .errors import CallInterruptedError, ClusterError, NodeLostError
from .workspaces import _Loc

Messages = list[dict[str, Any]]


def lost_response(e: ClusterError) -> JSONResponse:
    """A lost node (or a call cut from it) as the front door answers it: 503 with the
    infrastructure result."""
    return JSONResponse(result_dict(infrastructure_result(e)), status_code=503)


def last(message: dict[str, Any]) -> bool:
    """Whether ``message`` ends an HTTP answer."""
    return message["type"] == "http.response.body" and not message.get("more_body", False)


async def _missing(scope: Scope, receive: Receive, send: Send, e: WorkspaceNotFound) -> None:
    await JSONResponse({"detail": str(e)}, status_code=404)(scope, receive, send)


async def _lost(scope: Scope, receive: Receive, send: Send, e: ClusterError) -> None:
    await lost_response(e)(scope, receive, send)


class Relay:
    """One forwarded request (see the module docstring). ``begin`` is the node's method
    that starts it; ``body`` the request's body when already read; ``missing`` and
    ``lost`` answer a workspace the node does not have and a lost node (loom's answers by
    default); ``whole`` may change an answer that came back whole before it is sent."""

    def __init__(
        self,
        cluster: ClusterRegistry,
        ws_id: str,
        loc: _Loc,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        begin: str = "http_begin",
        body: bytes | None = None,
        missing: Callable[[Scope, Receive, Send, WorkspaceNotFound], Awaitable[None]] = _missing,
        lost: Callable[[Scope, Receive, Send, ClusterError], Awaitable[None]] = _lost,
        whole: Callable[[Messages], Messages] | None = None,
    ):
        self.cluster, self.ws_id, self.loc = cluster, ws_id, loc
        self.scope, self.receive, self.send = scope, receive, send
        self.begin, self.body, self.missing, self.lost, self.whole = begin, body, missing, lost, whole
        self.gone = asyncio.Event()

    async def _body(self) -> bytes:
        if self.body is not None:
            return self.body
        return await read_body(self.receive)

    async def _watch(self) -> None:
        # A server says "disconnect" when the client left (and once the answer is
        # complete: by then nothing waits on it).
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone.set()

    async def _invoke(self, op: str, *args: Any) -> Any:
        return await self.cluster._invoke(self.ws_id, self.loc, op, *args)

    async def run(self) -> None:
        s = self.scope
        try:
            body = await self._body()
        except ConnectionResetError:
            return
        request = (s["method"], s["path"], s.get("raw_path") or s["path"].encode(), s.get("query_string", b""))
        try:
            messages, token = await self._invoke(self.begin, self.ws_id, *request, list(s.get("headers", [])), body)
        except (NodeLostError, CallInterruptedError) as e:
            await self.lost(s, self.receive, self.send, e)
            return
        except WorkspaceNotFound as e:
            await self.missing(s, self.receive, self.send, e)
            return
        if token is None and self.whole is not None:
            messages = self.whole(messages)
        watcher = asyncio.create_task(self._watch()) if token is not None else None
        try:
            while True:
                for message in messages:
                    await self.send(message)
                if token is None or last(messages[-1]):
                    token = None
                    return
                ask = asyncio.ensure_future(self._invoke("http_next", token))
                left = asyncio.ensure_future(self.gone.wait())
                await asyncio.wait({ask, left}, return_when=asyncio.FIRST_COMPLETED)
                left.cancel()
                if not ask.done():
                    ask.cancel()
                    return  # the client left: so does the node's side (below)
                messages = ask.result()  # (a node lost now cuts the answer short)
        except OSError:
            return  # (a send to a client that left)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if token is not None:
                with contextlib.suppress(Exception):
                    await self._invoke("http_cancel", token)


async def read_body(receive: Receive) -> bytes:
    """A request's whole body. Raises ConnectionResetError when the client left first."""
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionResetError("the client left")
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` whose request body (already read) is ``body`` again, then the
    client's own messages (its disconnect)."""
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await receive())

    return again
