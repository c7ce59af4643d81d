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
- E2B's API, when served (:mod:`.e2brule`'s part of the rule, :mod:`.e2bfront`): every
  request that names one sandbox goes whole to its node; creating and listing sandboxes
  are the front door's; the rest of its control plane is refused, naming why.

:func:`carried` decides (a test walks every route of the app through it: each is
forwarded, at the front by name, or refused with its reason). :class:`Forwarder` is the
app's innermost middleware: after the token and body-limit checks, before the routes.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from ...auth import e2b_kind
from ...service import InvalidWorkspaceId, WorkspaceNotFound, check_workspace_id
from .client import ClusterRegistry
from .e2bfront import E2BFront
from .e2brule import e2b_carried
from .e2bwire import e2b_error
from .errors import NodeLostError
from .relay import Relay, lost_response
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

Decision = Literal["forward", "front", "refuse", "unlisted"]  # (E2B's: .e2brule, the first three)

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
    e2b = e2b_carried(method, path)
    if e2b is not None:
        return e2b
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


class Forwarder:
    """The front door's innermost middleware: hands every request :func:`carried`
    forwards to its workspace's node and answers the refused ones; passes the rest on."""

    def __init__(self, app: ASGIApp, *, cluster: ClusterRegistry, e2b: E2BFront | None = None) -> None:
        self.app = app
        self.cluster = cluster
        #: E2B's API, when the front door serves it.
        self.e2b = e2b

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = scope["type"] == "websocket"
        if scope["type"] != "http" and not websocket:
            await self.app(scope, receive, send)
            return
        if e2b_kind(scope["path"]) is not None:
            await self._e2b(scope, receive, send)
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
            await Relay(self.cluster, ws_id, loc, scope, receive, send).run()

    async def _e2b(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A path of E2B's API: carried by :mod:`.e2brule`'s rule when E2B is served
        (the front door's own routes answer the rest: create, list; a 404 when not served)."""
        decision, why = carried(scope["method"], scope["path"]) if scope["type"] == "http" else ("front", "")
        if self.e2b is None or decision == "front":
            await self.app(scope, receive, send)
        elif decision == "refuse":
            await e2b_error(scope["path"], 501, "unimplemented", f"Not served by a cluster's front door: {why}")(
                scope, receive, send
            )
        else:
            await self.e2b.carry(scope, receive, send, self.app)


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
