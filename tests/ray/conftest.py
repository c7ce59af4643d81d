"""The Ray tier: one real multi-node Ray cluster on this machine
(:func:`worker.integrations.ray.testing.local_cluster`: ``ray.cluster_utils.Cluster``, a
raylet per node), shared by every test of the tier (Ray's start costs seconds), on the
real Docker engine that all nodes share.

Three nodes offer ``loom_sandboxes`` (two slots each), each with its own
``LOOM_DATA_DIR`` and ``LOOM_WORKSPACE_ROOT`` given through the node's environment; the
head is the first node. Ray's dashboard is off and its files go to a temporary directory;
at the end the cluster is shut down (every raylet, GCS and worker process it started)
and the sandboxes of its workspaces are removed. The files run in name order, and
``test_ray_lost_node.py`` (which kills a node and adds another) comes last.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE, require_docker

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'loom-worker[ray]')")

from worker.integrations.ray.testing import LocalCluster, local_cluster, remove_sandboxes  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SLOTS = 2
NAMESPACE = "loom-test"
RayCluster = LocalCluster


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LocalCluster]:
    """The tier's cluster (three nodes), this process connected to it as a driver."""
    require_docker()
    root = Path(tempfile.mkdtemp(prefix="loom-ray-")).resolve()
    start = time.perf_counter()
    try:
        with local_cluster(
            root, nodes=3, slots=SLOTS, env={"LOOM_IMAGE": SANDBOX_IMAGE, "LOOM_CATALOG": "false"}
        ) as lc:
            ray.init(address=lc.address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
            print(f"\nray cluster of 3 nodes up in {time.perf_counter() - start:.1f}s")
            try:
                yield lc
            finally:
                ray.shutdown()
    finally:
        remove_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)
