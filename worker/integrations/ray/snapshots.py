"""Snapshots, forks and restore of a cluster's workspaces: :class:`ClusterSnapshots`
(``ClusterRegistry.snapshots``), the methods of :class:`worker.snapshots.Snapshots` with
the workspace given by id, each run on the workspace's node (:mod:`.nodesnap`), whose
store keeps them (under its ``LOOM_DATA_DIR``, beside its workspaces).

A snapshot is found through a workspace: its node holds it. A fork is placed on its
source workspace's node (copy-on-write works only within one filesystem) and becomes a
workspace of the cluster of its own: a slot is held for each on that node first (a node
without enough free slots refuses the fork at once, with :class:`~.errors.ClusterFullError`),
then the node makes them, all or nothing; any driver finds a fork by its id.
"""

from __future__ import annotations

import asyncio
import builtins
import secrets
from pathlib import PurePath
from typing import Any

from ...service import WorkspaceExists, check_workspace_id
from . import gcs, placement
from .errors import ClusterFullError
from .names import RESOURCE
from .workspaces import ClusterWorkspace

Workspace = str | PurePath


class ClusterSnapshots:
    """The snapshots of a cluster's workspaces (see the module docstring). Every method
    raises what :class:`worker.snapshots.Snapshots`'s raises on the node, and
    WorkspaceNotFound, NodeLostError."""

    def __init__(self, cluster: Any) -> None:
        #: The :class:`.client.ClusterRegistry` (which holds this object: not imported here).
        self._cluster = cluster

    async def create(self, workspace: Workspace, name: str | None = None, *, with_scratch: bool = False) -> Any:
        """Snapshot the workspace (its tree, settings, where its changelog stands; with
        ``with_scratch`` its sandbox's ``/tmp`` and ``$HOME``). Returns the Snapshot."""
        return await self._cluster.node_call(workspace, "snapshot_create", name, with_scratch)

    async def list(self, workspace: Workspace) -> builtins.list[Any]:
        """The workspace's snapshots, oldest first."""
        found: builtins.list[Any] = await self._cluster.node_call(workspace, "snapshot_list")
        return found

    async def origin(self, workspace: Workspace) -> Any:
        """The fork record of the workspace (None when it is not a fork)."""
        return await self._cluster.node_call(workspace, "snapshot_origin")

    async def get(self, ref: str, workspace: Workspace) -> Any:
        """A snapshot by id, or by name among the workspace's."""
        return await self._cluster.node_call(workspace, "snapshot_get", ref)

    async def delete(self, ref: str, *, workspace: Workspace, force: bool = False) -> builtins.list[str]:
        """Delete a snapshot's files (its lineage is kept). Returns the live forks it
        leaves. Raises SnapshotInUseError (live forks, without ``force``)."""
        left: builtins.list[str] = await self._cluster.node_call(workspace, "snapshot_delete", ref, force)
        return left

    async def restore(self, workspace: Workspace, ref: str, *, dry_run: bool = False) -> Any:
        """Put the workspace back to snapshot ``ref`` byte for byte, recorded in its
        changelog as one call that undo reverts. Returns the Restored."""
        return await self._cluster.node_call(workspace, "snapshot_restore", ref, dry_run)

    async def fork(
        self,
        ref: str | None,
        count: int = 1,
        *,
        workspace: Workspace,
        names: builtins.list[str] | None = None,
    ) -> builtins.list[ClusterWorkspace]:
        """``count`` new workspaces of the cluster from snapshot ``ref`` of the workspace
        (None: a snapshot of it as it is now, named ``fork-base``), on its node, named
        ``names[i]`` or ``<workspace>-fork-<hex>``. Raises ValueError (count, names),
        ClusterFullError (its node has not ``count`` free slots), WorkspaceExists (a
        name taken), SnapshotNotFoundError."""
        forked = await self.fork_named(ref, count, workspace=workspace, names=names)
        return forked[1]

    async def fork_named(
        self,
        ref: str | None,
        count: int,
        *,
        workspace: Workspace,
        names: builtins.list[str] | None = None,
        name_of: Any = None,
        service_only: bool = False,
    ) -> tuple[str, builtins.list[ClusterWorkspace]]:
        """:meth:`fork`, returning the snapshot's id too; ``name_of(base)`` names one
        fork from the snapshot's workspace's name (the HTTP route's rule), and
        ``service_only`` refuses a snapshot of a directory that is not a workspace."""
        from ...snapshots import MAX_FORKS

        if not 1 <= count <= MAX_FORKS:
            raise ValueError(f"count must be 1 to {MAX_FORKS}")
        if names is not None and len(names) != count:
            raise ValueError("give one name per fork")
        cluster = self._cluster
        cluster._check_namespace()
        ws_id = PurePath(str(workspace)).name
        loc = await cluster._locate(check_workspace_id(ws_id))
        snap, base = await cluster.node_call(ws_id, "fork_source", ref, service_only)
        if names is None:
            make = name_of or (lambda b: f"{b[:40]}-fork-{secrets.token_hex(3)}")
            names = [make(base) for _ in range(count)]
        for n in names:
            check_workspace_id(n)
        free = await asyncio.to_thread(gcs.free_slots, loc.node)
        if free < count:
            raise ClusterFullError(
                f"a fork of workspace {ws_id!r} is made on its node {loc.node} (copy-on-write works only within "
                f"one filesystem), which has {free} free {RESOURCE} slot(s) for {count} fork(s)"
            )
        held = await self._hold(names, loc.node)
        try:
            paths = await cluster._node(ws_id, loc.node, loc.service.fork.remote(snap, names))
        except BaseException:
            await asyncio.gather(*(placement.release(g) for g in held))
            raise
        for p in paths:
            cluster._roots.setdefault(loc.node, str(PurePath(p).parent))
        return snap, [ClusterWorkspace(PurePath(p).name, loc.node, p, "ready") for p in paths]

    async def _hold(self, names: builtins.list[str], node: str) -> builtins.list[str]:
        """A slot on ``node`` for each name (all or none). Returns their group ids.
        Raises WorkspaceExists, ClusterFullError."""
        cluster = self._cluster
        tries = await asyncio.gather(
            *(placement.place(n, node=node, labels=None, timeout=cluster.place_timeout) for n in names),
            return_exceptions=True,
        )
        held = [t[1] for t in tries if isinstance(t, tuple)]
        failed = next((t for t in tries if isinstance(t, BaseException)), None)
        if failed is None:
            return held
        await asyncio.gather(*(placement.release(g) for g in held))
        if isinstance(failed, placement.NameTaken):
            raise WorkspaceExists(f"Workspace {str(failed)!r} already exists") from None
        if isinstance(failed, placement.NotPlaced):
            raise ClusterFullError(f"node {node} did not take {len(names)} fork(s) within {cluster.place_timeout:g}s")
        raise failed
