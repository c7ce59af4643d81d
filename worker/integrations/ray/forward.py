"""How a front door carries each route of the service (``worker.http.app.ROUTERS``) for a
workspace on another node, in tables a test walks: every route of the app is in one of
them.

- :data:`FORWARDED`: the request is handed, whole, to the workspace's node, whose own
  service app answers it (:mod:`.nodeapp`): the call history and its live stream, the
  workspace's secrets (set, list, delete: values never in an answer, as on one machine),
  its snapshots and restore, its processes and sandbox (the harness API's exec and files too, bytes as they are), the
  vendors' native tools. The
  answer streams back as the node's app sends it (a stream ends when the client leaves:
  the node's call is cancelled).
- :data:`REFUSED`: answered ``501`` with the reason (:func:`refusal`): what a cluster has
  no single place for.
- Everything else is served by the front door's own app over the cluster's objects
  (:mod:`.frontdoor`: workspaces, calls, streams, the changelog, settings, egress, the port
  proxy, MCP, tools, images) or by the front door itself (health, metrics, documentation,
  the dashboard); ``POST .../fork`` by :func:`fork_route`.

:class:`Forwarder` is the app's innermost middleware: after the token and body-limit
checks, before the routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from ray.exceptions import RayActorError, RayTaskError
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from ...service import InvalidWorkspaceId, WorkspaceNotFound, check_workspace_id, result_dict
from .client import ClusterRegistry, infrastructure_result
from .errors import ClusterError, NodeLostError

_WS = "/v1/workspaces/{workspace_id}"

#: Routes answered by the workspace's node's own app, as (method, path).
FORWARDED: frozenset[tuple[str, str]] = frozenset(
    {
        ("GET", f"{_WS}/calls"),
        ("GET", f"{_WS}/calls/stream"),
        ("GET", f"{_WS}/secrets"),
        ("PUT", f"{_WS}/secrets/{{name}}"),
        ("DELETE", f"{_WS}/secrets/{{name}}"),
        ("GET", f"{_WS}/snapshots"),
        ("POST", f"{_WS}/snapshots"),
        ("GET", f"{_WS}/snapshots/{{ref}}"),
        ("DELETE", f"{_WS}/snapshots/{{ref}}"),
        ("POST", f"{_WS}/restore"),
        ("GET", f"{_WS}/processes"),
        ("GET", f"{_WS}/processes/{{process_id}}/output"),
        ("POST", f"{_WS}/processes/{{process_id}}/input"),
        ("POST", f"{_WS}/processes/{{process_id}}/kill"),
        ("GET", f"{_WS}/sandbox"),
        ("POST", f"{_WS}/sandbox/exec"),
        ("GET", f"{_WS}/sandbox/files"),
        ("PUT", f"{_WS}/sandbox/files"),
        ("POST", f"{_WS}/native/anthropic"),
        ("POST", f"{_WS}/native/openai"),
    }
)

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


def refusal(method: str, path: str) -> JSONResponse:
    """The answer to a refused route: 501, naming why."""
    why = REFUSED[(method, path)]
    return JSONResponse({"detail": f"Not served by a cluster's front door: {why}"}, status_code=501)


def lost_response(e: ClusterError) -> JSONResponse:
    """A lost node (or a call cut from it) as the front door answers it: 503 with the
    infrastructure result."""
    return JSONResponse(result_dict(infrastructure_result(e)), status_code=503)


class Forwarder:
    """The front door's innermost middleware: hands the :data:`FORWARDED` routes of a
    workspace to its node and answers the :data:`REFUSED` ones; passes the rest on."""

    def __init__(self, app: ASGIApp, *, cluster: ClusterRegistry, routes: list[BaseRoute]) -> None:
        self.app = app
        self.cluster = cluster
        self.routes = routes

    def _match(self, scope: Scope) -> tuple[str, str, dict[str, Any]] | None:
        for route in self.routes:
            match, child = route.matches(scope)
            if match == Match.FULL:
                return scope["method"], str(getattr(route, "path", "")), child.get("path_params", {})
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._match(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        method, path, params = found
        if (method, path) in REFUSED:
            await refusal(method, path)(scope, receive, send)
            return
        try:
            ws_id = check_workspace_id(str(params.get("workspace_id", "")))
        except InvalidWorkspaceId:
            await self.app(scope, receive, send)  # the route's own validation answers 422
            return
        try:
            loc = await self.cluster._locate(ws_id)
        except WorkspaceNotFound as e:
            await JSONResponse({"detail": str(e)}, status_code=404)(scope, receive, send)
            return
        except NodeLostError as e:
            await lost_response(e)(scope, receive, send)
            return
        await _Relay(self.cluster, ws_id, loc, scope, receive, send).run()


class _Relay:
    """One forwarded request: its body to the node, the node's answer back as it comes."""

    def __init__(self, cluster: ClusterRegistry, ws_id: str, loc: Any, scope: Scope, receive: Receive, send: Send):
        self.cluster, self.ws_id, self.loc = cluster, ws_id, loc
        self.scope, self.receive, self.send = scope, receive, send

    async def _body(self) -> bytes:
        chunks = []
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                raise ConnectionResetError("the client left")
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                return b"".join(chunks)

    async def run(self) -> None:
        s = self.scope
        try:
            body = await self._body()
        except ConnectionResetError:
            return
        gen = self.loc.service.http.remote(
            self.ws_id,
            s["method"],
            s["path"],
            s.get("raw_path") or s["path"].encode(),
            s.get("query_string", b""),
            list(s.get("headers", [])),
            body,
        )
        self.gone = self.complete = False
        watcher = asyncio.create_task(self._until_gone(gen))
        started = False
        try:
            async for ref in gen:
                message = await ref
                started = started or message["type"] == "http.response.start"
                last = message["type"] == "http.response.body" and not message.get("more_body", False)
                self.complete = last
                await self.send(message)
                if last:
                    return  # (the node's side ends by itself)
        except RayActorError as e:
            self.cluster._locs.pop(self.ws_id, None)
            if started:
                raise  # the answer has begun: it can only be cut short
            await lost_response(NodeLostError(self.ws_id, self.loc.node, " ".join(str(e).split())[:300]))(
                s, self.receive, self.send
            )
        except RayTaskError as e:
            if self.gone:
                return  # the client left, and the node's side was cancelled for it
            cause = getattr(e, "cause", None)
            if started or not isinstance(cause, WorkspaceNotFound):
                raise
            await JSONResponse({"detail": str(cause)}, status_code=404)(s, self.receive, self.send)
        except OSError:
            self.gone = True  # (a send to a client that left)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if self.gone:
                import ray

                ray.cancel(gen)  # the client is gone: so is the node's side

    async def _until_gone(self, gen: Any) -> None:
        # A server says "disconnect" when the client left, and also once the answer is
        # complete: only the first ends the node's call.
        while (await self.receive())["type"] != "http.disconnect":
            pass
        if not self.complete:
            import ray

            self.gone = True
            ray.cancel(gen)
        import ray

        ray.cancel(gen)


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
