"""The workspaces of a node's own service app (:mod:`.nodeapp`), for the routes that
create and release workspaces there: E2B's control plane (``POST /v2/sandboxes``, a
sandbox killed), carried whole to the node a front door chose, so that the sandbox's
record is made where its other requests are answered.

A workspace is a workspace of the cluster when it holds a slot (:mod:`.placement`: a named
placement group pinned to its node; nothing of loom's own records where a workspace is).
So :meth:`SlotWorkspaces.create` holds one on this node, named by the new workspace's id,
before it makes the directory, and :meth:`SlotWorkspaces.release` frees it: every driver
and front door then finds the workspace here, and lists it, as one that a driver placed.

Why the node places the slot, not the front door: the workspace's id is chosen by the
route that creates it (E2B's control plane names its sandboxes), here. The front door
chose this node with Ray's scheduler (:func:`.placement.choose`); when another driver took
the node's last free slot in between, the pinned slot waits for one to be freed, up to the
place timeout, then :class:`~.errors.ClusterFullError` (a limit, not an infrastructure
failure).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING

import ray

from ...service import WorkspaceExists, WorkspaceInfo, Workspaces, check_workspace_id
from . import gcs, placement
from .errors import ClusterError, ClusterFullError
from .names import RESOURCE

if TYPE_CHECKING:
    from .nodebase import NodeBase

#: Seconds a slot pinned to this node may wait for a free one.
PLACE_TIMEOUT = 30.0


class SlotWorkspaces(Workspaces):
    """The node's workspace root, each workspace its routes create holding a slot on this
    node (see the module docstring)."""

    def __init__(self, node: NodeBase, *, place_timeout: float = PLACE_TIMEOUT) -> None:
        super().__init__(node.workspaces.root, uid=node.settings.uid, gid=node.settings.gid)
        self.node = node
        self.place_timeout = place_timeout

    async def create(self, ws_id: str | None = None) -> WorkspaceInfo:
        """Hold a slot on this node for a new workspace, then make its directory (a random
        id when None). Raises InvalidWorkspaceId, WorkspaceExists, ClusterFullError (no
        free slot here within the place timeout), ClusterError (this node's service runs
        in another namespace than its deployment's)."""
        ws_id = check_workspace_id(ws_id) if ws_id is not None else "ws-" + secrets.token_hex(6)
        current = ray.get_runtime_context().namespace
        if current != self.node.namespace:
            # Ray names a placement group in its creator's namespace: a slot made in another
            # would be found by no driver of the deployment.
            raise ClusterError(
                f"this node's service runs in Ray namespace {current!r}, not its deployment's "
                f"{self.node.namespace!r}: it cannot hold slots for it"
            )
        try:
            _node, group = await placement.place(ws_id, node=self.node.node_id, labels=None, timeout=self.place_timeout)
        except placement.NameTaken:
            raise WorkspaceExists(f"Workspace {ws_id!r} already exists") from None
        except placement.NotPlaced:
            raise ClusterFullError(
                f"node {self.node.node_id} has no free {RESOURCE} slot for workspace {ws_id!r} (taken since this "
                f"node was chosen, none freed within {self.place_timeout:g}s); try again"
            ) from None
        try:
            info = await super().create(ws_id)
        except BaseException:
            await placement.release(group)
            raise
        self.node._hosted.add(ws_id)
        return info

    async def list(self) -> list[WorkspaceInfo]:
        """The workspaces holding a slot on this node (a directory left after its
        workspace was deleted without its files is not one: no driver finds it)."""
        records = await asyncio.to_thread(gcs.slots, self.node.namespace)
        held = {r.name for r in records if r.node == self.node.node_id and r.state == "CREATED"}
        return [info for info in await super().list() if info.id in held]

    async def release(self, ws_id: str) -> None:
        """Free the workspace's slot (when it holds one on this node); its directory
        stays (:meth:`delete_files` removes it)."""
        self.node._hosted.discard(ws_id)
        found = await asyncio.to_thread(gcs.slot, self.node.namespace, ws_id)
        if found is not None and found.node == self.node.node_id:
            await placement.release(found.group_id)

    async def delete_files(self, ws_id: str) -> None:
        """Remove the workspace's directory, and free its slot. Raises InvalidWorkspaceId,
        WorkspaceNotFound, OSError."""
        await super().delete_files(ws_id)
        await self.release(ws_id)
