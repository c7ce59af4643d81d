"""Operations over the whole cluster: its nodes and their slots, the workspaces on each,
each node's numbers (metrics), and ``gc`` on every node.

Everything is read from Ray (its node table, the placement groups of loom's namespace)
and from each node's service; nothing is kept between calls.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from . import gcs
from .node import node_service


async def status(namespace: str) -> dict[str, Any]:
    """``{"nodes": [{"node_id", "alive", "slots", "used", "workspaces"}, ...]}``: every
    node Ray knows that offers sandboxes (or held workspaces), its slots, how many are
    held, and its workspaces' ids (a dead node's: those lost with it). Each node also
    has ``"details"`` (address, labels, versions, directories) for people; the JSON of
    ``loom-worker cluster status --json`` leaves them out."""
    nodes = await asyncio.to_thread(gcs.nodes)
    records = await asyncio.to_thread(gcs.slots, namespace)
    held: dict[str, list[str]] = {}
    for r in records:
        if r.state == "CREATED" or r.state == "RESCHEDULING":
            held.setdefault(r.node, []).append(r.name)
    out = []
    infos = await asyncio.gather(*(_info(n.node_id, namespace) for n in nodes if n.alive and n.slots))
    by_node = {i["node_id"]: i for i in infos if i}
    for n in nodes:
        if not n.slots and n.node_id not in held:
            continue  # a node that offers no sandboxes (a head, a trainer's GPU node)
        names = sorted(held.get(n.node_id, []))
        out.append(
            {
                "node_id": n.node_id,
                "alive": n.alive,
                "slots": n.slots,
                "used": len(names) if n.alive else 0,
                "workspaces": names,
                "details": {"address": n.address, "labels": n.labels, **by_node.get(n.node_id, {})},
            }
        )
    return {"nodes": out}


async def _info(node_id: str, namespace: str) -> dict[str, Any] | None:
    try:
        service = await asyncio.to_thread(node_service, node_id, namespace)
        info: dict[str, Any] = await asyncio.wait_for(service.info.remote(), 30)
        info.update(await asyncio.wait_for(service.metrics.remote(), 30))
        info.pop("workspaces", None)
        return info
    except (RayActorError, RayTaskError, TimeoutError):
        return None


async def metrics(namespace: str) -> list[dict[str, Any]]:
    """Each live node's numbers (``NodeService.metrics``: workspaces, sandboxes open,
    restarts, tunnels)."""
    nodes = [n for n in await asyncio.to_thread(gcs.nodes) if n.alive and n.slots]

    async def one(node_id: str) -> dict[str, Any]:
        try:
            service = await asyncio.to_thread(node_service, node_id, namespace)
            found: dict[str, Any] = await asyncio.wait_for(service.metrics.remote(), 30)
            return found
        except (RayActorError, RayTaskError, TimeoutError) as e:
            return {"node_id": node_id, "error": " ".join(str(e).split())[:300]}

    return list(await asyncio.gather(*(one(n.node_id) for n in nodes)))


async def gc(namespace: str) -> list[dict[str, Any]]:
    """``loom-worker gc`` on every live node offering sandboxes: ``[{"node_id",
    "removed": [...]}]`` (or ``"error"`` for a node whose engine did not answer)."""
    nodes = [n for n in await asyncio.to_thread(gcs.nodes) if n.alive and n.slots]

    async def one(node_id: str) -> dict[str, Any]:
        try:
            service = await asyncio.to_thread(node_service, node_id, namespace)
            return {"node_id": node_id, "removed": await service.gc.remote()}
        except RayTaskError as e:
            return {"node_id": node_id, "error": str(getattr(e, "cause", e))[:300]}
        except RayActorError as e:
            return {"node_id": node_id, "error": " ".join(str(e).split())[:300]}

    return list(await asyncio.gather(*(one(n.node_id) for n in nodes)))
