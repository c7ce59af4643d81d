"""The service's front door on a cluster (``loom-worker serve --ray ADDRESS``): the same app
(:func:`worker.http.create_app`: HTTP, MCP, dashboard, the same token and settings) that
routes, rather than serving workspaces itself.

- Every request under a workspace goes whole to the workspace's node, whose own app
  answers it (:class:`.forward.Forwarder`, given to ``create_app`` as its innermost
  middleware; the rule and its few exceptions: :func:`.forward.carried`).
- What spans the nodes is served here: :class:`ClusterWorkspaces` places a workspace on a
  node (``POST /v1/workspaces``; its ``path`` is under that node's
  ``LOOM_WORKSPACE_ROOT``, its JSON carries its ``node`` and ``state``), lists them all and
  deletes one (freeing its slot); :class:`FrontRegistry` lists the tools every node runs
  and searches a node's catalog (:mod:`.listing`), pulls images on every node, opens the
  port proxy's tunnels to a node's sandbox; :func:`.forward.fork_route` places forks.

:class:`FrontRegistry` is a :class:`worker.registry.contract.ServiceRegistry` with the
capabilities it has (:class:`~worker.registry.contract.SearchesCatalog`,
:class:`~worker.registry.contract.HasImages`, :class:`~worker.registry.contract.OpensTunnels`)
and not :class:`~worker.registry.contract.HoldsWorkspaces`: no route needing a workspace's
parts runs here.

A lost node: :class:`.errors.NodeLostError`, answered 503 with the infrastructure result
(``data.error_kind: "infrastructure"``). Several front doors may serve one cluster: none
holds state of its own beyond caches of what Ray says.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.middleware import Middleware

from sandbox.base import ExecControl, OutputCallback

from ...http.errors import Handlers
from ...registry.table import ToolTable
from ...result import ToolResult
from ...service import WorkspaceInfo, WorkspaceNotFound, Workspaces
from ...settings import Settings
from ...tool import Tool
from ...workspace_settings import WorkspaceSettings
from .client import ClusterRegistry, RemoteTunnel
from .e2bfront import E2BFront
from .errors import CallInterruptedError, ClusterError, NodeLostError
from .forward import Forwarder, fork_route
from .listing import ClusterImages, NodeCatalog, NodeTools
from .relay import lost_response

if TYPE_CHECKING:
    from ...registry.contract import HasImages, OpensTunnels, SearchesCatalog, ServiceRegistry
    from ...registry.execution import Arguments


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

    async def create_configured(self, ws_id: str | None, settings: WorkspaceSettings) -> WorkspaceInfo:
        """Place a workspace with its own settings, checked on its node before it is
        handed out. Raises SettingsError, WorkspaceExists, ClusterFullError."""
        ws = await self.cluster.create_workspace(ws_id, settings=settings.set_fields())
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


class FrontRegistry:
    """The registry of a cluster's front door (see the module docstring)."""

    def __init__(self, cluster: ClusterRegistry, tools: NodeTools) -> None:
        self.cluster = cluster
        self.node_tools = tools
        #: The vendors' native tools registered with the front door (its ``/v1/native/tools``).
        self._native = ToolTable()
        #: The image routes' engines: every live node's.
        self.images = ClusterImages(cluster.namespace)
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

    def get(self, name: str) -> Tool | None:
        return self._native.get(name)

    def register(self, tool: Tool) -> None:
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

    # -- a workspace's calls, its sandbox, its port ------------------------------------------

    async def execute(
        self,
        name: str,
        arguments: Arguments,
        workspace: Path | str | None = None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ToolResult:
        """The call on the workspace's node (a lost node is an infrastructure result)."""
        if workspace is None:
            return ToolResult.fail("A cluster's calls need a workspace")
        args = dict(arguments) if isinstance(arguments, Mapping) else arguments
        return await self.cluster.execute(
            name, args, workspace, call_id=call_id, subtask_id=subtask_id, on_output=on_output, control=control
        )

    async def stop(self, path: Path | str) -> bool:
        try:
            return bool(await self.cluster.stop(path))
        except WorkspaceNotFound:
            return False

    async def open_tunnel(self, path: Path | str, port: int) -> RemoteTunnel:
        """A tunnel to ``port`` of the workspace's sandbox, on its node. Raises AgentError
        (``connection_refused``), SandboxError, NodeLostError."""
        return await self.cluster.open_tunnel(PurePath(path), port)


def _contract(r: FrontRegistry) -> tuple[ServiceRegistry, SearchesCatalog, HasImages, OpensTunnels]:
    """(Never called: mypy checks the front door against the service's contract here.)"""
    return r, r, r, r


async def _lost(_request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ClusterError)
    return lost_response(e)


#: A lost node (or a call cut from it), on every route: 503 with the infrastructure result.
HANDLERS: Handlers = {NodeLostError: _lost, CallInterruptedError: _lost}


def front_door(settings: Settings, address: str, *, namespace: str, e2b: list[Any] | None = None) -> FastAPI:
    """The service app of ``settings`` whose workspaces are on the Ray cluster at
    ``address`` (connected at startup; raises RayNotConnectedError then), with E2B's
    routes ``e2b`` (None: as ``serve`` mounts them, ``worker.cli.service.e2b_routes``;
    [] : none), carried to the nodes (:mod:`.e2bfront`)."""
    from ...http import create_app

    if e2b is None:
        from ...cli.service import e2b_routes

        e2b = e2b_routes(settings) or []
    cluster = ClusterRegistry(namespace=namespace)
    e2b_front = E2BFront(cluster) if e2b else None

    @asynccontextmanager
    async def registry_factory(_settings: Settings) -> AsyncIterator[FrontRegistry]:
        import asyncio

        await asyncio.to_thread(cluster.open, address)
        try:
            async with NodeTools(namespace).running() as tools:
                yield FrontRegistry(cluster, tools)
        finally:
            await cluster.aclose()

    return create_app(
        settings,
        registry_factory=registry_factory,
        workspaces=ClusterWorkspaces(cluster),
        routes=[fork_route(cluster), *(e2b_front.routes() + e2b if e2b_front else [])],
        middleware=[Middleware(Forwarder, cluster=cluster, e2b=e2b_front)],
        exception_handlers=HANDLERS,
    )
