"""Ray cluster benchmark: the cost of the hop, and placement, in one run.

* ``read_file`` of a small file, one call at a time, through the local API
  (``default_registry`` in this process, the baseline) and through the cluster API
  (``ClusterRegistry``: one actor call to the node service, which runs the same registry):
  p50, p99 and calls/s of each, and the hop's cost (target: <= 1 ms added to the p50);
* workspaces created per second over ``--nodes`` nodes (``--workspaces`` of them, placed
  ``--concurrency`` at a time; target: 100 with 0 errors), then deleted.

The cluster is real: ``ray.cluster_utils.Cluster`` on this machine (a raylet per node,
:func:`worker.integrations.ray.testing.local_cluster`), every node on the one Docker
engine. Both sides share the machine's two cores with Ray's own processes (a GCS and a
raylet per node), so the hop measured here includes their competition for the CPU.

Usage: .venv/bin/python bench/bench_ray.py [--n 500] [--workspaces 100] [--nodes 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from worker.integrations.ray import ClusterRegistry  # noqa: E402
from worker.integrations.ray.testing import local_cluster, remove_sandboxes  # noqa: E402
from worker.registry import default_registry  # noqa: E402
from worker.settings import Settings  # noqa: E402

NAMESPACE = "loom-bench"
IMAGE = os.environ.get("LOOM_IMAGE", "loom-sandbox:latest")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def timed_calls(call: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await call()  # type: ignore[operator]
        out.append((time.perf_counter() - t) * 1000)
        assert r.success, r.output
    return out


async def local_side(root: Path, n: int) -> list[float]:
    ws = root / "local-ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    settings = Settings(data_dir=root / "local-data", image=IMAGE, catalog=False)
    async with default_registry(settings) as reg:
        try:
            r = await reg.execute("write_file", {"path": "f.txt", "content": "x" * 1000}, ws)
            assert r.success, r.output
            await timed_calls(lambda: reg.execute("read_file", {"path": "f.txt"}, ws), 20)  # warm
            return await timed_calls(lambda: reg.execute("read_file", {"path": "f.txt"}, ws), n)
        finally:
            await reg.stop(ws)


async def cluster_side(cluster: ClusterRegistry, n: int) -> list[float]:
    ws = await cluster.create_workspace()
    try:
        r = await cluster.execute("write_file", {"path": "f.txt", "content": "x" * 1000}, ws.id)
        assert r.success, r.output
        await timed_calls(lambda: cluster.execute("read_file", {"path": "f.txt"}, ws.id), 20)
        return await timed_calls(lambda: cluster.execute("read_file", {"path": "f.txt"}, ws.id), n)
    finally:
        await cluster.delete_workspace(ws.id, delete_files=True)


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


async def ray_floor(n: int) -> list[float]:
    """An awaited call of a no-op method of an async actor: what any hop through Ray costs."""
    actor = Noop.remote()  # type: ignore[attr-defined]

    class Ok:
        success = True

    async def call() -> Ok:
        await actor.call.remote()
        return Ok()

    await timed_calls(call, 20)
    try:
        return await timed_calls(call, n)
    finally:
        ray.kill(actor)


async def run(args: argparse.Namespace, address: str, root: Path) -> None:
    local = await local_side(root, args.n)
    cluster = ClusterRegistry(namespace=NAMESPACE, place_timeout=120)
    remote = await cluster_side(cluster, args.n)
    floor = await ray_floor(args.n)
    created, errors, per_node, deleted = await placement(cluster, args.workspaces, args.concurrency)
    await cluster.aclose()

    print(f"\nread_file of a 1 KB file, {args.n} calls one at a time (same run, medians of {args.n})\n")
    print("| surface | p50 ms | p99 ms | calls/s |")
    print("|---|---:|---:|---:|")
    for name, xs in (("local API (this process, baseline)", local), (f"cluster API ({args.nodes} nodes)", remote)):
        print(f"| {name} | {statistics.median(xs):.3f} | {pct(xs, 99):.3f} | {len(xs) / (sum(xs) / 1000):.0f} |")
    print(
        f"| the hop (cluster - local) | {statistics.median(remote) - statistics.median(local):+.3f} | "
        f"{pct(remote, 99) - pct(local, 99):+.3f} | |"
    )
    print(
        f"| Ray's floor: a no-op async actor call | {statistics.median(floor):.3f} | {pct(floor, 99):.3f} | "
        f"{len(floor) / (sum(floor) / 1000):.0f} |"
    )
    what = f"{args.workspaces} workspaces over {args.nodes} nodes ({args.slots} slots each)"
    print(f"\n{what}, {args.concurrency} at a time\n")
    print("| workspaces | created/s | errors | per node | deleted/s |")
    print("|---|---:|---:|---|---:|")
    spread = " / ".join(str(v) for v in sorted(per_node.values(), reverse=True))
    print(
        f"| {args.workspaces} | {args.workspaces / created:.1f} | {errors} | {spread} | "
        f"{(args.workspaces - errors) / deleted:.1f} |"
    )
    if errors:
        raise SystemExit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=500, help="read_file calls per side")
    p.add_argument("--workspaces", type=int, default=100)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_args()
    args.slots = -(-args.workspaces // args.nodes) + 1
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
