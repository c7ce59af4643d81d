"""Streaming benchmark: the time from a line printed in the sandbox to its arrival at a
streaming client, for each surface, in one run (target: p50 <= 5 ms):

* ``loom-worker exec`` through the local worker (a CLI process reading its own stdout);
* ``POST /v1/workspaces/{id}/execute/stream`` of ``loom-worker serve`` (a separate process),
  read as SSE by an httpx client;
* ``ToolRegistry.execute_stream`` (the Python iterator, in this process);
* baseline: the same program as a plain host subprocess read through a pipe (the floor
  any of them could reach).

The program prints ``--lines`` lines, ``--gap`` seconds apart, each carrying
``time.time()`` as it is written (``python3 -u``: unbuffered); the reader takes
``time.time()`` as the line arrives. Under runc the sandbox reads the host's clock; under
gVisor the sandbox's clock is gVisor's own, kept to the host's, so its latencies carry
that offset too (the baseline row shows the floor). The first lines of each command
(the agent's start-up spin) are left out: they measure the call's start, not the stream.

Usage: .venv/bin/python bench/bench_stream.py [--runtime runc|runsc|both] [--lines 200] [--gap 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import env_for, free_port

from worker import ToolOutput
from worker.registry import default_registry
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "worker.cli"]
SKIP = 3  # first lines of each command left out


def program(lines: int, gap: float) -> str:
    return (
        "import time,sys\n"
        f"for i in range({lines}):\n"
        "    sys.stdout.write('%r\\n' % time.time()); sys.stdout.flush()\n"
        f"    time.sleep({gap})\n"
    )


def latencies(stamped: list[tuple[float, bytes]]) -> list[float]:
    """ms from each line's own timestamp to its arrival (lines split across chunks are joined)."""
    out: list[float] = []
    buf = b""
    for arrived, data in stamped:
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                out.append((arrived - float(line)) * 1000.0)
            except ValueError:
                pass
    return out[SKIP:]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def read_stamped(stream: asyncio.StreamReader) -> list[tuple[float, bytes]]:
    out = []
    while data := await stream.read(65536):
        out.append((time.time(), data))
    return out


async def baseline(prog: str) -> list[float]:
    p = await asyncio.create_subprocess_exec(sys.executable, "-u", "-c", prog, stdout=subprocess.PIPE)
    assert p.stdout is not None
    stamped = await read_stamped(p.stdout)
    await p.wait()
    return latencies(stamped)


async def cli_exec(env: dict[str, str], ws: Path, prog: str) -> list[float]:
    argv = [*CLI, "exec", "-w", str(ws), "--", "python3", "-u", "-c", prog]
    p = await asyncio.create_subprocess_exec(*argv, env=env, stdout=subprocess.PIPE)
    assert p.stdout is not None
    stamped = await read_stamped(p.stdout)
    assert await p.wait() == 0
    return latencies(stamped)


async def http_stream(base: str, ws_id: str, token: str, prog: str) -> list[float]:
    body = {"tool": "shell_execute", "arguments": {"command": f"python3 -u -c {shq(prog)}", "timeout": 300}}
    stamped: list[tuple[float, bytes]] = []
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=300) as c:
        async with c.stream("POST", f"/v1/workspaces/{ws_id}/execute/stream", json=body) as r:
            assert r.status_code == 200, await r.aread()
            event = ""
            async for line in r.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "output":
                    stamped.append((time.time(), json.loads(line[5:])["text"].encode()))
    return latencies(stamped)


async def python_iterator(registry: Any, ws: Path, prog: str) -> list[float]:
    stamped = []
    async for item in registry.execute_stream("shell_execute", {"command": f"python3 -u -c {shq(prog)}"}, ws):
        if isinstance(item, ToolOutput):
            stamped.append((time.time(), item.data))
    return latencies(stamped)


def shq(s: str) -> str:
    import shlex

    return shlex.quote(s)


async def serve(env: dict[str, str], root: Path, token: str) -> tuple[asyncio.subprocess.Process, str]:
    """``loom-worker serve`` in a process of its own (its event loop is not ours)."""
    port = free_port()
    senv = {**env, "LOOM_WORKSPACE_ROOT": str(root), "LOOM_API_TOKEN": token, "LOOM_PORT": str(port)}
    p = await asyncio.create_subprocess_exec(
        *CLI, "serve", env=senv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base) as c:
        for _ in range(300):
            try:
                if (await c.get("/healthz")).status_code == 200:
                    return p, base
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    p.kill()
    raise RuntimeError("the service did not start")


async def one_runtime(runtime: str, args: argparse.Namespace) -> list[tuple[str, list[float]]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    root = tmp / "root"
    ws_id = "ws-" + secrets.token_hex(3)
    ws = root / ws_id
    ws.mkdir(parents=True)
    os.chown(ws, 1000, 1000)  # as on a developer's machine: the sandbox runs as that user
    run = tmp / "run"
    run.mkdir(mode=0o700)
    env = env_for(runtime, tmp / "data", run)
    prog = program(args.lines, args.gap)
    token = secrets.token_hex(8)
    settings = Settings(runtime=runtime, data_dir=tmp / "data", image=env["LOOM_IMAGE"])
    rows: dict[str, list[float]] = {"baseline: host subprocess, pipe": []}
    names = ["cli exec (local worker)", "HTTP execute/stream (SSE)", "Python execute_stream"]
    for n in names:
        rows[n] = []
    service, base = await serve(env, root, token)
    try:
        async with default_registry(settings, catalog=False) as registry:
            try:
                # Warm every path once (container, local worker, connections).
                await cli_exec(env, ws, program(SKIP + 1, 0.01))
                await http_stream(base, ws_id, token, program(SKIP + 1, 0.01))
                await python_iterator(registry, ws, program(SKIP + 1, 0.01))
                for _ in range(args.rounds):  # interleaved, so a busy moment hits every path alike
                    rows["baseline: host subprocess, pipe"] += await baseline(prog)
                    rows[names[0]] += await cli_exec(env, ws, prog)
                    rows[names[1]] += await http_stream(base, ws_id, token, prog)
                    rows[names[2]] += await python_iterator(registry, ws, prog)
            finally:
                await registry.stop(ws)
    finally:
        service.terminate()
        await service.wait()
        stop = [*CLI, "daemon", "stop", "--all"]
        await asyncio.to_thread(subprocess.run, stop, env=env, capture_output=True, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    return [(f"{runtime}: {k}", v) for k, v in rows.items()]


async def main(args: argparse.Namespace) -> None:
    runtimes = ["runc", "runsc"] if args.runtime == "both" else [args.runtime]
    results: list[tuple[str, list[float]]] = []
    for runtime in runtimes:
        results += await one_runtime(runtime, args)
    print(
        f"\nline printed in the sandbox -> arrival at the client (ms), {args.rounds} x {args.lines} lines, "
        f"{args.gap * 1000:g} ms apart, first {SKIP} of each command left out\n"
    )
    print("| path | p50 (ms) | p90 (ms) | p99 (ms) | lines | p50 <= 5 ms |")
    print("|---|---:|---:|---:|---:|---|")
    for name, values in results:
        p50 = statistics.median(values) if values else float("nan")
        verdict = "" if name.split(": ", 1)[1].startswith("baseline") else ("yes" if p50 <= 5 else "NO")
        print(f"| {name} | {p50:.2f} | {pct(values, 0.9):.2f} | {pct(values, 0.99):.2f} | {len(values)} | {verdict} |")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", choices=("runc", "runsc", "both"), default="both")
    ap.add_argument("--lines", type=int, default=100, help="Lines per command.")
    ap.add_argument("--gap", type=float, default=0.02, help="Seconds between lines.")
    ap.add_argument("--rounds", type=int, default=3, help="Commands per path (interleaved).")
    return ap.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
