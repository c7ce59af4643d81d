"""A node lost: its raylet killed (``Cluster.remove_node(allow_graceful=False)``). Its
workspaces' calls fail as infrastructure errors saying the node was lost (503 from the
front door), their state is ``lost`` with the last node; the other nodes' workspaces keep
serving; a new node takes new workspaces; ``cluster status`` shows it all.

The last test file of the tier (it changes the shared cluster): it leaves three live
nodes behind, the new one in place of the lost one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import serve_app

from .conftest import NAMESPACE, SLOTS, RayCluster

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "ray-lost-node-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_a_lost_node_fails_its_calls_and_spares_the_others(ray_cluster: RayCluster, tmp_path: Path) -> None:
    from worker.integrations.ray import ClusterRegistry
    from worker.integrations.ray.cli import front_door
    from worker.settings import Settings

    head, survivor, victim = ray_cluster.nodes[0], ray_cluster.nodes[1], ray_cluster.nodes[2]
    cluster = ClusterRegistry(namespace=NAMESPACE, place_timeout=30)
    kept = [await cluster.create_workspace(node=n.node_id) for n in (head, survivor)]
    gone = await cluster.create_workspace(node=victim.node_id)
    for ws in [*kept, gone]:
        r = await cluster.execute("write_file", {"path": "f.txt", "content": ws.id}, ws.id)
        assert r.success, r.output
    settings = Settings(data_dir=tmp_path / "data", api_token=TOKEN, catalog=False)
    async with (
        serve_app(front_door(settings, ray_cluster.address, NAMESPACE)) as url,
        httpx.AsyncClient(base_url=url, timeout=120) as http,
    ):
        # The front door has located the victim's workspace before the loss.
        r = await http.post(f"/v1/workspaces/{gone.id}/execute", json={"tool": "process_list"}, headers=AUTH)
        assert r.status_code == 200, r.text

        await asyncio.to_thread(ray_cluster.cluster.remove_node, victim, allow_graceful=False)

        # Until Ray notices (a second or two here), a call may still be answered; then
        # every call fails as an infrastructure failure naming the node.
        while True:  # bounded by the test's timeout
            result = await cluster.execute("read_file", {"path": "f.txt"}, gone.id)
            if not result.success:
                break
            await asyncio.sleep(0.1)
        assert result.data is not None and result.data["error_kind"] == "infrastructure", result
        assert result.data["exception"] == "NodeLostError" and result.data["node"] == victim.node_id
        assert f"on node {victim.node_id}, which was lost" in (result.error or ""), result.error
        while True:
            if (await cluster.get_workspace(gone.id)).state == "lost":
                break
            await asyncio.sleep(0.1)

        # The front door: a call is a 503 carrying the same infrastructure result.
        r = await http.post(
            f"/v1/workspaces/{gone.id}/execute",
            json={"tool": "read_file", "arguments": {"path": "f.txt"}},
            headers=AUTH,
        )
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["success"] is False and body["data"]["error_kind"] == "infrastructure", body
        assert body["data"]["node"] == victim.node_id and "was lost" in body["error"]
        listed = {w["id"]: w for w in (await http.get("/v1/workspaces", headers=AUTH)).json()}
        assert (listed[gone.id]["state"], listed[gone.id]["node"]) == ("lost", victim.node_id), listed

        # The other nodes' workspaces never notice.
        for ws in kept:
            r2 = await cluster.execute("read_file", {"path": "f.txt"}, ws.id)
            assert r2.success and r2.output == ws.id, r2
            r = await http.post(
                f"/v1/workspaces/{ws.id}/execute",
                json={"tool": "read_file", "arguments": {"path": "f.txt"}},
                headers=AUTH,
            )
            assert r.status_code == 200 and r.json()["output"] == ws.id, r.text

    # A driver that never saw the workspace alive learns the same from Ray's tables.
    fresh = ClusterRegistry(namespace=NAMESPACE)
    found = await fresh.get_workspace(gone.id)
    assert (found.state, found.node) == ("lost", victim.node_id)
    result = await fresh.execute("read_file", {"path": "f.txt"}, gone.id)
    assert not result.success and result.data is not None and result.data["error_kind"] == "infrastructure"
    # Its files stay on its disk (here the same machine's).
    assert (Path(gone.path) / "f.txt").read_text() == gone.id

    # A new node takes new workspaces: with the survivors' free slots and its own, four
    # new workspaces spread over the three live nodes fill the new one too.
    newcomer = ray_cluster.add_node("n3")  # (Ray sets signal handlers: on the main thread)
    more = [await cluster.create_workspace() for _ in range(2 * SLOTS - len(kept) + SLOTS)]
    assert sum(ws.node == newcomer.node_id for ws in more) == SLOTS, more
    for ws in more:
        r2 = await cluster.execute("write_file", {"path": "new.txt", "content": "x"}, ws.id)
        assert r2.success and Path(ws.path).parent == ray_cluster.roots[ws.node], r2

    status = await asyncio.to_thread(_cluster_status, ray_cluster.address)
    nodes = {n["node_id"]: n for n in status["nodes"]}
    assert all(set(n) == {"node_id", "alive", "slots", "used", "workspaces"} for n in status["nodes"]), status
    lost = nodes[victim.node_id]
    assert (lost["alive"], lost["used"], lost["workspaces"]) == (False, 0, [gone.id]), lost
    assert nodes[newcomer.node_id]["alive"] and nodes[newcomer.node_id]["used"] == SLOTS
    assert sorted(nodes[newcomer.node_id]["workspaces"]) == sorted(w.id for w in more if w.node == newcomer.node_id)
    assert sum(n["used"] for n in status["nodes"]) == len(kept) + len(more) == 3 * SLOTS

    for ws in [*kept, *more]:
        await cluster.delete_workspace(ws.id, delete_files=True)
    await cluster.aclose()
    # Nothing of its node can be freed: deleting it says so.
    from worker.integrations.ray import NodeLostError

    with pytest.raises(NodeLostError):
        await fresh.delete_workspace(gone.id)


def _cluster_status(address: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "cluster",
            "status",
            "--ray",
            address,
            "--ray-namespace",
            NAMESPACE,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found: dict[str, Any] = json.loads(out.stdout)
    return found
