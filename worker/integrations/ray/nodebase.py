"""The node service's core: one node's settings, registry and workspaces (the base of
:class:`.node.NodeService`, the actor; its other parts are :mod:`.nodeapp` and
:mod:`.nodesnap`).

The settings come from the environment ``ray start`` ran with on the node (``LOOM_*``;
Ray's worker processes inherit it), read once, here: this process is the node's entry
point. The registry is :func:`worker.default_registry` of those settings, opened at the
first call, exactly as a local worker has it.

Every call names the workspace by id: its directory is ``<LOOM_WORKSPACE_ROOT>/<id>`` on
this node. The service answers only for the workspaces whose slot is on this node
(:meth:`NodeBase._path`; a workspace deleted from another driver is gone for every
driver at once).
"""

from __future__ import annotations

import asyncio
import os
import socket
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import ray

from ...service import WorkspaceNotFound, Workspaces
from . import gcs


class NodeBase:
    """The loom worker of one Ray node: its registry and the workspaces placed on it."""

    def __init__(self, node_id: str, namespace: str) -> None:
        from ...settings import Settings

        self.node_id = node_id
        self.namespace = namespace
        self.settings = Settings()
        self.workspaces = Workspaces(self.settings.workspace_root, uid=self.settings.uid, gid=self.settings.gid)
        self.workspaces.ensure_root()
        self._stack = AsyncExitStack()
        self._registry: Any = None
        self._open = asyncio.Lock()
        self._hosted: set[str] = set()

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

    def ping(self) -> str:
        """This node's id (a driver asks after its channel broke: is the node there?)."""
        return self.node_id

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
        # A service that restarted has an empty set: Ray's placement group is the truth.
        try:
            found = await asyncio.to_thread(gcs.slot, self.namespace, ws_id)
        except Exception:
            return False
        if found is None or found.node != self.node_id or found.state != "CREATED":
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
