"""A real multi-node Ray cluster on one host, for tests and benchmarks: Ray's own
``ray.cluster_utils.Cluster`` (a raylet per node), each node offering ``loom_sandboxes``
with its own ``LOOM_DATA_DIR`` and ``LOOM_WORKSPACE_ROOT`` given through the node's
environment (the raylet's, which Ray's worker processes inherit), as ``ray start`` on a
real machine has them. All nodes share the host's Docker engine (a sandbox's container is
named by its workspace's real path, so distinct roots never collide).

Ray's dashboard is off, its files go under the given directory (``temp_dir`` and
``RAY_TMPDIR``: never the user's home or /tmp/ray), and leaving the context shuts every
process of the cluster down. Node death is detected within a second or two (a health
check every 500 ms, three missed), where Ray's defaults take tens of seconds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .names import RESOURCE

#: Ray's health checks, fast enough for a test to see a node die.
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
}


@dataclass
class LocalCluster:
    """The running cluster: ``nodes`` in the order added (the head first) and each
    node's workspace root by Ray's node id."""

    cluster: Any
    root: Path
    env: dict[str, str]
    slots: int
    nodes: list[Any] = field(default_factory=list)
    roots: dict[str, Path] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_node(self, name: str, *, slots: int | None = None, **node_args: Any) -> Any:
        """Start node ``name`` (label ``loom-node=name``) with ``slots`` sandboxes and its
        own loom directories under the root. Call it on the main thread (Ray installs
        signal handlers)."""
        node_dir = self.root / name
        (node_dir / "workspaces").mkdir(parents=True)
        env = {
            **self.env,
            "LOOM_DATA_DIR": str(node_dir / "data"),
            "LOOM_WORKSPACE_ROOT": str(node_dir / "workspaces"),
        }
        node = self.cluster.add_node(
            num_cpus=1,
            resources={RESOURCE: self.slots if slots is None else slots},
            labels={"loom-node": name},
            env_vars=env,
            include_dashboard=False,
            **node_args,
        )
        self.nodes.append(node)
        self.roots[node.node_id] = (node_dir / "workspaces").resolve()
        return node


@contextmanager
def local_cluster(
    root: Path, *, nodes: int = 3, slots: int = 2, env: dict[str, str] | None = None
) -> Iterator[LocalCluster]:
    """``nodes`` nodes of ``slots`` sandboxes each under ``root`` (an empty directory of
    its own), the head first; ``env`` is added to every node's environment (``LOOM_IMAGE``,
    ``LOOM_RUNTIME``...). This process is not connected: ``ray.init(address=...)``."""
    from ray.cluster_utils import Cluster

    saved = os.environ.get("RAY_TMPDIR")
    # Ray writes the address of its latest cluster under RAY_TMPDIR/ray.
    os.environ["RAY_TMPDIR"] = str(root)
    (root / "ray").mkdir(parents=True, exist_ok=True)
    cluster = Cluster(initialize_head=False, shutdown_at_exit=True)
    lc = LocalCluster(cluster, root, dict(env or {}), slots)
    try:
        lc.add_node("n0", temp_dir=str(root / "ray"), _system_config=FAST_FAILURE_DETECTION)
        for i in range(1, nodes):
            lc.add_node(f"n{i}")
        cluster.wait_for_nodes()
        yield lc
    finally:
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved


def remove_sandboxes(root: Path) -> list[str]:
    """Remove the sandbox containers of the workspaces under ``root`` (and only those):
    a lost node's sandboxes keep running on the engine the nodes share here; and the
    engine's volumes of the overlay forks whose layers are under ``root`` (a node's data
    directory), with their sandboxes. Returns the containers' names."""
    import asyncio

    from sandbox.docker import DockerBackend

    async def run() -> list[str]:
        backend = DockerBackend()
        try:
            forks = [v for v in await backend.overlays.list() if str(v.get("upper") or "").startswith(str(root))]
            mine = (str(root), *(str(v["mountpoint"]) for v in forks))
            found = [s for s in await backend.list_sandboxes() if str(s.get("workspace", "")).startswith(mine)]
            for s in found:
                await backend.stop(Path(s["workspace"]))
            for v in forks:
                await backend.overlays.remove(v["name"], with_containers=True)
            return [str(s["name"]) for s in found]
        finally:
            await backend.aclose()

    return asyncio.run(run())
