"""The vendors' own tools (worker.native) next to ours, in the same run on one warm sandbox:
Anthropic's persistent ``bash`` (``true``; ``cd`` + ``pwd``) against ``shell_execute`` of
the same command, and the text editor's ``str_replace`` against ``edit_file`` making the
same edit; all through ``ToolRegistry.execute`` with the changelog recording, interleaved.
Target: each native p50 within 1.2x of ours.

Usage: .venv/bin/python bench/bench_native.py [--runtime runc|runsc] [--n 200]
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
from worker.native import install
from worker.registry import default_registry
from worker.settings import Settings

TARGET = 1.2


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def timed(registry: Any, ws: Path, tool: str, args: dict[str, Any]) -> float:
    t = time.perf_counter()
    r = await registry.execute(tool, args, workspace=str(ws))
    ms = (time.perf_counter() - t) * 1000
    if not r.success:
        raise SystemExit(f"{tool} failed: {r.error}")
    return ms


async def main(a: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-native-"))
    ws = tmp / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    (ws / "native.py").write_text("value = 'a'\n" + "# filler line\n" * 200)
    (ws / "ours.py").write_text("value = 'a'\n" + "# filler line\n" * 200)
    for name in ("native.py", "ours.py"):  # the workspace owner's, as a project's files are
        os.chown(ws / name, 1000, 1000)
    settings = Settings(data_dir=tmp / "data", runtime=a.runtime, catalog=False)
    times: dict[str, list[float]] = {k: [] for k in ("bt", "st", "bc", "sc", "ed", "ef")}
    try:
        async with default_registry(settings) as reg:
            install(reg)
            await timed(reg, ws, "bash", {"command": "true"})  # the session starts, the baseline is built
            await timed(reg, ws, "shell_execute", {"command": "true"})
            for i in range(a.n):
                # Interleaved, each pair's order swapped every round and the pairs rotated, so
                # load drifts and the first call after an edit (the changelog re-hashes a file
                # changed within the last second) fall on both sides alike.
                old, new = ("'a'", "'b'") if i % 2 == 0 else ("'b'", "'a'")
                edit = {"command": "str_replace", "path": "/workspace/native.py", "old_str": old, "new_str": new}
                pairs_now = [
                    (("bt", "bash", {"command": "true"}), ("st", "shell_execute", {"command": "true"})),
                    (
                        ("bc", "bash", {"command": "cd /tmp && pwd"}),
                        ("sc", "shell_execute", {"command": "cd /tmp && pwd"}),
                    ),
                    (
                        ("ed", "str_replace_based_edit_tool", edit),
                        ("ef", "edit_file", {"path": "ours.py", "old_str": old, "new_str": new}),
                    ),
                ]
                pairs_now = pairs_now[i % 3 :] + pairs_now[: i % 3]
                for first, second in pairs_now:
                    for key, tool, args in (first, second) if i % 2 == 0 else (second, first):
                        times[key].append(await timed(reg, ws, tool, args))
            await reg.stop(ws)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pairs = [
        ("bash `true` (persistent session)", "bt", "shell_execute `true`", "st"),
        ("bash `cd /tmp && pwd`", "bc", "shell_execute `cd /tmp && pwd`", "sc"),
        ("str_replace_based_edit_tool str_replace", "ed", "edit_file (same edit)", "ef"),
    ]
    print(f"runtime {a.runtime}; {a.n} interleaved rounds; changelog on")
    print()
    print("| measurement | n | p50 ms | p90 ms | mean ms | p50 vs ours | target |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for native, nk, ours, ok in pairs:
        for name, key, ratio in ((native, nk, pct(times[nk], 0.5) / pct(times[ok], 0.5)), (ours, ok, None)):
            vals = times[key]
            p50, p90, mean = pct(vals, 0.5), pct(vals, 0.9), statistics.mean(vals)
            shown = f"{ratio:.2f}x" if ratio is not None else "(baseline)"
            target = f"<= {TARGET}x" if ratio is not None else "-"
            print(f"| {name} | {len(vals)} | {p50:.2f} | {p90:.2f} | {mean:.2f} | {shown} | {target} |")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=("runc", "runsc"), default="runc")
    ap.add_argument("--n", type=int, default=200)
    return ap.parse_args()


if __name__ == "__main__":
    aio.run(main(parse_args()))
