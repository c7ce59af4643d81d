"""Background processes: the ``process_output`` round trip (target p50 <= 1 ms), next to
``read_file`` of a small file in the same run, both through ``ToolRegistry.execute`` on
one warm sandbox; and starting a background process (``shell_execute`` with
``background``) next to running ``true`` in the foreground.

Usage: .venv/bin/python bench/bench_processes.py [--runtime runc|runsc] [--n 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from worker import aio
from worker.registry import default_registry
from worker.settings import Settings


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def timed(registry: Any, ws: Path, tool: str, args: dict[str, Any]) -> float:
    t = time.perf_counter()
    r = await registry.execute(tool, args, workspace=str(ws))
    ms = (time.perf_counter() - t) * 1000
    if not r.success:
        raise SystemExit(f"{tool} failed: {r.output}")
    return ms


async def main(a: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-proc-"))
    ws = tmp / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    (ws / "small.txt").write_text("x" * 4096)
    settings = Settings(data_dir=tmp / "data", runtime=a.runtime, catalog=False)
    rows = []
    try:
        async with default_registry(settings) as reg:
            r = await reg.execute(
                "shell_execute",
                {"command": "while true; do echo tick; sleep 0.01; done", "background": True},
                workspace=str(ws),
            )
            pid = r.data["process_id"]
            out, read = [], []
            for _ in range(a.n):  # interleaved
                out.append(await timed(reg, ws, "process_output", {"process_id": pid}))
                read.append(await timed(reg, ws, "read_file", {"path": "small.txt"}))
            await reg.execute("process_kill", {"process_id": pid}, workspace=str(ws))
            start, fg = [], []
            for _ in range(a.starts):
                t = time.perf_counter()
                r = await reg.execute("shell_execute", {"command": "sleep 60", "background": True}, workspace=str(ws))
                start.append((time.perf_counter() - t) * 1000)
                await reg.execute("process_kill", {"process_id": r.data["process_id"]}, workspace=str(ws))
                fg.append(await timed(reg, ws, "shell_execute", {"command": "true"}))
            await reg.stop(ws)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        ("process_output (a running process printing)", out, "<= 1 ms"),
        ("read_file 4 KiB (same run)", read, "-"),
        ("shell_execute background (start)", start, "-"),
        ("shell_execute `true` (foreground, same run)", fg, "-"),
    ]
    print(f"runtime {a.runtime}; {a.n} interleaved rounds; {a.starts} starts")
    print()
    print("| measurement | n | p50 ms | p90 ms | mean ms | target |")
    print("|---|---:|---:|---:|---:|---|")
    for name, vals, target in rows:
        p50, p90, mean = pct(vals, 0.5), pct(vals, 0.9), statistics.mean(vals)
        print(f"| {name} | {len(vals)} | {p50:.2f} | {p90:.2f} | {mean:.2f} | {target} |")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=("runc", "runsc"), default="runc")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--starts", type=int, default=10)
    return ap.parse_args()


if __name__ == "__main__":
    aio.run(main(parse_args()))
