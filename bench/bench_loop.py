"""What a Python API user's event loop costs: one caller, calls back to back, on asyncio's
own loop (``asyncio.run``) and on uvloop (``worker.run``, what the CLI and the service run
on), through ``default_registry()`` (changelog, call journal, per-workspace settings) and
through a bare ``ToolRegistry`` on the same backend (none of those), so the table splits a
call's time into the loop's share and the rest.

    .venv/bin/python bench/bench_loop.py [--n 2000] [--rounds 3] [--tree PATH]

Each cell is a fresh process (this checkout, or ``--tree``'s, with its own
``.venv/bin/python`` when it has one), the rounds interleaved; medians of the rounds' p50s
(ms) and of the worker's CPU per call (ms, ``time.process_time``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CALLS = {
    "read_file": {"path": "read4k.txt"},
    "shell_execute": {"command": "true"},
}


async def load(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-loop-"))
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "read4k.txt").write_text(("0123456789abcdef" * 4 + "\n") * 63)
    if args.registry == "default":
        from worker import default_registry

        reg = default_registry(data_dir=tmp / "data", catalog=False, image=args.image)
    else:
        from sandbox.docker import DockerBackend
        from sandbox.spec import SandboxSpec
        from worker import ToolRegistry

        reg = ToolRegistry(backend=DockerBackend(SandboxSpec(image=args.image)))
    out: dict[str, Any] = {}
    try:
        for name, arguments in CALLS.items():
            for _ in range(100):
                await reg.execute(name, arguments, str(ws))
            n = args.n if name == "read_file" else max(50, args.n // 10)
            times = []
            cpu = time.process_time()
            for _ in range(n):
                t = time.perf_counter()
                r = await reg.execute(name, arguments, str(ws))
                times.append((time.perf_counter() - t) * 1000.0)
                if not r.success:
                    raise SystemExit(f"{name} failed: {r.error}")
            out[name] = {"p50": statistics.median(times), "cpu": (time.process_time() - cpu) * 1000.0 / n}
    finally:
        await reg.stop(str(ws))
        await reg.aclose()
    return out


def child(args: argparse.Namespace) -> None:
    import logging

    logging.getLogger("worker").setLevel(logging.WARNING)
    logging.getLogger("sandbox").setLevel(logging.WARNING)
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(load(args))
    else:
        result = asyncio.run(load(args))
    print(json.dumps(result))


def run_child(tree: Path, args: argparse.Namespace, loop: str, registry: str) -> dict[str, Any]:
    python = tree / ".venv" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(PYTHONPATH=str(tree), LOOM_LOG_LEVEL="warning")
    argv = [str(python) if python.exists() else sys.executable, str(Path(__file__).resolve()), "--child"]
    argv += ["--loop", loop, "--registry", registry, "--n", str(args.n), "--image", args.image]
    p = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"{tree} {loop} {registry} failed:\n{p.stderr[-3000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main(args: argparse.Namespace) -> None:
    trees = [("this", ROOT)] + ([("other", Path(args.tree).resolve())] if args.tree else [])
    cells = [(t, loop, reg) for t in trees for reg in ("default", "bare") for loop in ("asyncio", "uvloop")]
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for (label, tree), loop, reg in cells if r % 2 == 0 else cells[::-1]:
            results.setdefault((label, loop, reg), []).append(run_child(tree, args, loop, reg))
    print(
        f"\none caller, calls back to back, {args.image}; medians of {args.rounds} rounds (p50 ms / CPU ms per call)\n"
    )
    print("| tree | registry | loop | " + " | ".join(f"{n} p50 | {n} CPU" for n in CALLS) + " |")
    print("|---|---|---|" + "---:|" * (2 * len(CALLS)))
    for (label, _tree), loop, reg in cells:
        rows = results[(label, loop, reg)]
        vals = []
        for name in CALLS:
            vals.append(f"{statistics.median(x[name]['p50'] for x in rows):.3f}")
            vals.append(f"{statistics.median(x[name]['cpu'] for x in rows):.3f}")
        print(f"| {label} | {reg} | {loop} | " + " | ".join(vals) + " |")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="read_file calls per cell (shell_execute: a tenth)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", help="another loom-worker checkout, measured the same way")
    ap.add_argument("--image", default=os.environ.get("LOOM_IMAGE", "loom-sandbox:latest"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    ap.add_argument("--registry", default="default", help=argparse.SUPPRESS)
    return ap.parse_args()


if __name__ == "__main__":
    a = parse_args()
    if a.child:
        child(a)
    else:
        main(a)
