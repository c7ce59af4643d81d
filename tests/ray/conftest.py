"""The Ray tier: one real multi-node Ray cluster on this machine
(:func:`worker.integrations.ray.testing.local_cluster`: ``ray.cluster_utils.Cluster``, a
raylet per node), shared by every test of the tier (Ray's start costs seconds), on the
real Docker engine that all nodes share.

Three nodes offer ``loom_sandboxes`` (two slots each), each with its own
``LOOM_DATA_DIR`` and ``LOOM_WORKSPACE_ROOT`` given through the node's environment; the
head is the first node. The nodes run the tool catalog (``tool_search``) and one custom
tool (:data:`CUSTOM_TOOL`, from :data:`TOOLS_DIR`'s file), as a node set up with them
would. Ray's dashboard is off and its files go to a temporary directory;
at the end the cluster is shut down (every raylet, GCS and worker process it started)
and the sandboxes of its workspaces are removed. The files run in name order, and
``test_ray_lost_node.py`` (which kills a node and adds another) comes last.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray  # the test extra installs it: missing, the tier fails loudly

from tests.conftest import SANDBOX_IMAGE, require_docker
from worker.integrations.ray.testing import LocalCluster, local_cluster, remove_sandboxes

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SLOTS = 2
NAMESPACE = "loom-test"
RayCluster = LocalCluster
#: A custom YAML tool every node runs (its catalog loads it from LOOM_TOOLS_DIR).
CUSTOM_TOOL = """
name: shout
description: Print the text in capitals
parameters:
  type: object
  properties: {text: {type: string, description: The text}}
  required: [text]
command: [python3, -c, "import sys; print(sys.argv[1].upper())", "{text}"]
"""


def node_env(root: Path) -> dict[str, str]:
    """What every node's environment adds (its LOOM_TOOLS_DIR under ``root``)."""
    tools = root / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "shout.yaml").write_text(CUSTOM_TOOL)
    # 127.0.0.1:9 (nothing listens): a registry whose pulls fail at once (the image routes' test).
    return {
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_CATALOG": "true",
        "LOOM_TOOLS_DIR": str(tools),
        "LOOM_REGISTRIES": "docker.io,127.0.0.1:9",
    }


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LocalCluster]:
    """The tier's cluster (three nodes), this process connected to it as a driver."""
    require_docker()
    root = Path(tempfile.mkdtemp(prefix="loom-ray-")).resolve()
    start = time.perf_counter()
    try:
        with local_cluster(root, nodes=3, slots=SLOTS, env=node_env(root)) as lc:
            ray.init(address=lc.address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
            print(f"\nray cluster of 3 nodes up in {time.perf_counter() - start:.1f}s")
            try:
                yield lc
            finally:
                ray.shutdown()
    finally:
        remove_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def cluster(ray_cluster: LocalCluster) -> AsyncIterator[Any]:
    """The Python API on the tier's cluster; the workspaces a test made are deleted after."""
    from worker.integrations.ray import ClusterRegistry

    reg = ClusterRegistry(namespace=NAMESPACE, place_timeout=20)
    made: list[str] = []
    create = reg.create_workspace

    async def tracked(*args: Any, **kwargs: Any) -> Any:
        ws = await create(*args, **kwargs)
        made.append(ws.id)
        return ws

    reg.create_workspace = tracked  # type: ignore[method-assign]
    try:
        yield reg
    finally:
        from worker.service import WorkspaceNotFound

        for ws_id in made:
            try:
                await reg.delete_workspace(ws_id, delete_files=True)
            except WorkspaceNotFound:
                pass
        await reg.aclose()
