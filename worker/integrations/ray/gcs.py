"""Reading Ray's control store (the GCS): the nodes, their free slots, and the workspaces'
slots (the named placement groups of loom's namespace), placed, pending or lost.

Nodes come from the public ``ray.nodes()``. Placement groups come from the GCS's table
through ``ray._private.state``: the public ``ray.util.placement_group_table`` leaves out
each group's namespace and its bundles' label selectors, and a lost workspace is a group
whose pinned node died (the selector is the only record of that node once Ray cleared
the bundle's placement). This module is the only place that touches that private module,
so a Ray release that moves it is fixed here. All of it blocks on the network: call it
off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from .names import NODE_ID_LABEL, RESOURCE


def _accessor() -> Any:
    from ray._private import state as ray_state

    return ray_state.state._connect_and_get_accessor()


@dataclass(frozen=True)
class SlotRecord:
    """A workspace's slot as Ray's control store has it."""

    name: str  # the workspace id
    #: The node it is pinned to (its bundle's node-id label selector): where its files are.
    node: str
    #: Ray's state of the group: PENDING, PREPARED, CREATED, RESCHEDULING (REMOVED ones
    #: are left out).
    state: str
    #: The node holding its bundle now (None while not placed, or after its node died).
    placed_on: str | None
    group_id: str


def _record(raw: bytes) -> tuple[str, SlotRecord] | None:
    from ray.core.generated import gcs_pb2 as gcs_pb

    gcs_pb2: Any = gcs_pb  # generated protobuf module: no types to check against
    data = gcs_pb2.PlacementGroupTableData.FromString(raw)
    state = gcs_pb2.PlacementGroupTableData.PlacementGroupState.Name(data.state)
    if not data.name or state == "REMOVED" or len(data.bundles) != 1:
        return None
    bundle = data.bundles[0]
    node = dict(bundle.label_selector).get(NODE_ID_LABEL)
    if RESOURCE not in bundle.unit_resources or not node:
        return None  # a group of someone else's, or one of our unnamed probes
    placed = bundle.node_id.hex() if bundle.node_id else None
    return data.ray_namespace, SlotRecord(data.name, node, state, placed, data.placement_group_id.hex())


def slot(namespace: str, ws_id: str) -> SlotRecord | None:
    """The slot of workspace ``ws_id`` (None: there is none)."""
    raw = _accessor().get_placement_group_by_name(ws_id, namespace)
    found = None if raw is None else _record(raw)
    return None if found is None else found[1]


def slots(namespace: str) -> list[SlotRecord]:
    """Every workspace slot of ``namespace`` (placed, pending or lost)."""
    out = []
    for raw in _accessor().get_placement_group_table():
        found = _record(raw)
        if found is not None and found[0] == namespace:
            out.append(found[1])
    return out


def free_slots(node_id: str) -> int:
    """The node's ``loom_sandboxes`` not held now."""
    from ray._private import state as ray_state

    return int(ray_state.state.available_resources_per_node().get(node_id, {}).get(RESOURCE, 0))


@dataclass(frozen=True)
class NodeRecord:
    node_id: str
    alive: bool
    address: str
    slots: int
    labels: dict[str, str]


def nodes() -> list[NodeRecord]:
    """Every node Ray knows (dead ones too), with its ``loom_sandboxes`` slots."""
    out = []
    for n in ray.nodes():
        resources: dict[str, Any] = n.get("Resources") or {}
        out.append(
            NodeRecord(
                node_id=n["NodeID"],
                alive=bool(n.get("Alive")),
                address=str(n.get("NodeManagerAddress", "")),
                slots=int(resources.get(RESOURCE, 0)),
                labels={k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")},
            )
        )
    return out


def node_alive(node_id: str) -> bool:
    return any(n.node_id == node_id and n.alive for n in nodes())
