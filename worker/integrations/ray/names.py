"""The names loom gives things in a Ray cluster, in one place.

Everything here is Ray's own: a custom resource that says how many sandboxes a node
offers, a namespace, and the names of two kinds of named actors in it:

- ``loom/node/<node id>``: the node service of one node (:mod:`.node`), detached, pinned
  to its node; ``/`` never appears in a workspace id, so the two kinds never collide;
- ``<workspace id>``: the slot of one workspace (:mod:`.placement`), holding one unit of
  :data:`RESOURCE` on the node Ray's scheduler chose for it.
"""

from __future__ import annotations

#: The custom resource a node is started with to offer sandboxes (its number of slots):
#: ``ray start ... --resources '{"loom_sandboxes": 64}'``.
RESOURCE = "loom_sandboxes"

#: The Ray namespace loom's named actors live in unless another is given.
DEFAULT_NAMESPACE = "loom"

_NODE_PREFIX = "loom/node/"

#: The class name of a workspace's slot actor (how a dead one is told from others in
#: Ray's actor table).
SLOT_CLASS = "WorkspaceSlot"


def node_service_name(node_id: str) -> str:
    """The named actor serving node ``node_id`` (Ray's hex node id)."""
    return _NODE_PREFIX + node_id


def is_node_service(name: str) -> bool:
    return name.startswith(_NODE_PREFIX)
