"""Where a cluster's workspaces are: placing a workspace on a node with a free slot, finding
it by id from any driver, listing and deleting them (:class:`Placements`, the base of
:class:`.client.ClusterRegistry`).

A workspace is named by its id (a path is accepted too: its last component is the id, as
the front door's paths are ``<node's LOOM_WORKSPACE_ROOT>/<id>``). Finding it asks its slot
actor where it is (:mod:`.placement`), once: what this process remembers of a workspace
(its node, its node service's handle) is a cache of what Ray says, dropped on any failure.
A workspace whose node died is ``lost``: Ray's actor table keeps its dead slot, with why it
died and its last node (:mod:`.gcs`).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import PurePath
from types import TracebackType
from typing import Any, Self

import ray
from ray.exceptions import RayActorError, RayTaskError

from ...service import WorkspaceExists, WorkspaceNotFound, check_workspace_id
from . import gcs
from .errors import ClusterFullError, NodeLostError, RayNotConnectedError
from .names import DEFAULT_NAMESPACE, RESOURCE
from .placement import new_slot, node_service


@dataclass(frozen=True)
class ClusterWorkspace:
    """A workspace of the cluster: its id, Ray's id of its node, its directory there, and
    its state (``ready``, or ``lost`` when its node died; ``path`` is then the last known
    one, None when this process never knew it)."""

    id: str
    node: str | None
    path: str | None
    state: str


@dataclass(frozen=True)
class _Loc:
    node: str
    path: str
    service: Any  # the node service's actor handle
    slot: Any


def workspace_id(workspace: str | PurePath) -> str:
    """The id of a workspace given by id or by path. Raises InvalidWorkspaceId."""
    text = str(workspace)
    return check_workspace_id(PurePath(text).name if "/" in text else text)


def _cause(e: RayTaskError) -> BaseException:
    """What the node raised, as it raised it (Ray wraps it)."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


class Placements:
    """The workspaces of a Ray cluster: placing, finding and deleting them, and the
    connection to the cluster (the calls: :class:`.client.ClusterRegistry`, built on it).

    Make one with :meth:`connect` (``ray.init`` unless this process already is connected)
    and use it as ``async with``. ``namespace`` is the Ray namespace of loom's actors (the
    same for every driver of one deployment); ``place_timeout`` how long a new workspace
    may wait for a free slot before :class:`~.errors.ClusterFullError`."""

    def __init__(self, *, namespace: str = DEFAULT_NAMESPACE, place_timeout: float = 30.0) -> None:
        self.namespace = namespace
        self.place_timeout = place_timeout
        self._locs: dict[str, _Loc] = {}
        self._last_node: dict[str, tuple[str, str | None]] = {}
        self._owns_ray = False

    @classmethod
    def connect(
        cls, address: str | None = None, *, namespace: str = DEFAULT_NAMESPACE, place_timeout: float = 30.0
    ) -> Self:
        """Connect to the cluster at ``address`` (``ray.init``'s: ``auto``, ``HOST:PORT``,
        ``ray://...``) unless Ray is connected already. Raises RayNotConnectedError."""
        self = cls(namespace=namespace, place_timeout=place_timeout)
        self.open(address)
        return self

    def open(self, address: str | None = None) -> None:
        """Connect this process to the cluster at ``address`` unless it is connected
        already (blocking). Raises RayNotConnectedError."""
        if ray.is_initialized():
            return
        try:
            # The library configures no logging and prints nothing of the workers'.
            ray.init(address=address, namespace=self.namespace, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RayNotConnectedError(f"cannot connect to the Ray cluster at {address!r}: {e}") from e
        self._owns_ray = True

    async def aclose(self) -> None:
        """Forget the cached locations; disconnect from Ray if :meth:`connect` connected."""
        self._locs.clear()
        if self._owns_ray:
            self._owns_ray = False
            await asyncio.to_thread(ray.shutdown)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- workspaces -----------------------------------------------------------------------

    async def create_workspace(
        self,
        name: str | None = None,
        *,
        settings: dict[str, Any] | None = None,
        node: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> ClusterWorkspace:
        """Place a new workspace on a node with a free slot (Ray's scheduler decides;
        ``node`` (Ray's node id) or ``labels`` (node labels) pin it) and create its
        directory under that node's ``LOOM_WORKSPACE_ROOT``, with its own ``settings``
        (checked first). Raises ClusterFullError, WorkspaceExists, InvalidWorkspaceId,
        SettingsError."""
        ws_id = check_workspace_id(name) if name is not None else "ws-" + secrets.token_hex(6)
        if name is not None and await self._exists(ws_id):
            raise WorkspaceExists(f"Workspace {ws_id!r} already exists")
        if node is None and not labels and not await self._has_free_slot():
            total = (await asyncio.to_thread(ray.cluster_resources)).get(RESOURCE, 0)
            raise ClusterFullError(
                f"no node has a free {RESOURCE} slot (the cluster has {int(total)}, all held); "
                "delete a workspace or add a node"
            )
        try:
            slot = await asyncio.to_thread(new_slot, ws_id, self.namespace, node=node, labels=labels)
        except ValueError as e:
            raise WorkspaceExists(f"Workspace {ws_id!r} already exists") from e
        try:
            where = await asyncio.wait_for(slot.place.remote(settings), self.place_timeout)
        except TimeoutError:
            ray.kill(slot)
            pin = f" on node {node}" if node else f" with labels {labels}" if labels else ""
            raise ClusterFullError(
                f"no node{pin} took workspace {ws_id!r} within {self.place_timeout:g}s: every {RESOURCE} slot is held"
                + (" or no node matches" if pin else "")
            ) from None
        except RayTaskError as e:
            ray.kill(slot)
            raise _cause(e) from None
        except BaseException:
            ray.kill(slot)
            raise
        self._last_node[ws_id] = (where["node"], where["path"])
        return ClusterWorkspace(ws_id, where["node"], where["path"], "ready")

    async def _exists(self, ws_id: str) -> bool:
        try:
            await asyncio.to_thread(ray.get_actor, ws_id, namespace=self.namespace)
            return True
        except ValueError:
            return False

    async def _has_free_slot(self) -> bool:
        # Ray's view of free resources follows a freed slot within a moment (it is
        # broadcast from the nodes): look again for a few seconds before refusing.
        for _ in range(15):
            if (await asyncio.to_thread(ray.available_resources)).get(RESOURCE, 0) >= 1:
                return True
            await asyncio.sleep(0.2)
        return False

    async def get_workspace(self, workspace: str | PurePath) -> ClusterWorkspace:
        """The workspace, ``ready`` or ``lost``. Raises WorkspaceNotFound."""
        ws_id = workspace_id(workspace)
        try:
            loc = await self._locate(ws_id)
        except NodeLostError as e:
            return ClusterWorkspace(ws_id, e.node, self._last_node.get(ws_id, (None, None))[1], "lost")
        if not await asyncio.to_thread(gcs.node_alive, loc.node):
            self._locs.pop(ws_id, None)
            return ClusterWorkspace(ws_id, loc.node, loc.path, "lost")
        return ClusterWorkspace(ws_id, loc.node, loc.path, "ready")

    async def list_workspaces(self) -> list[ClusterWorkspace]:
        """Every workspace of the namespace, the lost ones too (while Ray's actor table
        keeps them), sorted by id."""
        records = await asyncio.to_thread(gcs.actors, self.namespace)
        roots = await self._node_roots({r.node for r in records if r.state == "ALIVE" and r.node})
        alive = {r.name: r for r in records if r.state == "ALIVE"}
        out = {
            name: ClusterWorkspace(name, r.node, _join(roots.get(r.node or ""), name), "ready")
            for name, r in alive.items()
        }
        for r in records:
            if r.state == "DEAD" and r.death_reason == "NODE_DIED" and r.name not in out:
                out[r.name] = ClusterWorkspace(r.name, r.node, self._last_node.get(r.name, (None, None))[1], "lost")
        return [out[k] for k in sorted(out)]

    async def _node_roots(self, node_ids: set[str]) -> dict[str, str]:
        async def root(node_id: str) -> tuple[str, str | None]:
            try:
                service = await asyncio.to_thread(node_service, node_id, self.namespace)
                return node_id, (await service.info.remote())["workspace_root"]
            except (RayActorError, RayTaskError):
                return node_id, None

        found = await asyncio.gather(*(root(n) for n in node_ids))
        return {n: r for n, r in found if r is not None}

    async def delete_workspace(self, workspace: str | PurePath, *, delete_files: bool = False) -> dict[str, Any]:
        """Stop its sandbox, free its slot (and with ``delete_files`` remove its
        directory). Returns ``{"id", "sandbox_stopped", "files_deleted"}``. Raises
        WorkspaceNotFound, NodeLostError (its node is gone: nothing to free)."""
        ws_id = workspace_id(workspace)
        loc = await self._locate(ws_id)
        stopped = await self._node(ws_id, loc, loc.service.delete.remote(ws_id, delete_files))
        self._locs.pop(ws_id, None)
        ray.kill(loc.slot)
        try:  # the kill is asynchronous: wait until Ray has freed the slot and the name
            await asyncio.wait_for(loc.slot.where.remote(), 30)
        except (RayActorError, TimeoutError):
            pass
        return {"id": ws_id, "sandbox_stopped": stopped, "files_deleted": delete_files}

    async def _locate(self, ws_id: str) -> _Loc:
        loc = self._locs.get(ws_id)
        if loc is not None:
            return loc
        try:
            slot = await asyncio.to_thread(ray.get_actor, ws_id, namespace=self.namespace)
        except ValueError:
            lost = await asyncio.to_thread(gcs.lost_workspace, self.namespace, ws_id)
            if lost is not None:
                raise NodeLostError(ws_id, lost.node, "Ray reports its node dead") from None
            raise WorkspaceNotFound(f"Workspace {ws_id!r} not found") from None
        try:
            where = await slot.where.remote()
        except RayActorError as e:
            raise NodeLostError(ws_id, self._last_node.get(ws_id, (None, None))[0], _short(e)) from None
        if where["path"] is None:  # still being placed by another driver
            raise WorkspaceNotFound(f"Workspace {ws_id!r} is not placed yet")
        service = await asyncio.to_thread(node_service, where["node"], self.namespace)
        loc = _Loc(where["node"], where["path"], service, slot)
        self._locs[ws_id] = loc
        self._last_node[ws_id] = (loc.node, loc.path)
        return loc

    async def _node(self, ws_id: str, loc: _Loc, call: Awaitable[Any]) -> Any:
        """Await a call to ``loc``'s node service: what the node raised is raised as it
        was; a dead or unreachable node is NodeLostError."""
        try:
            return await call
        except RayTaskError as e:
            raise _cause(e) from None
        except RayActorError as e:
            self._locs.pop(ws_id, None)
            raise NodeLostError(ws_id, loc.node, _short(e)) from None

    async def path(self, workspace: str | PurePath) -> str:
        """The workspace's directory on its node. Raises WorkspaceNotFound, NodeLostError."""
        return (await self._locate(workspace_id(workspace))).path

    async def node_of(self, workspace: str | PurePath) -> str:
        """Ray's id of the workspace's node. Raises WorkspaceNotFound, NodeLostError."""
        return (await self._locate(workspace_id(workspace))).node

    # -- calls ----------------------------------------------------------------------------


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def _join(root: str | None, name: str) -> str | None:
    return None if root is None else f"{root.rstrip('/')}/{name}"
