"""Reading Ray's control store (the GCS): the nodes, and the actors of loom's namespace,
alive or dead.

Nodes come from the public ``ray.nodes()``. Actors come from the GCS's actor table
through ``ray._private.state``: Ray's public state API (``ray.util.state``) is served by
the dashboard, which a cluster may run without (ours in the tests does), and it reads the
same table; ``ray.util.list_named_actors`` knows neither the node of an actor nor the
dead ones, and a lost workspace is a dead one with its last node. This module is the only
place that touches that private module, so a Ray release that moves it is fixed here.
All of it blocks on the network: call it off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from .names import RESOURCE, SLOT_CLASS


@dataclass(frozen=True)
class ActorRecord:
    name: str
    class_name: str
    node: str | None
    state: str  # ALIVE, DEAD, PENDING_CREATION, RESTARTING, DEPENDENCIES_UNREADY
    #: Why a dead actor died (Ray's ``ActorDiedErrorContext.Reason``: NODE_DIED, RAY_KILL, ...).
    death_reason: str | None
    end_time: int


def actors(namespace: str, *, state: str | None = None, class_name: str | None = SLOT_CLASS) -> list[ActorRecord]:
    """The named actors of ``namespace`` (of ``class_name``; all with None) in ``state``
    (all with None). Raises RuntimeError when Ray is not connected."""
    from ray._private import state as ray_state
    from ray.core.generated import common_pb2 as common
    from ray.core.generated import gcs_pb2 as gcs_pb

    # Generated protobuf modules: no types to check against.
    common_pb2: Any = common
    gcs_pb2: Any = gcs_pb
    accessor = ray_state.state._connect_and_get_accessor()
    out = []
    for raw in accessor.get_actor_table(None, state):
        data = gcs_pb2.ActorTableData.FromString(raw)
        if data.ray_namespace != namespace or not data.name:
            continue
        if class_name is not None and data.class_name != class_name:
            continue
        reason = None
        if data.HasField("death_cause") and data.death_cause.HasField("actor_died_error_context"):
            ctx = data.death_cause.actor_died_error_context
            reason = common_pb2.ActorDiedErrorContext.Reason.Name(ctx.reason)
        node = data.address.node_id.hex() if data.address.node_id else None
        out.append(
            ActorRecord(
                name=data.name,
                class_name=data.class_name,
                node=node,
                state=gcs_pb2.ActorTableData.ActorState.Name(data.state),
                death_reason=reason,
                end_time=data.end_time,
            )
        )
    return out


def lost_workspace(namespace: str, ws_id: str) -> ActorRecord | None:
    """The newest dead slot of workspace ``ws_id`` whose node died, if any."""
    found = [a for a in actors(namespace, state="DEAD") if a.name == ws_id and a.death_reason == "NODE_DIED"]
    return max(found, key=lambda a: a.end_time) if found else None


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
