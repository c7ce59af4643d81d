"""Where a cluster's workspaces are: placing a workspace on a node with a free slot, finding
it by id from any driver, listing and deleting them (:class:`Placements`, the base of
:class:`.client.ClusterRegistry`).

A workspace is named by its id (a path is accepted too: its last component is the id, as
the front door's paths are ``<node's LOOM_WORKSPACE_ROOT>/<id>``). Its slot is a named
placement group pinned to its node (:mod:`.placement`); finding it reads that group in
Ray's control store, once: what this process remembers of a workspace (its node, its node
service's handle, that node's workspace root) is a cache of what Ray says, dropped on any
failure. A workspace whose node died is ``lost``: its group stays, unplaced, pinned to
the dead node.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import PurePath
from types import TracebackType
from typing import Any, Self

import ray
from ray.exceptions import RayActorError, RayTaskError

from ...service import WorkspaceExists, WorkspaceNotFound, check_workspace_id
from . import gcs, placement
from .errors import ClusterError, ClusterFullError, NodeLostError, RayNotConnectedError
from .names import DEFAULT_NAMESPACE, RESOURCE
from .node import node_service


@dataclass(frozen=True)
class ClusterWorkspace:
    """A workspace of the cluster: its id, Ray's id of its node, its directory there, and
    its state (``ready``, or ``lost`` when its node died; ``path`` is then the last known
    one, None when this process never knew that node's root)."""

    id: str
    node: str | None
    path: str | None
    state: str


@dataclass(frozen=True)
class _Loc:
    node: str
    path: str
    service: Any  # the node service's actor handle
    group: str  # the slot's placement group (hex id)


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
    and use it as ``async with``. ``namespace`` is the Ray namespace of loom's actors and
    slots (the same for every driver of one deployment; a driver creating workspaces is
    connected in it, as Ray creates a placement group in its driver's namespace);
    ``place_timeout`` how long a new workspace may wait for a free slot before
    :class:`~.errors.ClusterFullError`."""

    def __init__(self, *, namespace: str = DEFAULT_NAMESPACE, place_timeout: float = 30.0) -> None:
        self.namespace = namespace
        self.place_timeout = place_timeout
        self._locs: dict[str, _Loc] = {}
        self._services: dict[str, Any] = {}
        self._roots: dict[str, str] = {}
        self._owns_ray = False

    @classmethod
    def connect(
        cls,
        address: str | None = None,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        place_timeout: float = 30.0,
        **options: Any,
    ) -> Self:
        """Connect to the cluster at ``address`` (``ray.init``'s: ``auto``, ``HOST:PORT``,
        not a Ray Client ``ray://`` one: a driver reads Ray's placement-group table) unless
        Ray is connected already; ``options`` are the class's own (``direct``). Raises
        RayNotConnectedError."""
        self = cls(namespace=namespace, place_timeout=place_timeout, **options)
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
        SettingsError, ClusterError (this process is connected in another namespace)."""
        ws_id = check_workspace_id(name) if name is not None else "ws-" + secrets.token_hex(6)
        self._check_namespace()
        if name is not None and await self._exists(ws_id):
            raise WorkspaceExists(f"Workspace {ws_id!r} already exists")
        if node is None and not labels and not await self._has_free_slot():
            raise await self._full()
        where, group = await self._place(ws_id, node=node, labels=labels)
        try:
            service = await self._service(where)
            path: str = await self._node(ws_id, where, service.create.remote(ws_id, settings))
        except BaseException:
            await placement.release(group)
            raise
        self._roots.setdefault(where, str(PurePath(path).parent))
        return ClusterWorkspace(ws_id, where, path, "ready")

    async def choose_node(self) -> str:
        """The node a new workspace is placed on now (Ray's scheduler chooses, as for
        :meth:`create_workspace`), for a caller that has the node make the workspace
        itself (E2B's create: :mod:`.nodeslots`). Nothing is held. Raises
        ClusterFullError, ClusterError (this process is connected in another namespace)."""
        self._check_namespace()
        if not await self._has_free_slot():
            raise await self._full()
        try:
            return await placement.choose(None, self.place_timeout)
        except placement.NotPlaced:
            raise await self._full() from None

    async def _full(self) -> ClusterFullError:
        total = (await asyncio.to_thread(ray.cluster_resources)).get(RESOURCE, 0)
        return ClusterFullError(
            f"no node has a free {RESOURCE} slot (the cluster has {int(total)}, all held); "
            "delete a workspace or add a node"
        )

    async def _place(self, ws_id: str, *, node: str | None, labels: dict[str, str] | None) -> tuple[str, str]:
        """Raises WorkspaceExists, ClusterFullError."""
        try:
            return await placement.place(ws_id, node=node, labels=labels, timeout=self.place_timeout)
        except placement.NameTaken:
            raise WorkspaceExists(f"Workspace {ws_id!r} already exists") from None
        except placement.NotPlaced:
            pin = f" on node {node}" if node else f" with labels {labels}" if labels else ""
            raise ClusterFullError(
                f"no node{pin} took workspace {ws_id!r} within {self.place_timeout:g}s: every {RESOURCE} slot is held"
                + (" or no node matches" if pin else "")
            ) from None

    def _check_namespace(self) -> None:
        current = ray.get_runtime_context().namespace
        if current != self.namespace:
            raise ClusterError(
                f"this process is connected to Ray in namespace {current!r}, and workspaces of namespace "
                f"{self.namespace!r} are placed by a driver connected in it (Ray names a placement group in "
                f"its driver's namespace): ray.init(namespace={self.namespace!r})"
            )

    async def _exists(self, ws_id: str) -> bool:
        return await asyncio.to_thread(gcs.slot, self.namespace, ws_id) is not None

    async def _has_free_slot(self) -> bool:
        # Ray's view of free resources follows a freed slot or a new node within a moment
        # (it is broadcast from the nodes), and later on a loaded cluster: a node just added
        # showed its slots only after more than 3 s on a 2-core machine running three
        # raylets and a test suite. Look again for up to 10 s (at most ``place_timeout``)
        # before refusing.
        deadline = time.monotonic() + min(self.place_timeout, 10.0)
        while True:
            if (await asyncio.to_thread(ray.available_resources)).get(RESOURCE, 0) >= 1:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)

    async def get_workspace(self, workspace: str | PurePath) -> ClusterWorkspace:
        """The workspace, ``ready`` or ``lost``. Raises WorkspaceNotFound."""
        ws_id = workspace_id(workspace)
        try:
            loc = await self._locate(ws_id)
        except NodeLostError as e:
            return ClusterWorkspace(ws_id, e.node, self._path_on(e.node, ws_id), "lost")
        if not await asyncio.to_thread(gcs.node_alive, loc.node):
            self._locs.pop(ws_id, None)
            return ClusterWorkspace(ws_id, loc.node, loc.path, "lost")
        return ClusterWorkspace(ws_id, loc.node, loc.path, "ready")

    async def list_workspaces(self) -> list[ClusterWorkspace]:
        """Every workspace of the namespace, the lost ones too, sorted by id (those still
        being placed are left out)."""
        records = await asyncio.to_thread(gcs.slots, self.namespace)
        alive = {n.node_id for n in await asyncio.to_thread(gcs.nodes) if n.alive}
        roots = await self._node_roots({r.node for r in records if r.node in alive})
        out = {}
        for r in records:
            if r.node not in alive:
                out[r.name] = ClusterWorkspace(r.name, r.node, self._path_on(r.node, r.name), "lost")
            elif r.state == "CREATED":
                root = roots.get(r.node)
                out[r.name] = ClusterWorkspace(r.name, r.node, None if root is None else f"{root}/{r.name}", "ready")
        return [out[k] for k in sorted(out)]

    def _path_on(self, node: str | None, ws_id: str) -> str | None:
        root = self._roots.get(node or "")
        return None if root is None else f"{root}/{ws_id}"

    async def _node_roots(self, node_ids: set[str]) -> dict[str, str]:
        async def root(node_id: str) -> tuple[str, str | None]:
            try:
                return node_id, await self._root(node_id, await self._service(node_id))
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
        stopped = await self._node(ws_id, loc.node, loc.service.delete.remote(ws_id, delete_files))
        self._locs.pop(ws_id, None)
        await placement.release(loc.group)
        return {"id": ws_id, "sandbox_stopped": stopped, "files_deleted": delete_files}

    async def _locate(self, ws_id: str) -> _Loc:
        loc = self._locs.get(ws_id)
        if loc is not None:
            return loc
        found = await asyncio.to_thread(gcs.slot, self.namespace, ws_id)
        if found is None:
            raise WorkspaceNotFound(f"Workspace {ws_id!r} not found")
        if found.state != "CREATED":
            if found.state == "RESCHEDULING" or not await asyncio.to_thread(gcs.node_alive, found.node):
                raise NodeLostError(ws_id, found.node, "Ray reports its node dead")
            raise WorkspaceNotFound(f"Workspace {ws_id!r} is not placed yet")
        service = await self._service(found.node)
        root = await self._node(ws_id, found.node, self._root(found.node, service))
        loc = _Loc(found.node, f"{root}/{ws_id}", service, found.group_id)
        self._locs[ws_id] = loc
        return loc

    async def _service(self, node: str) -> Any:
        """The node's service handle (made on the node when it has none)."""
        service = self._services.get(node)
        if service is None:
            service = self._services[node] = await asyncio.to_thread(node_service, node, self.namespace)
        return service

    async def _root(self, node: str, service: Any) -> str:
        root = self._roots.get(node)
        if root is None:
            root = self._roots[node] = (await service.info.remote())["workspace_root"]
        return root

    async def _node(self, ws_id: str, node: str, call: Awaitable[Any]) -> Any:
        """Await a call to ``node``'s service: what the node raised is raised as it was;
        a dead or unreachable node is NodeLostError."""
        try:
            return await call
        except RayTaskError as e:
            raise _cause(e) from None
        except RayActorError as e:
            self._locs.pop(ws_id, None)
            self._services.pop(node, None)
            raise NodeLostError(ws_id, node, _short(e)) from None

    async def path(self, workspace: str | PurePath) -> str:
        """The workspace's directory on its node. Raises WorkspaceNotFound, NodeLostError."""
        return (await self._locate(workspace_id(workspace))).path

    async def node_of(self, workspace: str | PurePath) -> str:
        """Ray's id of the workspace's node. Raises WorkspaceNotFound, NodeLostError."""
        return (await self._locate(workspace_id(workspace))).node


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]
