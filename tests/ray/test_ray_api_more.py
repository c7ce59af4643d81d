"""More of the cluster's Python API: snapshots, forks and restore
(``ClusterRegistry.snapshots``), on the real 3-node cluster: a fork is placed on its
source workspace's node and becomes a workspace of its own (its slot, found by id from
another driver process); the errors of a node reach the driver as they were raised; the
vendors' native tools run on the node."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import NAMESPACE, RayCluster
from .test_ray_api import ROOT, SECOND_DRIVER

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]


async def test_snapshots_forks_and_restore_through_the_cluster(ray_cluster: RayCluster, cluster: Any) -> None:
    from worker.integrations.ray import ClusterFullError, ClusterRegistry
    from worker.snapshots import SnapshotInUseError, SnapshotNotFoundError

    node = ray_cluster.nodes[1].node_id
    ws = await cluster.create_workspace(node=node)
    r = await cluster.execute("write_file", {"path": "hello.txt", "content": "from the snapshot\n"}, ws.id)
    assert r.success, r.output

    snap = await cluster.snapshots.create(ws.id, "first")
    assert (snap.name, snap.workspace, snap.files) == ("first", ws.path, 1)
    assert [s.id for s in await cluster.snapshots.list(ws.id)] == [snap.id]
    assert (await cluster.snapshots.get("first", ws.id)).id == snap.id
    assert await cluster.snapshots.origin(ws.id) is None
    with pytest.raises(SnapshotNotFoundError):
        await cluster.snapshots.get("nope", ws.id)

    # The fork: on the source's node (copy-on-write needs its filesystem), a workspace of
    # the cluster with its own slot, which fills that node (two slots).
    [fork] = await cluster.snapshots.fork("first", workspace=ws.id)
    assert (fork.node, fork.state) == (node, "ready") and Path(fork.path).parent == ray_cluster.roots[node]
    assert fork.id.startswith(f"{ws.id}-fork-"), fork
    assert (await cluster.snapshots.origin(fork.id)).snapshot == snap.id
    listed = {w.id: w for w in await cluster.list_workspaces()}
    assert listed[fork.id] == fork
    with pytest.raises(ClusterFullError, match="0 free loom_sandboxes slot"):
        await cluster.snapshots.fork("first", workspace=ws.id)

    # Another driver process finds the fork by id and calls it, as a trainer's worker would.
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", SECOND_DRIVER, ray_cluster.address, NAMESPACE, fork.id],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["result"]["output"] == "from the snapshot\n", found
    assert (found["node"], found["path"], found["state"]) == (node, fork.path, "ready")

    # A node's error reaches the driver as raised there, with its attributes.
    with pytest.raises(SnapshotInUseError) as e:
        await cluster.snapshots.delete("first", workspace=ws.id)
    assert e.value.forks == [fork.path]

    # Restore: recorded as one call of the changelog, which undo reverts.
    r = await cluster.execute("write_file", {"path": "hello.txt", "content": "changed\n"}, ws.id)
    done = await cluster.snapshots.restore(ws.id, "first")
    assert done.plan.modified == ["hello.txt"] and done.call_id, done
    assert (Path(ws.path) / "hello.txt").read_text() == "from the snapshot\n"
    await cluster.undo(ws.id, call_id=done.call_id)
    assert (Path(ws.path) / "hello.txt").read_text() == "changed\n"

    await cluster.delete_workspace(fork.id, delete_files=True)
    assert await cluster.snapshots.delete("first", workspace=ws.id) == []
    fresh = ClusterRegistry(namespace=NAMESPACE)
    from worker.service import WorkspaceNotFound

    with pytest.raises(WorkspaceNotFound):
        await fresh.get_workspace(fork.id)


async def test_a_nodes_errors_reach_the_driver_as_raised(cluster: Any) -> None:
    from worker.changelog import UndoConflictError
    from worker.workspace_settings import SettingsError

    ws = await cluster.create_workspace()
    with pytest.raises(SettingsError) as e:
        await cluster.configure_workspace(ws.id, {"memory": "lots"})
    assert e.value.field == "memory"
    r = await cluster.execute("write_file", {"path": "a.txt", "content": "one\n"}, ws.id, call_id="w1")
    assert r.success, r.output
    (Path(ws.path) / "a.txt").write_text("changed behind the changelog's back\n")
    with pytest.raises(UndoConflictError) as e2:
        await cluster.undo(ws.id, call_id="w1")
    [conflict] = e2.value.conflicts
    assert conflict.startswith("a.txt: entry 1 left it a file"), conflict


async def test_the_vendors_native_tools_run_on_the_node(cluster: Any, tmp_path: Path) -> None:
    """``worker.native``'s entry points given the cluster as their registry: they register
    the tool with it, and the node registers it too; the blocks answered are the local
    API's."""
    import os

    from tests.conftest import SANDBOX_IMAGE
    from worker.native import run_anthropic, run_openai
    from worker.registry import default_registry
    from worker.settings import Settings

    ws = await cluster.create_workspace()
    local_ws = tmp_path / "local"
    local_ws.mkdir()
    os.chown(local_ws, 1000, 1000)
    bash = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "echo native; pwd"}}
    shell = {"type": "shell_call", "call_id": "call_1", "action": {"commands": ["echo hi", "exit 3"]}}
    async with default_registry(Settings(data_dir=tmp_path / "data", image=SANDBOX_IMAGE, catalog=False)) as local:
        try:
            want = await run_anthropic(local, bash, workspace=local_ws)
            got = await run_anthropic(cluster, bash, workspace=ws.id)
            assert got == want and "native" in json.dumps(got), got
            assert cluster.get("bash") is not None  # (registered with the cluster by run_anthropic)
            assert await run_openai(cluster, shell, workspace=ws.id) == await run_openai(
                local, shell, workspace=local_ws
            )
        finally:
            await local.stop(local_ws)
