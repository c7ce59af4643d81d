"""E2B's API on a cluster's front door (``loom-worker serve --ray`` with E2B's routes; the
rule: :mod:`.e2brule`). An E2B client points ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` at the
front door and reaches sandboxes on every node.

- :meth:`E2BFront.carry`: a request naming one sandbox goes whole to the sandbox's node
  (:class:`.relay.Relay` over ``e2b_begin``: its answer streams back as it comes, Connect's
  server streams and the code interpreter's NDJSON alike). The sandbox is the one in the
  path (``/sandboxes/{id}/...``), or in the ``E2b-Sandbox-Id`` header, or the one whose
  access token signed a ``/files`` URL (found here, :meth:`worker.auth.Access.signed_file_sandbox`
  over the cluster's sandboxes; the URL is then carried as a request for that sandbox, its
  signature checked). A request naming no sandbox, or one the cluster does not have, is
  answered by the front door's own E2B routes, as one machine answers it (its not-found in
  E2B's words); a lost node is ``503``, Connect's ``unavailable``.
- :meth:`E2BFront.create_sandbox` (``POST /sandboxes``, ``/v2/sandboxes``): the node is chosen here
  as for any workspace (:meth:`.workspaces.Placements.choose_node`: Ray's scheduler, a
  node with a free slot), and the request carried whole to it; its control plane creates
  the sandbox, its record, and its slot (:mod:`.nodeslots`), so every front door and
  driver finds it there. A full cluster is ``429`` (a limit). A sandbox the node made
  without a slot (from a snapshot: not through the app's workspaces) could be reached by
  no request: it is killed there, and the create refused (``501``), saying so.
- :meth:`E2BFront.list_sandboxes` (``GET /sandboxes``, ``/v2/sandboxes``): every node holding a
  sandbox is asked with the client's filters, and the answers merged and paginated here
  (:mod:`.e2bwire`).

The access tokens in the answers are the front door's (:func:`.e2bwire.front_tokens`): a
client's ``X-Access-Token`` and signed URLs are checked here.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox.logs import get_logger

from ...auth import Access
from ...service import InvalidWorkspaceId, WorkspaceNotFound, check_workspace_id
from . import gcs
from .client import ClusterRegistry
from .e2brule import sandbox_in_path
from .e2bwire import (
    Messages,
    answer_of,
    created_id,
    e2b_error,
    front_tokens,
    header,
    list_items,
    list_query,
    merged_page,
    messages_of,
    node_query,
)
from .errors import CallInterruptedError, ClusterError, ClusterFullError, NodeLostError
from .relay import Relay, read_body, replay

log = get_logger("worker.integrations.ray")

#: The query parameters of a signed ``/files`` URL that only the front door reads.
_SIGNATURE = frozenset({"signature", "signature_expiration"})
#: Pages a node may answer to one list (E2B's largest page each) before the rest is left out.
MAX_NODE_PAGES = 1000


def _access(scope: Scope) -> Access:
    access: Access = scope["app"].state.service.access
    return access


class _Answer:
    """A whole answer's ASGI messages, sent as they are."""

    def __init__(self, messages: Messages) -> None:
        self.messages = messages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for message in self.messages:
            await send(message)


def _request(scope: Scope, query: bytes | None = None) -> tuple[Any, ...]:
    """What a node's ``e2b_*`` method takes of a request, but its body."""
    return (
        scope["method"],
        scope["path"],
        scope.get("raw_path") or scope["path"].encode(),
        scope.get("query_string", b"") if query is None else query,
        list(scope.get("headers", [])),
    )


def _naming(scope: Scope, sandbox_id: str) -> Scope:
    """``scope`` with one ``E2b-Sandbox-Id`` header, naming ``sandbox_id``: the node's
    routes act on the sandbox this front door chose, whatever else the client sent."""
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"e2b-sandbox-id"]
    headers.append((b"e2b-sandbox-id", sandbox_id.encode()))
    return {**scope, "headers": headers}


def _unavailable(path: str, e: ClusterError) -> Any:
    return e2b_error(
        path, 503, "unavailable", f"The sandbox's node is unavailable (infrastructure failure, not the request's): {e}"
    )


class E2BFront:
    """E2B's API on a front door (see the module docstring)."""

    def __init__(self, cluster: ClusterRegistry) -> None:
        self.cluster = cluster

    # -- a request naming one sandbox ---------------------------------------------------------

    async def carry(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        """Carry an HTTP request of E2B's API that names one sandbox to its node; ``app``
        (the front door's routes) answers one naming no sandbox of the cluster."""
        try:
            body = await read_body(receive)
        except ConnectionResetError:
            return
        path = scope["path"]
        under = sandbox_in_path(path)
        sid = under[0] if under is not None else None
        if under is None:
            scope, sid = await self._in_sandbox(scope)

        async def here(s: Scope, r: Receive, snd: Send, _e: Exception | None = None) -> None:
            # The front door's own E2B route answers, as one machine does (the sandbox
            # named is not the cluster's, or none is).
            if sid is not None:
                self.cluster._locs.pop(sid, None)
            await app(s, replay(body, r), snd)

        if sid is None:
            await here(scope, receive, send)
            return
        try:
            loc = await self.cluster._locate(check_workspace_id(sid))
        except (WorkspaceNotFound, InvalidWorkspaceId):
            await here(scope, receive, send)
            return
        except NodeLostError as e:
            await _unavailable(path, e)(scope, receive, send)
            return

        async def lost(s: Scope, r: Receive, snd: Send, e: ClusterError) -> None:
            await _unavailable(path, e)(s, r, snd)

        whole = None
        if under is not None:
            access = _access(scope)
            gone = scope["method"] == "DELETE" and under[1] == ""

            def whole(messages: Messages) -> Messages:
                if gone:  # (killed: its slot is freed on its node)
                    self.cluster._locs.pop(sid, None)
                return front_tokens(messages, access.envd_token)

        await Relay(
            self.cluster,
            sid,
            loc,
            scope,
            receive,
            send,
            begin="e2b_begin",
            body=body,
            missing=here,
            lost=lost,
            whole=whole,
        ).run()

    async def _in_sandbox(self, scope: Scope) -> tuple[Scope, str | None]:
        """The sandbox an in-sandbox request names (``E2b-Sandbox-Id``, or the signer of a
        signed ``/files`` URL: the request then names it by the header, its signature
        checked here), with the scope to carry."""
        query = scope.get("query_string", b"")
        if scope["path"] != "/files" or b"signature=" not in query:
            # (the first of a repeated header, as the guard judged it: the only one carried)
            sid = header(list(scope.get("headers", [])), b"e2b-sandbox-id")
            return (scope, None) if sid is None else (_naming(scope, sid), sid)
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        sid = await self._signer(scope, dict(pairs))
        if sid is None:
            return scope, None  # (refused by the route, as one machine refuses it)
        kept = urlencode([(k, v) for k, v in pairs if k not in _SIGNATURE]).encode()
        return _naming({**scope, "query_string": kept}, sid), sid

    async def _signer(self, scope: Scope, params: dict[str, str]) -> str | None:
        """The sandbox of the cluster that signed this ``/files`` URL (None: none did, or
        it expired)."""
        try:
            expiration = int(params["signature_expiration"]) if params.get("signature_expiration") else None
        except ValueError:
            return None
        records = await asyncio.to_thread(gcs.slots, self.cluster.namespace)
        return _access(scope).signed_file_sandbox(
            [r.name for r in records if r.state == "CREATED"],
            path=params.get("path", ""),
            operation="read" if scope["method"] in ("GET", "HEAD") else "write",
            username=params.get("username") or None,
            signature=params.get("signature", ""),
            expiration=expiration,
            now=time.time(),
        )

    # -- what spans the nodes -------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        """Create and list, matched before E2B's own routes."""
        return [
            Route(p, endpoint, methods=[m], include_in_schema=False)
            for p in ("/sandboxes", "/v2/sandboxes")
            for m, endpoint in (("POST", self.create_sandbox), ("GET", self.list_sandboxes))
        ]

    async def create_sandbox(self, request: Request) -> Any:
        """A sandbox created on the node chosen here (see the module docstring)."""
        body = await request.body()
        path = request.url.path
        try:
            node = await self.cluster.choose_node()
        except ClusterFullError as e:
            return e2b_error(path, 429, "resource_exhausted", f"No sandbox can be created now: {e}")
        try:
            messages = await self.cluster.node_invoke(node, "e2b_request", *_request(request.scope), body)
        except (NodeLostError, CallInterruptedError) as e:
            why = f"The node chosen for the sandbox ({node}) is unavailable (infrastructure failure; try again): {e}"
            return e2b_error(path, 503, "unavailable", why)
        sid = created_id(messages)
        if sid is not None and await asyncio.to_thread(gcs.slot, self.cluster.namespace, sid) is None:
            return await self._unplaced(request.scope, node, sid)
        return _Answer(front_tokens(messages, _access(request.scope).envd_token))

    async def _unplaced(self, scope: Scope, node: str, sid: str) -> Any:
        """A sandbox its node made without a slot of the cluster (its workspace not made
        through the app's workspaces: one made from a snapshot), which no request could
        reach: killed there, and refused, saying so."""
        kill = ("DELETE", f"/sandboxes/{sid}", f"/sandboxes/{sid}".encode(), b"", list(scope.get("headers", [])))
        try:
            await self.cluster.node_invoke(node, "e2b_request", *kill, b"")
        except Exception as e:  # (reported with the refusal: nothing else to do with it)
            log.warning("e2b.create.unplaced_kill_failed", sandbox=sid, node=node, error=str(e)[:300])
        return e2b_error(
            scope["path"],
            501,
            "unimplemented",
            f"Not served by a cluster's front door: sandbox {sid} was made by node {node} without a slot of the "
            "cluster (a sandbox made from a snapshot: E2B's snapshots and forks are each node's, not carried on a "
            "cluster), so no request could reach it; it was killed. Create from a template, or fork with loom's "
            "POST /v1/workspaces/{id}/fork",
        )

    async def list_sandboxes(self, request: Request) -> Any:
        """Every node's sandboxes, merged and paginated (see :mod:`.e2bwire`)."""
        path = request.url.path
        paginated = path.startswith("/v2/")
        try:
            q = list_query(request.scope.get("query_string", b""), paginated=paginated)
        except ValueError as e:
            return e2b_error(path, 400, "invalid_argument", str(e))
        records = await asyncio.to_thread(gcs.slots, self.cluster.namespace)
        alive = {n.node_id for n in await asyncio.to_thread(gcs.nodes) if n.alive}
        nodes = sorted({r.node for r in records if r.state == "CREATED" and r.node in alive})
        found = await asyncio.gather(*(self._node_list(n, request.scope, paginated) for n in nodes))
        lists: list[list[Any]] = []
        running = 0
        for one in found:
            if isinstance(one, _Answer):
                return one  # a node refused the query (its filters): its answer
            if one is not None:
                lists.append(one[0])
                running += one[1]
        page, token = merged_page(lists, q)
        headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
        if paginated:
            headers.append((b"x-total-running", str(running).encode()))
        if token is not None:
            headers.append((b"x-next-token", token.encode()))
        return _Answer(messages_of(200, headers, json.dumps(page, separators=(",", ":")).encode()))

    async def _node_list(self, node: str, scope: Scope, paginated: bool) -> tuple[list[Any], int] | _Answer | None:
        """A node's whole list for the request's filters, page by page, and its count of
        running sandboxes; its answer when it refused; None when the node was lost (its
        sandboxes are left out: they cannot be reached)."""
        items: list[Any] = []
        running = 0
        token: str | None = None
        for page in range(MAX_NODE_PAGES):
            query = node_query(scope.get("query_string", b""), token, paginated=paginated)
            try:
                messages = await self.cluster.node_invoke(node, "e2b_request", *_request(scope, query), b"")
            except (NodeLostError, CallInterruptedError) as e:
                log.warning("e2b.list.node_lost", node=node, error=str(e))
                return None
            status, headers, body = answer_of(messages)
            if status != 200:
                return _Answer(messages)
            items += list_items(headers, body)
            if page == 0:
                count = header(headers, b"x-total-running") or "0"
                running = int(count) if count.isdigit() else 0
            token = header(headers, b"x-next-token") if paginated else None
            if not token:
                break
        return items, running
