"""How a front door carries each request: one rule, not a table of routes.

- Every request under a workspace (``/v1/workspaces/{id}`` and below) is handed, whole,
  to the workspace's node, whose own service app answers it (:mod:`.nodeapp`): the same
  route, the same code, the same answer as on one machine. A route added to the service
  works on a cluster without a line of cluster code.
- Three kinds of request under a workspace span nodes and stay at the front door
  (:data:`FRONT_UNDER_WORKSPACE`): deleting it (its slot is Ray's), forking it (the
  forks are placed), and its port stream (bodies stream both ways through a tunnel).
- Outside any workspace the front door serves what spans the nodes (creating and listing
  workspaces, tool listings and search, images) and its own concerns (health, metrics,
  the dashboard's files, the OpenAPI documents): :data:`FRONT`.
- :data:`REFUSED`: answered ``501`` with the reason (:func:`refusal`): what a cluster has
  no single place for.
- A WebSocket under a workspace (the method :data:`WEBSOCKET` here: a terminal's screen)
  is carried by the same rule, relayed message by message (:mod:`.wsrelay`).

:func:`carried` decides (a test walks every route of the app through it: each is
forwarded, at the front by name, or refused with its reason). :class:`Forwarder` is the
app's innermost middleware: after the token and body-limit checks, before the routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from ...service import InvalidWorkspaceId, WorkspaceNotFound, check_workspace_id, result_dict
from .client import ClusterRegistry, infrastructure_result
from .errors import CallInterruptedError, ClusterError, NodeLostError
from .workspaces import _Loc
from .wsrelay import WebSocketRelay

_WS = "/v1/workspaces/{workspace_id}"
_WORKSPACES = ("v1", "workspaces")

#: The requests under a workspace the front door answers itself, by (method or ``*``,
#: the path after the workspace's: exact, or ending ``/*`` for everything under it), with why.
FRONT_UNDER_WORKSPACE: dict[tuple[str, str], str] = {
    ("DELETE", ""): "deleting a workspace frees its slot, which is Ray's (the placement spans the nodes)",
    ("POST", "fork"): "the forks are new workspaces, placed on nodes with free slots",
    ("*", "ports/*"): "the port stream: request and answer bodies stream both ways through a tunnel to the sandbox",
}

_SPANS = "spans the nodes"
_OWN = "the front door's own"
#: The paths outside any workspace the front door serves (every method), with why.
FRONT: dict[str, str] = {
    "/healthz": _OWN,
    "/metrics": _OWN,
    "/openapi.json": _OWN + " (the OpenAPI document)",
    "/docs": _OWN + " (the OpenAPI pages)",
    "/docs/oauth2-redirect": _OWN + " (the OpenAPI pages)",
    "/redoc": _OWN + " (the OpenAPI pages)",
    "/": _OWN + " (the dashboard's page)",
    "/ui": _OWN + " (the dashboard's files)",
    "/v1/workspaces": _SPANS + ": a workspace is placed on a node with a free slot; the list is every node's",
    "/v1/tools": _SPANS + ": the tools every live node runs",
    "/v1/tools/search": _SPANS + ": a live node's catalog",
    "/v1/native/tools": _SPANS + ": the vendors' native tools, registered here and with each node",
    "/v1/images/pull": _SPANS + ": pulled on every live node",
    "/v1/images/pulls": _SPANS + ": every node's pulls",
}

_SECRETS_WHY = (
    "the process-wide default secrets are each node's own (under its LOOM_DATA_DIR): a cluster has no place "
    "for them but a store of its own, and Ray's control store is readable by every driver of the cluster, "
    "so secret values are never put there. Set them on each node (`loom-worker secret set --default` there), "
    "or per workspace with PUT /v1/workspaces/{id}/secrets/{name}, which this front door carries to the "
    "workspace's node"
)

#: Routes a front door refuses, with the reason it answers.
REFUSED: dict[tuple[str, str], str] = {
    ("GET", "/v1/secrets"): _SECRETS_WHY,
    ("PUT", "/v1/secrets/{name}"): _SECRETS_WHY,
    ("DELETE", "/v1/secrets/{name}"): _SECRETS_WHY,
}

Decision = Literal["forward", "front", "refuse", "unlisted"]

#: The "method" of a WebSocket route or handshake, for :func:`carried`.
WEBSOCKET = "WEBSOCKET"


def _refused(method: str, parts: list[str]) -> str | None:
    # A refused route's path, matched part by part ("{...}" any one part).
    for (m, template), why in REFUSED.items():
        t = template.strip("/").split("/")
        if (
            m == method
            and len(t) == len(parts)
            and all(a == b or a.startswith("{") for a, b in zip(t, parts, strict=True))
        ):
            return why
    return None


def carried(method: str, path: str) -> tuple[Decision, str]:
    """How the front door carries ``method path`` (a request's path, or a route's
    template; ``method`` :data:`WEBSOCKET` for a WebSocket): forwarded to the workspace's
    node, served at the front (with why), refused (with why), or ``unlisted`` (outside
    any workspace and in no table: the front door's app answers it, a 404 for a path it
    does not have)."""
    parts = path.strip("/").split("/")
    if tuple(parts[:2]) == _WORKSPACES and len(parts) > 2:
        tail = "/".join(parts[3:])
        for (m, pattern), reason in FRONT_UNDER_WORKSPACE.items():
            under = pattern.endswith("/*") and (tail + "/").startswith(pattern[:-1])
            if m in ("*", method) and (tail == pattern or under):
                return "front", reason
        return "forward", "under a workspace: its node answers"
    why = _refused(method, parts)
    if why is not None:
        return "refuse", why
    top = "/" + "/".join(parts)
    if top in FRONT:
        return "front", FRONT[top]
    if parts[0] == "ui":
        return "front", FRONT["/ui"]
    return "unlisted", ""


def refusal(why: str) -> JSONResponse:
    """The answer to a refused route: 501, naming why."""
    return JSONResponse({"detail": f"Not served by a cluster's front door: {why}"}, status_code=501)


def lost_response(e: ClusterError) -> JSONResponse:
    """A lost node (or a call cut from it) as the front door answers it: 503 with the
    infrastructure result."""
    return JSONResponse(result_dict(infrastructure_result(e)), status_code=503)


class Forwarder:
    """The front door's innermost middleware: hands every request :func:`carried`
    forwards to its workspace's node and answers the refused ones; passes the rest on."""

    def __init__(self, app: ASGIApp, *, cluster: ClusterRegistry) -> None:
        self.app = app
        self.cluster = cluster

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = scope["type"] == "websocket"
        if scope["type"] != "http" and not websocket:
            await self.app(scope, receive, send)
            return
        decision, why = carried(WEBSOCKET if websocket else scope["method"], scope["path"])
        if decision == "refuse":
            await refusal(why)(scope, receive, send)
            return
        if decision != "forward":
            await self.app(scope, receive, send)
            return
        try:
            ws_id = check_workspace_id(scope["path"].strip("/").split("/")[2])
        except InvalidWorkspaceId:
            await self.app(scope, receive, send)  # the route's own validation answers 422
            return
        try:
            loc = await self.cluster._locate(ws_id)
        except WorkspaceNotFound as e:
            if websocket:  # (the route's own refusal: accepted, then closed with why)
                await WebSocketRelay.refuse(receive, send, 4404, str(e))
            else:
                await JSONResponse({"detail": str(e)}, status_code=404)(scope, receive, send)
            return
        except NodeLostError as e:
            if websocket:
                await WebSocketRelay.refuse(receive, send, 4503, f"the workspace's node is unavailable: {e}")
            else:
                await lost_response(e)(scope, receive, send)
            return
        if websocket:
            await WebSocketRelay(self.cluster, ws_id, loc, scope, receive, send).run()
        else:
            await _Relay(self.cluster, ws_id, loc, scope, receive, send).run()


def _last(message: dict[str, Any]) -> bool:
    return message["type"] == "http.response.body" and not message.get("more_body", False)


class _Relay:
    """One forwarded request: its body to the node, the node's answer back as it comes
    (:meth:`.nodeapp.NodeApp.http_begin`, then ``http_next`` while it streams)."""

    def __init__(self, cluster: ClusterRegistry, ws_id: str, loc: _Loc, scope: Scope, receive: Receive, send: Send):
        self.cluster, self.ws_id, self.loc = cluster, ws_id, loc
        self.scope, self.receive, self.send = scope, receive, send
        self.gone = asyncio.Event()

    async def _body(self) -> bytes:
        chunks = []
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                raise ConnectionResetError("the client left")
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                return b"".join(chunks)

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
            messages, token = await self._invoke("http_begin", self.ws_id, *request, list(s.get("headers", [])), body)
        except (NodeLostError, CallInterruptedError) as e:
            await lost_response(e)(s, self.receive, self.send)
            return
        except WorkspaceNotFound as e:
            await JSONResponse({"detail": str(e)}, status_code=404)(s, self.receive, self.send)
            return
        watcher = asyncio.create_task(self._watch()) if token is not None else None
        try:
            while True:
                for message in messages:
                    await self.send(message)
                if token is None or _last(messages[-1]):
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


def fork_route(cluster: ClusterRegistry) -> APIRoute:
    """``POST /v1/workspaces/{id}/fork`` of a front door: the forks placed on the source
    workspace's node, each a workspace of the cluster (:meth:`.snapshots.ClusterSnapshots.fork`),
    with the route's own body, answer and refusals (:mod:`worker.http.snapshots`); a node
    without enough free slots answers 503."""
    from ...http import snapshots as route
    from ...http.common import WorkspaceId
    from ...http.state import service_of

    async def fork(request: Request, workspace_id: WorkspaceId, body: route.ForkRequest) -> route.Forked:
        await service_of(request.app).workspaces.locate(workspace_id)
        runner = service_of(request.app).runner
        # (its refusals are answered by the service's error table: worker.http.errors)
        async with runner.slot():
            snap, made = await cluster.snapshots.fork_named(
                body.snapshot,
                body.count,
                workspace=workspace_id,
                name_of=lambda base: f"{Path(base).name[:48]}-{secrets.token_hex(3)}",
                service_only=True,
            )
        return route.Forked(snapshot=snap, workspaces=[route.ForkedWorkspace(id=w.id, path=w.path or "") for w in made])

    # (this module's annotations are strings: FastAPI reads the real types from here)
    fork.__annotations__ = {
        "request": Request,
        "workspace_id": WorkspaceId,
        "body": route.ForkRequest,
        "return": route.Forked,
    }
    original = next(
        r
        for r in route.router.routes
        if isinstance(r, APIRoute) and r.path == f"{_WS}/fork" and "POST" in (r.methods or ())
    )
    return APIRoute(
        original.path,
        fork,
        methods=["POST"],
        status_code=original.status_code,
        responses=original.responses,
        tags=original.tags,
        summary=original.summary,
        description=original.description,
        name=original.name,
        include_in_schema=False,  # the app's own route documents it
    )
