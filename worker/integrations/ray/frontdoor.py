"""The service's front door on a cluster (``loom-worker serve --ray ADDRESS``): the same app
(:func:`worker.http.create_app`: HTTP, MCP, dashboard, the same token and settings), with
the registry and the workspaces replaced by cluster-backed objects implementing what the
routes use. How each route is carried: :mod:`.forward`'s tables.

- :class:`ClusterWorkspaces`: ``POST /v1/workspaces`` places the workspace on a node
  (its ``path`` is under that node's ``LOOM_WORKSPACE_ROOT``); the workspace JSON carries
  its ``node`` and ``state``; a route's workspace is looked up through Ray (``locate``);
  ``DELETE`` frees the slot.
- :class:`FrontRegistry`: each call, stream, settings or changelog request goes to the
  workspace's node (:class:`.client.ClusterRegistry`). The routes that take the
  workspace's sandbox or changelog get stand-ins (:class:`RemotePart`) whose methods run
  on the node, and a tunnel of the port proxy is a :class:`.client.RemoteTunnel`. Its
  tools are the nodes' (:class:`.listing.NodeTools`), its catalog a node's, its image
  backend every node's (:mod:`.listing`).
- :class:`.forward.Forwarder` hands the routes only a node can answer to that node's own
  app, and :func:`.forward.fork_route` places forks.

A lost node: :class:`.errors.NodeLostError`, answered 503 with the infrastructure result
(``data.error_kind: "infrastructure"``) by :func:`install`'s handler. Several front doors
may serve one cluster: none holds state of its own beyond caches of what Ray says (calls
to one workspace are ordered per front door, as each service orders its own).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.middleware import Middleware

from sandbox.capabilities import Tunnels
from sandbox.tunnel import Tunnel

from ...registry.table import ToolTable
from ...result import ToolResult
from ...service import WorkspaceInfo, WorkspaceNotFound, Workspaces
from ...settings import Settings
from .client import ClusterRegistry, workspace_id
from .errors import CallInterruptedError, ClusterError, NodeLostError
from .forward import FORWARDED, REFUSED, Forwarder, fork_route, lost_response
from .listing import ClusterImages, NodeCatalog, NodeTools
from .node import SANDBOX


class ClusterWorkspaces(Workspaces):
    """The cluster's workspaces, as the routes use :class:`worker.service.Workspaces`."""

    def __init__(self, cluster: ClusterRegistry) -> None:
        super().__init__(Path("/"))
        self.cluster = cluster

    def ensure_root(self) -> None:
        """Nothing: each node keeps its own root."""

    def path(self, ws_id: str) -> Path:
        """Not offered: a cluster's workspace is found over the network (:meth:`locate`).
        Raises WorkspaceNotFound saying so."""
        raise WorkspaceNotFound(f"Workspace {ws_id!r}: a cluster's workspace is found with locate()")

    async def locate(self, ws_id: str) -> Path:
        return Path(await self.cluster.path(ws_id))

    async def create(self, ws_id: str | None = None) -> WorkspaceInfo:
        ws = await self.cluster.create_workspace(ws_id)
        return WorkspaceInfo(ws.id, ws.path or "", ws.node, ws.state)

    async def list(self) -> list[WorkspaceInfo]:
        return [WorkspaceInfo(w.id, w.path or "", w.node, w.state) for w in await self.cluster.list_workspaces()]

    async def delete_files(self, ws_id: str) -> None:
        await self.cluster.delete_workspace(ws_id, delete_files=True)

    async def release(self, ws_id: str) -> None:
        try:
            await self.cluster.delete_workspace(ws_id)
        except WorkspaceNotFound:
            pass  # delete_files freed it already


class RemotePart:
    """A workspace's sandbox or changelog on its node: each method called on it runs
    there (``workspace_call``); another stand-in's sandbox among the arguments stands
    for the node's own."""

    def __init__(self, cluster: ClusterRegistry, ws_id: str, part: str) -> None:
        self._cluster, self._ws, self._part = cluster, ws_id, part
        #: Read by :func:`worker.http.changelog.is_changelog`.
        self.remote_changelog = part == "recorder"

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(SANDBOX if isinstance(a, RemotePart) and a._part == "sandbox" else a for a in args)
            return await self._cluster.workspace_call(self._ws, self._part, method, *args, **kwargs)

        return call


class RemoteSandbox(RemotePart):
    """A workspace's sandbox on its node. Its capabilities the front door's own routes
    use (the port stream's tunnels) are methods of its own, so that ``isinstance`` with
    their Protocol (:mod:`sandbox.capabilities`) finds them and mypy checks them."""

    def __init__(self, cluster: ClusterRegistry, ws_id: str) -> None:
        super().__init__(cluster, ws_id, "sandbox")

    async def open_tunnel(self, port: int) -> Tunnel:
        """A tunnel to ``port`` on the sandbox's loopback, through its node (see
        ``ClusterRegistry.open_tunnel``)."""
        return await self._cluster.open_tunnel(self._ws, port)


if TYPE_CHECKING:

    def _conforms(box: RemoteSandbox) -> Tunnels:
        return box  # mypy: the stand-in has the capability it is used for


class RemoteWorkspace:
    """What ``registry.workspace(path)`` gives the routes: the stand-ins of its parts."""

    def __init__(self, cluster: ClusterRegistry, path: PurePath) -> None:
        ws_id = workspace_id(path)
        self.root = Path(path)
        self.sandbox = RemoteSandbox(cluster, ws_id)
        self.recorder = RemotePart(cluster, ws_id, "recorder")


class LostCall(NodeLostError):
    """A call whose node was lost, with its infrastructure result (answered 503)."""

    def __init__(self, result: ToolResult, workspace: str, node: str | None) -> None:
        super().__init__(workspace, node)
        self.result = result


class FrontRegistry:
    """The registry the routes, the call runner and the MCP server use, on a cluster."""

    #: Per-workspace settings are kept by each node's registry (the routes check this).
    configs = "each node's"
    journal = None

    def __init__(self, cluster: ClusterRegistry, tools: NodeTools) -> None:
        self.cluster = cluster
        self.node_tools = tools
        #: The vendors' native tools registered with the front door (its MCP's).
        self._native = ToolTable()
        self.egress_observers: list[Callable[..., None]] = []
        #: The image routes' backend: every live node's engine.
        self.backend = ClusterImages(cluster.namespace)
        self._catalog = NodeCatalog(cluster.namespace)

    @property
    def catalog_tools(self) -> NodeCatalog | None:
        """A node's catalog, when the nodes have one (``GET /v1/tools/search``)."""
        return self._catalog if self.node_tools.catalog else None

    # -- tools: the nodes', and the native ones registered here -----------------------------

    @property
    def tools_version(self) -> int:
        # Each only grows: their sum moves with either.
        return self.node_tools.version + self._native.version

    def names(self) -> list[str]:
        return self.node_tools.names() + self._native.names()

    def get(self, name: str) -> Any:
        return self._native.get(name)

    def register(self, tool: Any) -> None:
        """Register a vendor's native tool (``worker.native.install``); its calls have the
        node register it too. Raises ValueError for another tool."""
        self.cluster.register(tool)
        self._native.register(tool)

    def all_schemas(self, fmt: str = "openai", *, native: bool = False) -> list[dict[str, Any]]:
        """The nodes' tools (then, with ``native``, the native ones registered here).
        Raises ValueError for an unknown format."""
        out = self.node_tools.schemas(fmt)
        return out + self._native.all_schemas(fmt, native=True) if native else out

    def subscribe_tools(self, callback: Callable[[], None]) -> Callable[[], None]:
        a, b = self.node_tools.subscribe(callback), self._native.subscribe(callback)

        def unsubscribe() -> None:
            a()
            b()

        return unsubscribe

    # -- calls ------------------------------------------------------------------------------

    async def execute(
        self,
        name: str,
        arguments: Any,
        workspace: PurePath | str | None = None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        on_output: Any = None,
        control: Any = None,
    ) -> ToolResult:
        """The call on the workspace's node. Raises LostCall (a 503) when its node is
        lost, except in a stream (``on_output``), whose last event is then that result."""
        if workspace is None:
            return ToolResult.fail("A cluster's calls need a workspace")
        result = await self.cluster.execute(
            name, arguments, workspace, call_id=call_id, subtask_id=subtask_id, on_output=on_output, control=control
        )
        data = result.data or {}
        if on_output is None and data.get("exception") in ("NodeLostError", "CallInterruptedError"):
            raise LostCall(result, workspace_id(workspace), data.get("node"))
        return result

    async def workspace(self, path: PurePath | str) -> RemoteWorkspace:
        return RemoteWorkspace(self.cluster, PurePath(path))

    async def workspace_settings(self, path: PurePath | str) -> Any:
        return await self.cluster.workspace_settings(path)

    async def configure_workspace(self, path: PurePath | str, changes: dict[str, Any]) -> Any:
        return await self.cluster.configure_workspace(path, changes)

    async def check_settings(self, new: Any, before: Any = None) -> None:
        """Checked by the node when they are stored (``configure_workspace``)."""

    async def egress_status(self, path: PurePath | str, **kwargs: Any) -> Any:
        return await self.cluster.egress_status(path, **kwargs)

    async def stop(self, path: PurePath | str) -> bool:
        try:
            return bool(await self.cluster.stop(path))
        except WorkspaceNotFound:
            return False


async def _lost(_request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ClusterError)
    if isinstance(e, LostCall):
        from ...service import result_dict

        return JSONResponse(result_dict(e.result), status_code=503)
    return lost_response(e)


def install(app: FastAPI) -> None:
    """Answer a lost node (or a call cut from it) with 503 and the infrastructure result,
    on every route."""
    app.add_exception_handler(NodeLostError, _lost)
    app.add_exception_handler(CallInterruptedError, _lost)


def front_door(settings: Settings, address: str, *, namespace: str) -> FastAPI:
    """The service app of ``settings`` whose workspaces are on the Ray cluster at
    ``address`` (connected at startup; raises RayNotConnectedError then)."""
    from ...http import create_app
    from ...http.app import route_table

    cluster = ClusterRegistry(namespace=namespace)

    @asynccontextmanager
    async def registry_factory(_settings: Settings) -> AsyncIterator[FrontRegistry]:
        import asyncio

        await asyncio.to_thread(cluster.open, address)
        try:
            async with NodeTools(namespace).running() as tools:
                yield FrontRegistry(cluster, tools)
        finally:
            await cluster.aclose()

    app = create_app(settings, registry_factory=registry_factory, workspaces=ClusterWorkspaces(cluster))
    install(app)
    handled = FORWARDED | set(REFUSED)
    carried = [r for r in route_table(app) if any((m, getattr(r, "path", None)) in handled for m in _methods(r))]
    # Innermost: after the token and the body limit, before the routes.
    app.user_middleware.append(Middleware(Forwarder, cluster=cluster, routes=carried))
    app.router.routes.insert(0, fork_route(cluster))
    return app


def _methods(route: Any) -> set[str]:
    return set(getattr(route, "methods", None) or ())
