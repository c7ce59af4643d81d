"""A workspace is a placement: a small detached named actor (its name is the workspace id)
holding one unit of ``loom_sandboxes`` on the node Ray's scheduler chose for it. The slot
is held until the workspace is deleted (the actor is killed); any driver finds the
workspace by id with ``ray.get_actor(id, namespace=...)``; Ray's actor table is the only
record of where it is, so nothing of ours can disagree with Ray.

The slot actor records its node, makes sure the node has its node service (created here
on first use, pinned to the node: :mod:`.node`) and has it create the directory. Calls do
not go through it: a driver asks it once where the workspace is (:meth:`WorkspaceSlot.where`)
and then calls the node service directly (one hop, not two).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .names import RESOURCE, SLOT_CLASS, node_service_name
from .node import NodeServiceActor


def node_service(node_id: str, namespace: str) -> Any:
    """The handle of node ``node_id``'s service, created (pinned to it) when it has none.
    Blocking (a call to Ray's control store): call it off the event loop."""
    return NodeServiceActor.options(
        name=node_service_name(node_id),
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(node_id, namespace)


class WorkspaceSlot:
    """One workspace's place in the cluster (used as a Ray actor)."""

    def __init__(self, ws_id: str, namespace: str) -> None:
        self.ws_id = ws_id
        self.namespace = namespace
        self.node_id = ray.get_runtime_context().get_node_id()
        self.path: str | None = None

    async def place(self, settings: dict[str, Any] | None) -> dict[str, Any]:
        """Create the workspace on this node. Returns :meth:`where`. Raises what the
        node's ``create`` raises (WorkspaceExists, SettingsError)."""
        import asyncio

        node = await asyncio.to_thread(node_service, self.node_id, self.namespace)
        self.path = await node.create.remote(self.ws_id, settings)
        return self.where()

    def where(self) -> dict[str, Any]:
        """``{"id", "node", "path", "class"}``: the node holding the workspace (Ray's
        node id) and its directory there (None until placed)."""
        return {"id": self.ws_id, "node": self.node_id, "path": self.path, "class": SLOT_CLASS}


# One unit of the sandbox resource, no CPU: the slot only waits.
WorkspaceSlotActor = ray.remote(num_cpus=0, max_restarts=0)(WorkspaceSlot)


def new_slot(ws_id: str, namespace: str, *, node: str | None = None, labels: dict[str, str] | None = None) -> Any:
    """Ask Ray for the slot of workspace ``ws_id`` (a node with a free ``loom_sandboxes``,
    pinned to ``node`` or to a node whose labels match ``labels`` when given). Returns the
    actor's handle (it may still be pending). Raises ValueError when the name is taken."""
    options: dict[str, Any] = {
        "name": ws_id,
        "namespace": namespace,
        "lifetime": "detached",
        "resources": {RESOURCE: 1},
    }
    # Spread: a node's slots are its sandboxes' share of its CPU, memory and engine, so
    # the emptiest nodes take new workspaces first (Ray's default packs the local node).
    options["scheduling_strategy"] = "SPREAD"
    if node is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    if labels:
        options["label_selector"] = dict(labels)
    return WorkspaceSlotActor.options(**options).remote(ws_id, namespace)
