"""The node service: one detached named actor per Ray node that offers sandboxes, owning
that node's :func:`worker.default_registry` (its Docker engine, data directory,
workspaces, changelogs, egress gateway and fast channels, exactly as a local worker has
them), configured by the environment ``ray start`` ran with on that node (``LOOM_*``;
Ray's worker processes inherit it).

Nobody starts it by hand: the first workspace placed on a node (its slot actor,
:mod:`.placement`) creates it with ``get_if_exists=True``, pinned to that node by
``NodeAffinitySchedulingStrategy(soft=False)``, so concurrent creators end up with the
one actor. Its name is :func:`.names.node_service_name` of the node id.

Every call names the workspace by id: its directory is ``<LOOM_WORKSPACE_ROOT>/<id>`` on
this node. The service answers only for the workspaces placed here (:meth:`adopt`; a
workspace deleted from another driver is gone for every driver at once). The registry's
per-workspace methods are carried by one table, :data:`REGISTRY_METHODS`: a registry
method that takes the workspace's path first is forwarded by adding its name there.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import ray

from ...result import ToolResult
from ...service import WorkspaceNotFound, Workspaces
from ...streaming import ToolOutput
from .names import SLOT_CLASS

#: Registry methods a driver may call on a workspace, each taking the workspace's path
#: first (``registry.<name>(path, *args, **kwargs)``). One line carries a new one (the
#: snapshots' methods, once they exist).
REGISTRY_METHODS = frozenset(
    {
        "workspace_settings",
        "configure_workspace",
        "egress_status",
        "stop",
    }
)

#: The parts of a workspace (:class:`worker.Workspace`) whose methods a driver may call
#: (``workspace_call``): its sandbox and its changelog.
PARTS = frozenset({"sandbox", "recorder"})

#: Stands, in the arguments of a ``workspace_call``, for the workspace's own sandbox (the
#: changelog's ``undo(sandbox, ...)`` and ``diff(sandbox, ...)`` take it).
SANDBOX = "\x00loom:sandbox"


class NodeService:
    """The loom worker of one Ray node (used as a Ray actor; see the module docstring)."""

    def __init__(self, node_id: str, namespace: str) -> None:
        from ...settings import Settings

        self.node_id = node_id
        self.namespace = namespace
        # Read once, here: this process is the node's entry point.
        self.settings = Settings()
        self.workspaces = Workspaces(self.settings.workspace_root, uid=self.settings.uid, gid=self.settings.gid)
        self.workspaces.ensure_root()
        self._stack = AsyncExitStack()
        self._registry: Any = None
        self._open = asyncio.Lock()
        self._hosted: set[str] = set()
        self._tunnels: dict[int, Any] = {}
        self._next_tunnel = 0

    async def _reg(self) -> Any:
        if self._registry is None:
            async with self._open:
                if self._registry is None:
                    from ...registry import default_registry

                    self._registry = await self._stack.enter_async_context(default_registry(self.settings))
        return self._registry

    def info(self) -> dict[str, Any]:
        """Where this node keeps things, and what runs it."""
        from sandbox import __version__

        return {
            "node_id": self.node_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "workspace_root": str(self.workspaces.root),
            "data_dir": str(self.settings.data_dir),
            "runtime": self.settings.runtime,
            "loom_version": __version__,
            "ray_version": ray.__version__,
            "workspaces": sorted(self._hosted),
        }

    # -- the workspaces of this node ------------------------------------------------------

    async def create(self, ws_id: str, settings: dict[str, Any] | None = None) -> str:
        """Make the workspace's directory (and store its own settings, checked first).
        Returns its path. Raises SettingsError, InvalidWorkspaceId, WorkspaceExists."""
        if settings:
            from ...workspace_settings import WorkspaceSettings

            reg = await self._reg()
            await reg.check_settings(WorkspaceSettings(**settings))
        info = await self.workspaces.create(ws_id)
        if settings:
            await (await self._reg()).configure_workspace(info.path, settings)
        self._hosted.add(ws_id)
        return info.path

    async def _path(self, ws_id: str) -> Path:
        """The directory of a workspace placed here. Raises WorkspaceNotFound."""
        if ws_id not in self._hosted and not await self._adopt(ws_id):
            raise WorkspaceNotFound(f"Workspace {ws_id!r} not found")
        return self.workspaces.path(ws_id)

    async def _adopt(self, ws_id: str) -> bool:
        # A service that restarted has an empty set: Ray's named actor is the truth.
        try:
            slot = await asyncio.to_thread(ray.get_actor, ws_id, namespace=self.namespace)
            where = await slot.where.remote()
        except (ValueError, ray.exceptions.RayError):
            return False
        if where.get("node") != self.node_id or where.get("class") != SLOT_CLASS:
            return False
        self._hosted.add(ws_id)
        return True

    async def delete(self, ws_id: str, delete_files: bool = False) -> bool:
        """Stop the workspace's sandbox, forget it, and with ``delete_files`` remove its
        directory. Returns whether a sandbox was running. Raises OSError."""
        path = self.workspaces.root / ws_id
        stopped = False
        if self._registry is not None:
            stopped = bool(await self._registry.stop(path))
        self._hosted.discard(ws_id)
        if delete_files:
            try:
                await self.workspaces.delete_files(ws_id)
            except WorkspaceNotFound:
                pass
        return stopped

    # -- calls ----------------------------------------------------------------------------

    async def execute(
        self, ws_id: str, name: str, arguments: Any, call_id: str | None, subtask_id: str | None
    ) -> ToolResult:
        """One tool call, as ``registry.execute`` runs it (never raises for the call)."""
        path = await self._path(ws_id)
        reg = await self._reg()
        result: ToolResult = await reg.execute(name, arguments, path, call_id=call_id, subtask_id=subtask_id)
        return result

    # 16 chunks in flight at most: the node's registry buffers the rest (worker.streaming).
    @ray.method(num_returns="streaming", _generator_backpressure_num_objects=16)
    async def execute_stream(
        self, ws_id: str, name: str, arguments: Any, call_id: str | None, subtask_id: str | None
    ) -> AsyncIterator[ToolOutput | ToolResult]:
        """``registry.execute_stream``: the output chunks as they come, then the result."""
        path = await self._path(ws_id)
        reg = await self._reg()
        async for item in reg.execute_stream(name, arguments, path, call_id=call_id, subtask_id=subtask_id):
            yield item

    async def call(self, ws_id: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``registry.<method>(path, *args, **kwargs)`` for a method of
        :data:`REGISTRY_METHODS`. Raises ValueError for another name, and what the method
        raises."""
        if method not in REGISTRY_METHODS:
            raise ValueError(f"{method!r} is not a registry method forwarded to nodes")
        path = await self._path(ws_id)
        return await getattr(await self._reg(), method)(path, *args, **kwargs)

    async def workspace_call(
        self, ws_id: str, part: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``workspace.<part>.<method>(*args, **kwargs)`` (``part``: sandbox or recorder),
        with :data:`SANDBOX` in ``args`` standing for the workspace's sandbox. Raises
        ValueError for a part or method not offered, and what the method raises."""
        if part not in PARTS or method.startswith("_"):
            raise ValueError(f"{part}.{method} is not offered to drivers")
        ws = await (await self._reg()).workspace(await self._path(ws_id))
        target = getattr(getattr(ws, part), method)
        args = tuple(ws.sandbox if a == SANDBOX else a for a in args)
        out = target(*args, **kwargs)
        return await out if asyncio.iscoroutine(out) else out

    # -- tunnels (the port proxy of a front door on another node) --------------------------

    async def tunnel_open(self, ws_id: str, port: int) -> int:
        """Open a tunnel to ``port`` on the sandbox's loopback; its id. Raises AgentError
        (``connection_refused``: nothing listens), SandboxError."""
        ws = await (await self._reg()).workspace(await self._path(ws_id))
        tunnel = await ws.sandbox.open_tunnel(port)
        self._next_tunnel += 1
        self._tunnels[self._next_tunnel] = tunnel
        return self._next_tunnel

    def _tunnel(self, tid: int) -> Any:
        from sandbox.errors import TunnelClosedError

        tunnel = self._tunnels.get(tid)
        if tunnel is None:
            raise TunnelClosedError(f"tunnel {tid} is closed")
        return tunnel

    async def tunnel_read(self, tid: int) -> bytes:
        data: bytes = await self._tunnel(tid).read()
        return data

    async def tunnel_write(self, tid: int, data: bytes) -> None:
        await self._tunnel(tid).write(data)

    async def tunnel_write_eof(self, tid: int) -> None:
        await self._tunnel(tid).write_eof()

    async def tunnel_error(self, tid: int) -> str | None:
        tunnel = self._tunnels.get(tid)
        return None if tunnel is None else tunnel.error

    async def tunnel_close(self, tid: int) -> None:
        tunnel = self._tunnels.pop(tid, None)
        if tunnel is not None:
            await tunnel.close()

    # -- operations -----------------------------------------------------------------------

    async def metrics(self) -> dict[str, Any]:
        """This node's numbers: workspaces placed, sandboxes open, their restarts, tunnels."""
        reg = self._registry
        backend = None if reg is None else reg.backend
        return {
            "node_id": self.node_id,
            "workspaces": len(self._hosted),
            "sandboxes_open": 0 if reg is None else len(reg.pool.opened()),
            "sandbox_restarts": getattr(backend, "restarts", 0),
            "tunnels_open": len(self._tunnels),
        }

    async def gc(self) -> list[str]:
        """``loom-worker gc`` on this node: remove its exited sandboxes, those of vanished
        workspaces and of other worker versions. Returns the containers removed. Raises
        SandboxUnavailableError."""
        from sandbox.docker import DockerBackend
        from sandbox.spec import SandboxSpec

        backend = DockerBackend(SandboxSpec(**self.settings.sandbox_spec_kwargs()), base_url=self.settings.docker_host)
        try:
            removed: list[str] = await backend.gc()
        finally:
            await backend.aclose()
        return removed

    async def shutdown(self) -> None:
        """Close the registry (the node's sandboxes keep running, as a stopped worker's do)."""
        for tid in list(self._tunnels):
            await self.tunnel_close(tid)
        await self._stack.aclose()
        self._registry = None


#: The actor class (``num_cpus=0``: it waits on sandboxes, it does not compute).
NodeServiceActor = ray.remote(num_cpus=0, max_restarts=0)(NodeService)
