"""HTTP service benchmark: ``read_file`` round trip through ``loom-worker serve`` on loopback,
sustained calls/s with N concurrent clients on N workspaces, and the worker's RSS.

Starts the real service (a subprocess, Docker sandbox backend, changelog on), so the
numbers include uvicorn, FastAPI validation, auth, the registry and the sandbox round trip.

Each latency and throughput figure is measured with two clients, because the client's own
cost is a large part of a loopback round trip on a small machine: ``httpx`` (async, pure
Python; about 1 ms of client CPU per call here) and the standard library's
``http.client`` (synchronous keep-alive, run in threads; the cheapest Python client, close
to what curl or a Go/Rust agent costs). The worker's own share is read back from its log:
the registry's ``duration_ms`` for each ``read_file`` call.

    .venv/bin/python bench/bench_http.py [--calls 1000] [--clients 16] [--seconds 10]

Prints a markdown table (and writes it to bench/results/http.md).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from common import free_port

REPO = Path(__file__).resolve().parents[1]
CONTENT = ("x" * 63 + "\n") * 64  # 4 KiB


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class StdlibClient:
    """One keep-alive ``http.client`` connection (blocking; use from one thread)."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        self.conn.request(method, path, body, self.headers)
        r = self.conn.getresponse()
        return r.status, r.read()

    def close(self) -> None:
        self.conn.close()


def stdlib_latency(port: int, token: str, method: str, path: str, body: bytes | None, n: int) -> list[float]:
    """``n`` sequential calls after a warm-up; milliseconds each. Raises AssertionError on a failed call."""
    c = StdlibClient(port, token)
    try:
        for _ in range(50):
            c.call(method, path, body)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            status, out = c.call(method, path, body)
            lat.append((time.perf_counter() - t) * 1000)
            assert status == 200 and (body is None or json.loads(out)["success"]), out[:300]
        return lat
    finally:
        c.close()


def stdlib_throughput(port: int, token: str, paths: list[str], body: bytes, seconds: float) -> tuple[int, int]:
    """One thread and connection per path, each calling in a loop; returns (ok, errors)."""
    stop_at = time.monotonic() + seconds
    counts = [0, 0]
    lock = threading.Lock()

    def run(path: str) -> None:
        c = StdlibClient(port, token)
        ok = bad = 0
        try:
            while time.monotonic() < stop_at:
                status, out = c.call("POST", path, body)
                if status == 200 and json.loads(out)["success"]:
                    ok += 1
                else:
                    bad += 1
        finally:
            c.close()
            with lock:
                counts[0] += ok
                counts[1] += bad

    threads = [threading.Thread(target=run, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts[0], counts[1]


def logged_durations(log_path: Path, start: int, tool: str) -> list[float]:
    """The registry's ``duration_ms`` of every ``tool`` call logged after byte ``start``."""
    out = []
    with open(log_path, "rb") as f:
        f.seek(start)
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "tool.call" and ev.get("tool") == tool and ev.get("success"):
                out.append(float(ev["duration_ms"]))
    return out


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
            rows.append(("HTTP floor: GET /healthz p50 (httpx)", f"{statistics.median(floor):.2f} ms"))

            # 1. Latency: one client, sequential calls, keep-alive connection.
            for _ in range(50):  # warm up
                await c.post(f"/v1/workspaces/{names[0]}/execute", json=read)
            log.flush()
            log_start = (tmp / "server.log").stat().st_size
            lat = []
            for _ in range(args.calls):
                t = time.perf_counter()
                r = await c.post(f"/v1/workspaces/{names[0]}/execute", json=read)
                lat.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200 and r.json()["success"]
            inside = logged_durations(tmp / "server.log", log_start, "read_file")
            rows += [
                ("read_file 4 KiB, HTTP round trip p50 (httpx)", f"{statistics.median(lat):.2f} ms"),
                ("read_file 4 KiB, HTTP round trip p90 (httpx)", f"{pct(lat, 0.9):.2f} ms"),
                ("read_file 4 KiB, HTTP round trip p99 (httpx)", f"{pct(lat, 0.99):.2f} ms"),
            ]
            if inside:
                rows.append(
                    ("read_file inside the worker (registry, from its log) p50", f"{statistics.median(inside):.2f} ms")
                )

            # 1b. The same with the cheapest Python client.
            floor_s = await asyncio.to_thread(stdlib_latency, port, token, "GET", "/healthz", None, args.calls)
            body = json.dumps(read).encode()
            lat_s = await asyncio.to_thread(
                stdlib_latency, port, token, "POST", f"/v1/workspaces/{names[0]}/execute", body, args.calls
            )
            rows += [
                ("HTTP floor: GET /healthz p50 (http.client)", f"{statistics.median(floor_s):.2f} ms"),
                ("read_file 4 KiB, HTTP round trip p50 (http.client)", f"{statistics.median(lat_s):.2f} ms"),
                ("read_file 4 KiB, HTTP round trip p90 (http.client)", f"{pct(lat_s, 0.9):.2f} ms"),
                ("read_file 4 KiB, HTTP round trip p99 (http.client)", f"{pct(lat_s, 0.99):.2f} ms"),
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
        t0 = time.monotonic()
        ok_s, bad_s = await asyncio.to_thread(
            stdlib_throughput,
            port,
            token,
            [f"/v1/workspaces/{n}/execute" for n in names],
            json.dumps(read).encode(),
            args.seconds,
        )
        elapsed_s = time.monotonic() - t0
        rss_load = rss_mb(proc.pid)
        rows += [
            (
                f"sustained read_file calls/s, {len(names)} clients on {len(names)} workspaces (httpx, one process)",
                f"{sum(counts) / elapsed:,.0f} /s ({errors[0]} errors)",
            ),
            (
                f"sustained read_file calls/s, {len(names)} clients on {len(names)} workspaces (http.client threads)",
                f"{ok_s / elapsed_s:,.0f} /s ({bad_s} errors)",
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
