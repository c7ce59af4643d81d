"""The Ray tier: one real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``:
a raylet per node), shared by every test of the tier (Ray's start costs seconds), on the
real Docker engine that all nodes share.

Three nodes offer ``loom_sandboxes`` (two slots each), each with its own
``LOOM_DATA_DIR`` and ``LOOM_WORKSPACE_ROOT`` given through the node's environment (the
raylet's, which Ray's worker processes inherit), as ``ray start`` on a real machine has
them. The head is the first node. Ray's dashboard is off; its files go to a temporary
directory (``temp_dir`` and ``RAY_TMPDIR``), never to the user's home or /tmp/ray; at the
end the cluster is shut down (every raylet, GCS and worker process it started) and the
sandboxes of its workspaces are removed.

Node death is detected within about a second and a half here (a health check every
500 ms, three missed), where Ray's defaults take tens of seconds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SANDBOX_IMAGE, require_docker

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'loom-worker[ray]')")

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SLOTS = 2
NAMESPACE = "loom-test"


@dataclass
class RayCluster:
    cluster: Any
    root: Path
    address: str
    nodes: list[Any] = field(default_factory=list)  # ray._private.node.Node, the head first
    roots: dict[str, Path] = field(default_factory=dict)  # node id -> its LOOM_WORKSPACE_ROOT
    started: float = 0.0

    def add_node(self, name: str, *, slots: int = SLOTS) -> Any:
        """Start a node offering ``slots`` sandboxes with its own loom directories."""
        node_dir = self.root / name
        (node_dir / "workspaces").mkdir(parents=True)
        env = {
            "LOOM_DATA_DIR": str(node_dir / "data"),
            "LOOM_WORKSPACE_ROOT": str(node_dir / "workspaces"),
            "LOOM_IMAGE": SANDBOX_IMAGE,
            "LOOM_CATALOG": "false",
        }
        node = self.cluster.add_node(
            num_cpus=1,
            resources={"loom_sandboxes": slots},
            labels={"loom-node": name},
            env_vars=env,
            include_dashboard=False,
        )
        self.nodes.append(node)
        self.roots[node.node_id] = (node_dir / "workspaces").resolve()
        return node


def _head_args(temp_dir: Path) -> dict[str, Any]:
    return {
        "temp_dir": str(temp_dir),
        "_system_config": {
            "health_check_initial_delay_ms": 0,
            "health_check_period_ms": 500,
            "health_check_failure_threshold": 3,
        },
    }


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """The tier's cluster (three nodes), this process connected to it as a driver."""
    require_docker()
    from ray.cluster_utils import Cluster

    root = Path(tempfile.mkdtemp(prefix="loom-ray-"))
    # Ray writes its address file under RAY_TMPDIR/ray and its sessions under temp_dir.
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR",)}
    os.environ["RAY_TMPDIR"] = str(root)
    (root / "ray").mkdir()
    start = time.perf_counter()
    cluster = Cluster(initialize_head=False, shutdown_at_exit=True)
    rc = RayCluster(cluster, root, address="")
    # The head is a node like the others (as on a small real cluster); it is never killed.
    head_dir = root / "n0"
    (head_dir / "workspaces").mkdir(parents=True)
    node = cluster.add_node(
        num_cpus=1,
        resources={"loom_sandboxes": SLOTS},
        labels={"loom-node": "n0"},
        env_vars={
            "LOOM_DATA_DIR": str(head_dir / "data"),
            "LOOM_WORKSPACE_ROOT": str(head_dir / "workspaces"),
            "LOOM_IMAGE": SANDBOX_IMAGE,
            "LOOM_CATALOG": "false",
        },
        include_dashboard=False,
        **_head_args(root / "ray"),
    )
    rc.nodes.append(node)
    rc.roots[node.node_id] = (head_dir / "workspaces").resolve()
    rc.address = cluster.address
    rc.add_node("n1")
    rc.add_node("n2")
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
    rc.started = time.perf_counter() - start
    try:
        yield rc
    finally:
        try:
            ray.shutdown()
        finally:
            cluster.shutdown()
            _remove_sandboxes(root)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(root, ignore_errors=True)


def _remove_sandboxes(root: Path) -> None:
    """Remove the containers of the workspaces under ``root`` (and only those)."""
    import docker

    client = docker.from_env()
    try:
        for c in client.containers.list(all=True, filters={"label": "dev.loom.worker=1"}):
            ws = c.labels.get("dev.loom.workspace", "")
            if ws.startswith(str(root.resolve())):
                c.remove(force=True)
    finally:
        client.close()
