"""The service's front door on a cluster (``loom-worker serve --ray ADDRESS``): the same app
(:func:`worker.http.create_app`: HTTP, MCP, dashboard, the same token and settings), with
the registry and the workspaces replaced by cluster-backed objects implementing what the
routes use.

- :class:`ClusterWorkspaces`: ``POST /v1/workspaces`` places the workspace on a node
  (its ``path`` is under that node's ``LOOM_WORKSPACE_ROOT``); the workspace JSON carries
  its ``node`` and ``state``; a route's workspace is looked up through Ray (``locate``);
  ``DELETE`` frees the slot.
- :class:`FrontRegistry`: each call, stream, settings or changelog request goes to the
  workspace's node (:class:`.client.ClusterRegistry`). The routes that take the
  workspace's sandbox or changelog get stand-ins (:class:`RemotePart`) whose methods run
  on the node, and a tunnel of the port proxy is a :class:`.client.RemoteTunnel`: its
  bytes flow as actor calls to the node service, so a front door reaches any node over
  Ray's own connections, with no port of a node's loopback opened to the network.

A lost node: :class:`.errors.NodeLostError`, answered 503 with the infrastructure result
(``data.error_kind: "infrastructure"``) by :func:`install`'s handler. Several front doors
may serve one cluster: none holds state of its own beyond caches of what Ray says (calls
to one workspace are ordered per front door, as each service orders its own).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path, PurePath
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...registry.table import ToolTable
from ...result import ToolResult
from ...service import WorkspaceInfo, WorkspaceNotFound, Workspaces, result_dict
from ...settings import Settings
from ...tools import builtin_tools
from .client import ClusterRegistry, infrastructure_result, workspace_id
from .errors import NodeLostError
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
        Raises WorkspaceNotFound saying so (the routes that need it, the secrets', keep
        their data on each node)."""
        raise WorkspaceNotFound(
            f"Workspace {ws_id!r}: this route is not served by a cluster's front door (set it on the node)"
        )

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
        if self._part == "sandbox" and method == "open_tunnel":
            return lambda port: self._cluster.open_tunnel(self._ws, port)

        async def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(SANDBOX if isinstance(a, RemotePart) and a._part == "sandbox" else a for a in args)
            return await self._cluster.workspace_call(self._ws, self._part, method, *args, **kwargs)

        return call


class RemoteWorkspace:
    """What ``registry.workspace(path)`` gives the routes: the stand-ins of its parts."""

    def __init__(self, cluster: ClusterRegistry, path: PurePath) -> None:
        ws_id = workspace_id(path)
        self.root = Path(path)
        self.sandbox = RemotePart(cluster, ws_id, "sandbox")
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
    backend = None
    journal = None
    catalog_tools = None

    def __init__(self, cluster: ClusterRegistry) -> None:
        self.cluster = cluster
        # The front door lists the built-in tools; the calls run with each node's registry.
        self.table = ToolTable(builtin_tools())
        self.egress_observers: list[Callable[..., None]] = []

    @property
    def tools_version(self) -> int:
        return self.table.version

    def names(self) -> list[str]:
        return self.table.names()

    @property
    def tools(self) -> list[Any]:
        return self.table.tools

    def get(self, name: str) -> Any:
        return self.table.get(name)

    def all_schemas(self, fmt: str = "openai") -> list[dict[str, Any]]:
        return self.table.all_schemas(fmt)

    def tools_for_subtask(self, subtask: object, fmt: str = "openai") -> list[dict[str, Any]]:
        return self.table.tools_for_subtask(subtask, fmt)

    def subscribe_tools(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self.table.subscribe(callback)

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
        if on_output is None and data.get("exception") == "NodeLostError":
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
    assert isinstance(e, NodeLostError)
    result = e.result if isinstance(e, LostCall) else infrastructure_result(e)
    return JSONResponse(result_dict(result), status_code=503)


def install(app: FastAPI) -> None:
    """Answer a lost node with 503 and the infrastructure result, on every route."""
    app.add_exception_handler(NodeLostError, _lost)


def front_door(settings: Settings, address: str, *, namespace: str) -> FastAPI:
    """The service app of ``settings`` whose workspaces are on the Ray cluster at
    ``address`` (connected at startup; raises RayNotConnectedError then)."""
    from ...http import create_app

    cluster = ClusterRegistry(namespace=namespace)

    @asynccontextmanager
    async def registry_factory(_settings: Settings) -> AsyncIterator[FrontRegistry]:
        import asyncio

        await asyncio.to_thread(cluster.open, address)
        try:
            yield FrontRegistry(cluster)
        finally:
            await cluster.aclose()

    app = create_app(settings, registry_factory=registry_factory, workspaces=ClusterWorkspaces(cluster))
    install(app)
    return app
