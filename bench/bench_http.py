"""HTTP service benchmark: ``read_file`` round trip through ``loom-worker serve`` on loopback,
sustained calls/s with N concurrent clients on N workspaces, and the worker's RSS.

Starts the real service (a subprocess, Docker sandbox backend, changelog on), so the
numbers include uvicorn, FastAPI validation, auth, the registry and the sandbox round trip.

    .venv/bin/python bench/bench_http.py [--calls 1000] [--clients 16] [--seconds 10]

Prints a markdown table (and writes it to bench/results/http.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
CONTENT = ("x" * 63 + "\n") * 64  # 4 KiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000, help="sequential read_file calls for the latency")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients, one workspace each")
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of the throughput run")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-http-")).resolve()
    token = secrets.token_urlsafe(16)
    port = free_port()
    env = {
        **os.environ,
        "LOOM_WORKSPACE_ROOT": str(tmp / "ws"),
        "LOOM_DATA_DIR": str(tmp / "data"),
        "LOOM_API_TOKEN": token,
        "LOOM_PORT": str(port),
        "LOOM_LOG_FORMAT": "json",
        "LOOM_MAX_CONCURRENT_CALLS": str(max(64, args.clients * 2)),
    }
    loom = str(Path(sys.executable).with_name("loom-worker"))
    log = open(tmp / "server.log", "wb")  # noqa: ASYNC230 (once, before measuring)
    proc = subprocess.Popen([loom, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"}
    rows: list[tuple[str, str]] = []
    try:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as c:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await c.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"service did not start; see {tmp / 'server.log'}")
                await asyncio.sleep(0.1)
            rss_idle = rss_mb(proc.pid)
            names = [f"b{i:02d}" for i in range(args.clients)]
            for n in names:
                assert (await c.post("/v1/workspaces", json={"name": n})).status_code == 201
                r = await c.post(
                    f"/v1/workspaces/{n}/execute",
                    json={"tool": "write_file", "arguments": {"path": "f.txt", "content": CONTENT}},
                )
                assert r.json()["success"], r.text
            read = {"tool": "read_file", "arguments": {"path": "f.txt"}}

            # 0. The floor on this machine: the same client and server, no tool.
            for _ in range(50):
                await c.get("/healthz")
            floor = []
            for _ in range(args.calls):
                t = time.perf_counter()
                await c.get("/healthz")
                floor.append((time.perf_counter() - t) * 1000)
            rows.append(("HTTP floor: GET /healthz p50 (same client, no tool)", f"{statistics.median(floor):.2f} ms"))

            # 1. Latency: one client, sequential calls, keep-alive connection.
            for _ in range(50):  # warm up
                await c.post(f"/v1/workspaces/{names[0]}/execute", json=read)
            lat = []
            for _ in range(args.calls):
                t = time.perf_counter()
                r = await c.post(f"/v1/workspaces/{names[0]}/execute", json=read)
                lat.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200 and r.json()["success"]
            rows += [
                ("read_file 4 KiB, HTTP round trip p50", f"{statistics.median(lat):.2f} ms"),
                ("read_file 4 KiB, HTTP round trip p90", f"{pct(lat, 0.9):.2f} ms"),
                ("read_file 4 KiB, HTTP round trip p99", f"{pct(lat, 0.99):.2f} ms"),
            ]

        # 2. Throughput: N clients, each on its own workspace and connection.
        stop_at = time.monotonic() + args.seconds
        counts = [0] * len(names)
        errors = [0]

        async def client(i: int) -> None:
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as cc:
                while time.monotonic() < stop_at:
                    r = await cc.post(f"/v1/workspaces/{names[i]}/execute", json=read)
                    if r.status_code == 200 and r.json()["success"]:
                        counts[i] += 1
                    else:
                        errors[0] += 1

        t0 = time.monotonic()
        await asyncio.gather(*(client(i) for i in range(len(names))))
        elapsed = time.monotonic() - t0
        rss_load = rss_mb(proc.pid)
        rows += [
            (
                f"sustained read_file calls/s, {len(names)} clients on {len(names)} workspaces",
                f"{sum(counts) / elapsed:,.0f} /s ({errors[0]} errors)",
            ),
            ("worker RSS, idle after start", f"{rss_idle:.0f} MB"),
            (f"worker RSS, after the load ({len(names)} sandboxes open)", f"{rss_load:.0f} MB"),
        ]
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as c:
            for n in names:
                await c.delete(f"/v1/workspaces/{n}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)

    table = "| measure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    print(table)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "http.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
