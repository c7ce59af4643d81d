"""loom-worker on a Ray cluster (``pip install 'loom-worker[ray]'``; docs/ray.md).

Each Ray node started with the ``loom_sandboxes`` resource runs loom's node service
(:mod:`.node`), which owns that node's registry exactly as a local worker does; a
workspace is a named placement group holding one slot on a node (:mod:`.placement`); any
driver calls it by id through :class:`ClusterRegistry` (:mod:`.client`; its snapshots and
forks: :mod:`.snapshots`), over the node's call channel (:mod:`.channel`) or Ray's actor
calls; ``loom-worker serve --ray`` is the HTTP/MCP front door (:mod:`.frontdoor`, how
each route is carried: :mod:`.forward`), ``loom-worker cluster`` the operations
(:mod:`.status`). Ray's control store is the only record of where things are.

    from worker.integrations.ray import ClusterRegistry

    async with ClusterRegistry.connect("auto") as cluster:
        ws = await cluster.create_workspace()
        result = await cluster.execute("read_file", {"path": "README.md"}, ws.id)

Imported by name only (``ray`` with it); the core finds it by its entry point
(:mod:`worker.plugins`).
"""

from __future__ import annotations

from .client import ClusterRegistry, ClusterWorkspace, RemoteTunnel
from .errors import CallInterruptedError, ClusterError, ClusterFullError, NodeLostError, RayNotConnectedError
from .names import DEFAULT_NAMESPACE, RESOURCE
from .snapshots import ClusterSnapshots

__all__ = [
    "DEFAULT_NAMESPACE",
    "RESOURCE",
    "CallInterruptedError",
    "ClusterError",
    "ClusterFullError",
    "ClusterRegistry",
    "ClusterSnapshots",
    "ClusterWorkspace",
    "NodeLostError",
    "RayNotConnectedError",
    "RemoteTunnel",
]
