"""Ray cluster benchmark: the cost of the hop, and placement, in one run.

* ``read_file`` of a small file, one call at a time, through the local API
  (``default_registry`` in this process, the baseline) and through the cluster API
  (``ClusterRegistry``: one call to the node service, which runs the same registry), over
  the node's call channel (the default) and over Ray's actor calls (``direct=False``),
  each surface in turn: p50, p99 and calls/s of each, the hop's cost (target: <= 1 ms
  added to the p50), and the floor of each way to a node (a no-op call);
* ``POST .../execute`` of the same ``read_file`` through the HTTP front door
  (``loom-worker serve --ray``'s app, served on loopback by this process): p50, p99;
* workspaces created per second over ``--nodes`` nodes (``--workspaces`` of them, placed
  ``--concurrency`` at a time; target: 100 with 0 errors), then deleted.

The cluster is real: ``ray.cluster_utils.Cluster`` on this machine (a raylet per node,
:func:`worker.integrations.ray.testing.local_cluster`), every node on the one Docker
engine. Both sides share the machine's two cores with Ray's own processes (a GCS and a
raylet per node), so the hop measured here includes their competition for the CPU.

Usage: .venv/bin/python bench/bench_ray.py [--n 500] [--workspaces 100] [--nodes 3] [--slots 64] [--hop-only]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

#: The tree whose ``worker`` is measured (``LOOM_BENCH_TREE``: another checkout, to compare
#: two trees with this one script in the same run).
ROOT = Path(os.environ.get("LOOM_BENCH_TREE") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import ray  # noqa: E402

from worker.integrations.ray import RESOURCE, ClusterRegistry  # noqa: E402
from worker.integrations.ray.testing import local_cluster, remove_sandboxes  # noqa: E402
from worker.registry import default_registry  # noqa: E402
from worker.result import ToolResult  # noqa: E402
from worker.settings import Settings  # noqa: E402

NAMESPACE = "loom-bench"
IMAGE = os.environ.get("LOOM_IMAGE", "loom-sandbox:latest")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    r = await call()
    ms = (time.perf_counter() - t) * 1000
    assert getattr(r, "success", True), r.output
    return ms


@contextlib.asynccontextmanager
async def _front_door(root: Path, address: str) -> AsyncIterator[str]:
    """``loom-worker serve --ray``'s app on a loopback port of this loop; its base URL."""
    import uvicorn

    from worker.integrations.ray.cli import front_door

    app = front_door(Settings(data_dir=root / "front-data", catalog=False), address, NAMESPACE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def hop(root: Path, n: int, address: str) -> dict[str, list[float]]:
    """``read_file`` of one small file, one call at a time, on each surface in turn (so
    each sees the same moments of the machine): the local API, the cluster API over the
    node's channel, the cluster API over Ray's actor calls; and the floors of the two ways
    to a node: a no-op over the channel, a no-op async actor call."""
    ws = root / "local-ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    settings = Settings(data_dir=root / "local-data", image=IMAGE, catalog=False)
    channel = ClusterRegistry(namespace=NAMESPACE, place_timeout=120)
    actor_calls = ClusterRegistry(namespace=NAMESPACE, direct=False)
    noop = Noop.remote()  # type: ignore[attr-defined]
    async with (
        default_registry(settings) as local,
        _front_door(root, address) as front,
        httpx.AsyncClient(base_url=front, timeout=60) as http,
    ):
        remote = await channel.create_workspace()
        try:
            loc = await channel._locate(remote.id)
            read = {"path": "f.txt"}
            request = {"tool": "read_file", "arguments": read}

            async def through_front_door() -> ToolResult:
                r = await http.post(f"/v1/workspaces/{remote.id}/execute", json=request)
                assert r.status_code == 200, r.text
                return ToolResult(**r.json())

            surfaces: dict[str, Callable[[], Awaitable[Any]]] = {
                "local": lambda: local.execute("read_file", read, ws),
                "channel": lambda: channel.execute("read_file", read, remote.id),
                "ray": lambda: actor_calls.execute("read_file", read, remote.id),
                "front door": through_front_door,
                "channel floor": lambda: channel._invoke(remote.id, loc, "ping"),
                "ray floor": lambda: noop.call.remote(),
            }
            for where, reg in ((ws, local), (remote.id, channel)):
                r = await reg.execute("write_file", {"path": "f.txt", "content": "x" * 1000}, where)
                assert r.success, r.output
            out: dict[str, list[float]] = {k: [] for k in surfaces}
            for i in range(n + 20):  # the first 20 of each warm up
                for name, call in surfaces.items():
                    ms = await timed(call)
                    if i >= 20:
                        out[name].append(ms)
            return out
        finally:
            await local.stop(ws)
            await channel.delete_workspace(remote.id, delete_files=True)
            await channel.aclose()
            await actor_calls.aclose()
            ray.kill(noop)


async def placement(cluster: ClusterRegistry, count: int, concurrency: int) -> tuple[float, int, dict[str, int], float]:
    """(seconds to create ``count``, errors, workspaces per node, seconds to delete them)."""
    gate = asyncio.Semaphore(concurrency)
    errors = 0
    made = []

    async def one() -> None:
        nonlocal errors
        async with gate:
            try:
                made.append(await cluster.create_workspace())
            except Exception as e:
                errors += 1
                print(f"create failed: {type(e).__name__}: {e}", file=sys.stderr)

    t = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    created = time.perf_counter() - t
    per_node: dict[str, int] = {}
    for ws in made:
        per_node[ws.node or "?"] = per_node.get(ws.node or "?", 0) + 1

    async def drop(ws_id: str) -> None:
        async with gate:
            await cluster.delete_workspace(ws_id, delete_files=True)

    t = time.perf_counter()
    await asyncio.gather(*(drop(ws.id) for ws in made))
    return created, errors, per_node, time.perf_counter() - t


@ray.remote(num_cpus=0)
class Noop:
    async def call(self) -> bool:
        return True


async def _placements(args: argparse.Namespace) -> dict[str, tuple[float, int, dict[str, int], float]]:
    cluster = ClusterRegistry(namespace=NAMESPACE, place_timeout=120)
    # First on the fresh cluster (a node's service starts with its first workspace: a
    # process, once per node), then again with every node's service running.
    rounds = {"the nodes' services starting": await placement(cluster, args.workspaces, args.concurrency)}
    for _ in range(300):  # the freed slots back in Ray's view (the raylets report them)
        if ray.available_resources().get(RESOURCE, 0) >= ray.cluster_resources().get(RESOURCE, 0):
            break
        await asyncio.sleep(0.1)
    rounds["the nodes' services running"] = await placement(cluster, args.workspaces, args.concurrency)
    await cluster.aclose()
    return rounds


async def run(args: argparse.Namespace, address: str, root: Path) -> None:
    rounds = {} if args.hop_only else await _placements(args)
    times = await hop(root, args.n, address)

    def row(name: str, xs: list[float]) -> str:
        rate = len(xs) / (sum(xs) / 1000)
        return f"| {name} | {statistics.median(xs):.3f} | {pct(xs, 99):.3f} | {rate:.0f} |"

    def added(name: str, xs: list[float]) -> str:
        local = times["local"]
        return (
            f"| {name} | {statistics.median(xs) - statistics.median(local):+.3f} | "
            f"{pct(xs, 99) - pct(local, 99):+.3f} | |"
        )

    print(f"\nread_file of a 1 KB file, {args.n} calls of each surface one at a time, in turn (same run)\n")
    print("| surface | p50 ms | p99 ms | calls/s |")
    print("|---|---:|---:|---:|")
    print(row("local API (this process, baseline)", times["local"]))
    print(row(f"cluster API, node channel ({args.nodes} nodes; the default)", times["channel"]))
    print(row("cluster API, Ray actor calls (direct=False)", times["ray"]))
    print(added("the hop over the channel (cluster - local)", times["channel"]))
    print(added("the hop over Ray actor calls (cluster - local)", times["ray"]))
    print(row("floor: a no-op over the node channel", times["channel floor"]))
    print(row("floor: a no-op async Ray actor call", times["ray floor"]))
    print(row("HTTP front door: POST .../execute (serve --ray)", times["front door"]))
    if not rounds:
        return
    what = f"{args.workspaces} workspaces over {args.nodes} nodes ({args.slots} slots each)"
    print(f"\n{what}, {args.concurrency} at a time\n")
    print("| workspaces | created/s | errors | per node | deleted/s |")
    print("|---|---:|---:|---|---:|")
    for name, (created, errors, per_node, deleted) in rounds.items():
        spread = " / ".join(str(v) for v in sorted(per_node.values(), reverse=True))
        print(
            f"| {args.workspaces}, {name} | {args.workspaces / created:.1f} | {errors} | {spread} | "
            f"{(args.workspaces - errors) / deleted:.1f} |"
        )
    if any(r[1] for r in rounds.values()):
        raise SystemExit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=500, help="read_file calls per side")
    p.add_argument("--workspaces", type=int, default=100)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--slots", type=int, default=64, help="loom_sandboxes of each node")
    p.add_argument("--hop-only", action="store_true", help="the calls only, not the placements")
    args = p.parse_args()
    # At least room for all, and an ordinary node's slots (docs/ray.md's example: 64): a
    # cluster nearly full makes concurrent creators wait on each other (docs/ray.md).
    args.slots = max(args.slots, -(-args.workspaces // args.nodes) + 1)
    root = Path(tempfile.mkdtemp(prefix="loom-bench-ray-")).resolve()
    try:
        t = time.perf_counter()
        env = {"LOOM_IMAGE": IMAGE, "LOOM_CATALOG": "false"}
        with local_cluster(root, nodes=args.nodes, slots=args.slots, env=env) as lc:
            ray.init(address=lc.address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
            print(f"cluster of {args.nodes} nodes up in {time.perf_counter() - t:.1f}s")
            try:
                asyncio.run(run(args, lc.address, root))
            finally:
                ray.shutdown()
    finally:
        remove_sandboxes(root)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
