"""A workspace's slot: a detached named placement group (its name is the workspace id) of
one bundle of ``loom_sandboxes``, pinned to its node by Ray's own node-id label. It holds
the slot without a process (a named actor per workspace cost a Python worker process
each, and 1.5 workspaces a second to start); any driver finds the workspace by id in
Ray's placement-group table (:mod:`.gcs`); nothing of ours records where it is.

Ray's scheduler chooses the node: an unnamed *probe* group (the same bundle, not pinned,
or pinned by the caller's node labels; ``STRICT_PACK``, which Ray places on the node with
the most free slots) is placed first, the slot is then made pinned to the node the probe
got, and the probe removed. Pinned, because a group whose node dies is rescheduled by
Ray onto another node with room: a pinned one cannot be, so it stays, unplaced, with its
node in its label selector, which is how a lost workspace keeps its last node. The probe
fate-shares with the driver that made it (a driver that dies mid-way leaks nothing).

Calls do not go through the slot: a driver reads it once to learn the node, then calls
that node's service (:mod:`.node`; :func:`.node.node_service` creates it on first use,
pinned to its node). A node's service places slots on its own node too (E2B's create,
carried to the node a front door chose: :mod:`.nodeslots`), so nothing here imports it.
"""

from __future__ import annotations

import asyncio

from ray.exceptions import RaySystemError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from .names import NODE_ID_LABEL, RESOURCE


class NameTaken(ValueError):
    """A slot of that name exists already."""


class NotPlaced(TimeoutError):
    """No node took the slot in time (every slot held, or no node matches the pin)."""


def _group(name: str, selector: dict[str, str] | None, detached: bool) -> PlacementGroup:
    try:
        return placement_group(
            [{RESOURCE: 1}],
            strategy="STRICT_PACK",
            name=name,
            lifetime="detached" if detached else None,
            bundle_label_selector=[selector] if selector else None,
        )
    except RaySystemError as e:
        if "already exists" in str(e):
            raise NameTaken(name) from None
        raise


def _node_of(pg: PlacementGroup) -> str:
    from ray.util.placement_group import placement_group_table

    node: str = placement_group_table(pg)["bundles_to_node_id"][0]
    return node


async def _wait(pg: PlacementGroup, timeout: float) -> None:
    """Raises NotPlaced (the group removed) when it is not placed within ``timeout``."""
    try:
        await asyncio.wait_for(pg.ready(), timeout)
    except BaseException:
        await asyncio.to_thread(remove_placement_group, pg)
        raise NotPlaced() from None


async def choose(labels: dict[str, str] | None, timeout: float) -> str:
    """The node Ray's scheduler gives one more slot now (one whose labels match
    ``labels``), found with an unnamed probe group, removed before this returns: nothing
    is held. Raises NotPlaced."""
    probe = await asyncio.to_thread(_group, "", labels, False)
    await _wait(probe, timeout)
    chosen = await asyncio.to_thread(_node_of, probe)
    # Removed first: a slot made while the probe still holds the node's last free one
    # could not be placed at once, and Ray tries a pending group again only after a
    # back-off.
    await asyncio.to_thread(remove_placement_group, probe)
    return chosen


#: Seconds a slot pinned to the node its probe got may take to be placed before the
#: placement starts again (another driver took that node's last free slot meanwhile).
RETRY_SECONDS = 1.0


async def place(ws_id: str, *, node: str | None, labels: dict[str, str] | None, timeout: float) -> tuple[str, str]:
    """Hold a slot for workspace ``ws_id`` on a node with a free one (Ray's choice, or
    ``node``, or a node whose labels match ``labels``), named ``ws_id`` in this driver's
    namespace. Returns (the node id, the slot's group id). Raises NameTaken, NotPlaced."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        chosen = node if node is not None else await choose(labels, max(0.0, deadline - loop.time()))
        slot = await asyncio.to_thread(_group, ws_id, {NODE_ID_LABEL: chosen}, True)
        left = deadline - loop.time()
        try:
            # A pin is waited for; Ray's choice again when another driver's group took the
            # slot between the probe and the pinned slot.
            await _wait(slot, left if node is not None else min(RETRY_SECONDS, max(0.0, left)))
            return chosen, slot.id.hex()
        except NotPlaced:
            if node is not None or loop.time() >= deadline:
                raise


def group(group_id: str) -> PlacementGroup:
    """The placement group of that hex id (to remove it)."""
    from ray import PlacementGroupID

    return PlacementGroup(PlacementGroupID(bytes.fromhex(group_id)))


async def release(group_id: str) -> None:
    """Remove a slot (frees it and its name). Raises nothing for one already gone."""
    try:
        await asyncio.to_thread(remove_placement_group, group(group_id))
    except Exception:  # (removed meanwhile by another driver)
        pass
