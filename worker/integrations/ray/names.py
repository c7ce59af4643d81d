"""The names loom gives things in a Ray cluster, in one place.

Everything here is Ray's own: a custom resource that says how many sandboxes a node
offers, a namespace, a node label Ray sets itself, and two kinds of names in the
namespace:

- ``loom/node/<node id>``: the node service of one node (:mod:`.node`), a detached named
  actor pinned to its node; ``/`` never appears in a workspace id, so the two kinds never
  collide;
- ``<workspace id>``: the slot of one workspace (:mod:`.placement`), a detached named
  placement group of one bundle of :data:`RESOURCE`, pinned to its node by
  :data:`NODE_ID_LABEL`.
"""

from __future__ import annotations

#: The custom resource a node is started with to offer sandboxes (its number of slots):
#: ``ray start ... --resources '{"loom_sandboxes": 64}'``.
RESOURCE = "loom_sandboxes"

#: The Ray namespace loom's named actors and placement groups live in unless another is
#: given.
DEFAULT_NAMESPACE = "loom"

#: The label Ray gives every node: its node id (a workspace's slot is pinned by it).
NODE_ID_LABEL = "ray.io/node-id"

_NODE_PREFIX = "loom/node/"


def node_service_name(node_id: str) -> str:
    """The named actor serving node ``node_id`` (Ray's hex node id)."""
    return _NODE_PREFIX + node_id
