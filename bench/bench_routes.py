"""One node's HTTP routes, each timed in process: the service app (``create_app`` over the
default Docker registry, changelog and call journal on), driven through ASGI by httpx, so
the figures are the app's own cost per route (routing, validation, the route, the registry,
the sandbox round trip where the route makes one), not the network's.

With ``--tree OTHER``: this checkout and OTHER measured in turn, ``--rounds`` times each
(each round a fresh process), the median of their p50s side by side with the ratio.

    .venv/bin/python bench/bench_routes.py [--n 300] [--rounds 3] [--tree /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("LOOM_BENCH_TREE") or Path(__file__).resolve().parents[1])

#: (method, path under the workspace ``b`` or absolute, JSON body): each route timed.
ROUTES: list[tuple[str, str, dict[str, object] | None]] = [
    ("GET", "/healthz", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/tools", None),
    ("GET", "/v1/workspaces", None),
    ("GET", "/v1/workspaces/b", None),
    ("POST", "/v1/workspaces/b/execute", {"tool": "read_file", "arguments": {"path": "f.txt"}}),
    ("GET", "/v1/workspaces/b/changelog", None),
    ("GET", "/v1/workspaces/b/diff", None),
    ("GET", "/v1/workspaces/b/egress", None),
    ("GET", "/v1/workspaces/b/calls?limit=10", None),
    ("GET", "/v1/workspaces/b/processes", None),
    ("GET", "/v1/workspaces/b/sandbox", None),
    ("GET", "/v1/workspaces/b/sandbox/files?path=/workspace/f.txt", None),
    ("GET", "/v1/workspaces/b/secrets", None),
    ("GET", "/v1/workspaces/b/snapshots", None),
]


async def measure(n: int) -> dict[str, float]:
    """p50 ms of each route of :data:`ROUTES`, ``n`` requests each, taken in turn."""
    sys.path.insert(0, str(ROOT))
    import httpx

    from worker.http import create_app
    from worker.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-routes-")).resolve()
    settings = Settings(workspace_root=tmp / "ws", data_dir=tmp / "data", api_token="t", catalog=False)
    app = create_app(settings)
    times: dict[str, list[float]] = {f"{m} {p}": [] for m, p, _ in ROUTES}
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://127.0.0.1",
                headers={"Authorization": "Bearer t"},
            ) as c,
        ):
            assert (await c.post("/v1/workspaces", json={"name": "b"})).status_code == 201
            r = await c.post(
                "/v1/workspaces/b/execute",
                json={"tool": "write_file", "arguments": {"path": "f.txt", "content": "x" * 1000}},
            )
            assert r.json()["success"], r.text
            for i in range(n + 20):  # the first 20 of each warm up
                for method, path, body in ROUTES:
                    t = time.perf_counter()
                    r = await c.request(method, path, json=body)
                    ms = (time.perf_counter() - t) * 1000
                    assert r.status_code == 200, (path, r.status_code, r.text[:300])
                    if i >= 20:
                        times[f"{method} {path}"].append(ms)
            await c.delete("/v1/workspaces/b")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {k: statistics.median(v) for k, v in times.items()}


def compare(n: int, rounds: int, other: Path) -> None:
    here = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    for _ in range(rounds):
        for name, tree in (("this", here), ("other", other)):
            env = {**os.environ, "LOOM_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)}
            out = subprocess.run(
                [sys.executable, __file__, "--n", str(n), "--json"], env=env, check=True, capture_output=True, text=True
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\none node, in process (ASGI), {n} requests of each route in turn; medians of {rounds} rounds' p50s\n")
    print("| route | this p50 ms | other p50 ms | this / other |")
    print("|---|---:|---:|---:|")
    for method, path, _ in ROUTES:
        key = f"{method} {path}"
        a = statistics.median(r[key] for r in runs["this"])
        b = statistics.median(r[key] for r in runs["other"])
        print(f"| `{key}` | {a:.3f} | {b:.3f} | {a / b:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tree", type=Path, help="another checkout, measured in turn with this one")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tree is not None:
        compare(args.n, args.rounds, args.tree.resolve())
        return
    found = asyncio.run(measure(args.n))
    if args.json:
        print(json.dumps(found))
        return
    for key, ms in found.items():
        print(f"| `{key}` | {ms:.3f} |")


if __name__ == "__main__":
    main()
