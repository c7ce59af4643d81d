"""Snapshots, forks and restore on a node (a part of :class:`.node.NodeService`): the node's
own :class:`worker.snapshots.Snapshots` (its store is under the node's ``LOOM_DATA_DIR``,
on the same filesystem as its workspaces, so copy-on-write works), the one its HTTP
service uses too, with that service's per-workspace order: a snapshot or a restore waits
for the workspace's running call as it does on one machine.

A fork is made here, in this node's workspace root, under names the driver chose and
holds slots for (:meth:`.client.ClusterRegistry.fork`): it becomes a workspace of the
cluster, placed on this node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .nodeapp import NodeApp


class NodeSnapshots(NodeApp):
    """The snapshot methods of the node service; each names the workspace by id."""

    async def _snaps(self, ws_id: str) -> tuple[Path, Any, Any]:
        path = await self._path(ws_id)
        service = await self._service()
        return path, service.snapshots, service.runner

    async def snapshot_create(self, ws_id: str, name: str | None = None, with_scratch: bool = False) -> Any:
        """``Snapshots.create`` of the workspace. Raises what it raises."""
        path, snaps, runner = await self._snaps(ws_id)
        async with runner.lock(path):
            return await snaps.shown(await snaps.create(path, name, with_scratch=with_scratch))

    async def snapshot_list(self, ws_id: str) -> Any:
        """``Snapshots.list`` of the workspace, oldest first."""
        path, snaps, _runner = await self._snaps(ws_id)
        return [await snaps.shown(s) for s in await snaps.list(path)]

    async def snapshot_origin(self, ws_id: str) -> Any:
        """``Snapshots.origin``: the snapshot the workspace was forked from, or None."""
        path, snaps, _runner = await self._snaps(ws_id)
        origin = await snaps.origin(path)
        if origin is not None:  # (an overlay fork is named by its directory, not the engine's mountpoint)
            origin.workspace = await snaps.shown_path(origin.workspace)
        return origin

    async def snapshot_get(self, ws_id: str, ref: str) -> Any:
        """``Snapshots.get(ref, workspace)``. Raises SnapshotNotFoundError."""
        path, snaps, _runner = await self._snaps(ws_id)
        return await snaps.shown(await snaps.get(ref, path))

    async def snapshot_delete(self, ws_id: str, ref: str, force: bool = False) -> list[str]:
        """``Snapshots.delete`` of snapshot ``ref`` (a name among the workspace's, or an
        id). Raises SnapshotNotFoundError, SnapshotInUseError."""
        path, snaps, _runner = await self._snaps(ws_id)
        snap = await snaps.get(ref, path)
        left: list[str] = await snaps.delete(snap.id, force=force)
        return left

    async def snapshot_restore(self, ws_id: str, ref: str, dry_run: bool = False) -> Any:
        """``Snapshots.restore`` of the workspace. Raises what it raises."""
        path, snaps, runner = await self._snaps(ws_id)
        async with runner.lock(path):
            return await snaps.restore(path, ref, dry_run=dry_run)

    async def fork_source(self, ws_id: str, ref: str | None, service_only: bool = False) -> tuple[str, str]:
        """The snapshot a fork of the workspace is made from: ``ref`` (a name among its
        snapshots, or an id), or, with None, a new one of it as it is now (named
        ``fork-base``, as ``POST .../fork`` does). With ``service_only`` only a snapshot
        of a workspace of this node's root will do (as the HTTP service's routes say).
        Returns (its id, the name of the workspace it was taken of). Raises
        SnapshotNotFoundError and what creating it raises."""
        path, snaps, runner = await self._snaps(ws_id)
        if ref is None:
            async with runner.lock(path):
                snap = await snaps.create(path, "fork-base")
        else:
            snap = await snaps.shown(await snaps.get(ref, path))
            # (the HTTP routes' rule; Snapshots.fork refuses a deleted one itself)
            if service_only and (snap.deleted is not None or Path(snap.workspace).parent != self.workspaces.root):
                from ...snapshots import SnapshotNotFoundError

                raise SnapshotNotFoundError(f"no snapshot {ref!r}")
        return snap.id, Path(await snaps.shown_path(snap.workspace)).name  # an overlay fork's: its own name

    async def fork(self, snapshot: str, names: list[str]) -> list[str]:
        """``Snapshots.fork`` of ``snapshot`` into this node's workspace root, one fork
        per name (all or nothing). Returns their paths. Raises what it raises."""
        service = await self._service()
        made = await service.snapshots.fork(snapshot, len(names), into=self.workspaces.root, names=names)
        # (an overlay fork's files show while its sandbox runs; stopped at the service's exit)
        service.runner.opened.update(made)
        await service.snapshots.mount_all(made)
        self._hosted.update(names)
        return [str(p) for p in made]
