"""Port benchmark: an HTTP server running inside the sandbox, measured from inside the
sandbox (the baseline) and from the host through ``loom-worker port-forward`` and through
the service's port proxy (``loom-worker serve``, ``/v1/workspaces/{id}/ports/{port}/``),
in one run, under each runtime:

* request round trip, p50: a small GET on a kept-alive connection, and on a new
  connection each time (through the tunnel that is a tunnel opened per request);
* a ``--mb`` MB download's throughput (GET) and upload's (POST), MB/s, median of
  ``--rounds``.

The same client code runs in both places (a stdlib script, sent into the sandbox with
``exec``), so only the path differs. The service's proxy sends each request with
``Connection: close`` to the app (one tunnel per request), so there its kept-alive row is
the client's connection to the service only.

Usage: .venv/bin/python bench/bench_ports.py [--runtime runc|runsc|both] [--requests 200] [--mb 100]
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
from pathlib import Path
from typing import Any

import httpx
from common import env_for, free_port

from worker.registry import default_registry
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "worker.cli"]
APP_PORT = 8090

SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
BLOCK = b"x" * (1 << 20)

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body are two writes: with Nagle, a kept-alive client's delayed ACK
    # holds the body ~40 ms (inside the sandbox too), which would hide every other cost.
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def do_GET(self):
        n = int(self.path.rsplit("/", 1)[1] or 0)
        self.send_response(200)
        self.send_header("Content-Length", str(n))
        self.end_headers()
        while n > 0:
            self.wfile.write(BLOCK[: min(n, len(BLOCK))])
            n -= len(BLOCK)
    def do_POST(self):
        left = int(self.headers["Content-Length"])
        while left:
            left -= len(self.rfile.read(min(left, 1 << 20)))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

#: Run where it measures (host or sandbox): prints one JSON object.
CLIENT = r"""
import http.client, json, sys, time
from urllib.parse import urlsplit
base, n, mb, auth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
u = urlsplit(base)
headers = {"Authorization": auth} if auth else {}
def conn():
    return http.client.HTTPConnection(u.hostname, u.port, timeout=600)
def get(c, path):
    c.request("GET", u.path + path, headers=headers)
    r = c.getresponse()
    while r.read(1 << 20):
        pass
    assert r.status == 200, r.status
def med(xs):
    xs = sorted(xs); return xs[len(xs) // 2]
c = conn(); get(c, "/100")
keep = []
for _ in range(n):
    t = time.perf_counter(); get(c, "/100"); keep.append(time.perf_counter() - t)
fresh = []
for _ in range(n):
    t = time.perf_counter(); c2 = conn(); get(c2, "/100"); c2.close(); fresh.append(time.perf_counter() - t)
size = mb << 20
t = time.perf_counter(); get(c, "/%d" % size); down = size / (time.perf_counter() - t) / 1e6
body = b"y" * size
t = time.perf_counter()
c.request("POST", u.path + "/up", body=body, headers=headers)
r = c.getresponse(); r.read(); assert r.status == 200
up = size / (time.perf_counter() - t) / 1e6
print(json.dumps({"keep_ms": med(keep) * 1e3, "fresh_ms": med(fresh) * 1e3, "down": down, "up": up}))
"""


async def host_client(base: str, args: argparse.Namespace, auth: str = "") -> dict[str, float]:
    p = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        base,
        str(args.requests),
        str(args.mb),
        auth,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await p.communicate()
    assert p.returncode == 0, err.decode()[-2000:]
    result: dict[str, float] = json.loads(out)
    return result


async def sandbox_client(registry: Any, ws: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = f"python3 client.py http://127.0.0.1:{APP_PORT} {args.requests} {args.mb} ''"
    r = await registry.execute("shell_execute", {"command": cmd, "timeout": 300}, ws)
    assert r.success, r.output
    result: dict[str, float] = json.loads(r.data["stdout"])
    return result


async def wait_line(stream: asyncio.StreamReader) -> str:
    return (await asyncio.wait_for(stream.readline(), 300)).decode()


async def one_runtime(runtime: str, args: argparse.Namespace) -> list[tuple[str, list[dict[str, float]]]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-ports-"))
    root = tmp / "root"
    ws_id = "ws-" + secrets.token_hex(3)
    ws = root / ws_id
    ws.mkdir(parents=True)
    (ws / "server.py").write_text(SERVER)
    (ws / "client.py").write_text(CLIENT)
    for p in (ws, ws / "server.py", ws / "client.py"):
        os.chown(p, 1000, 1000)
    run = tmp / "run"
    run.mkdir(mode=0o700)
    env = env_for(runtime, tmp / "data", run)
    settings = Settings(runtime=runtime, data_dir=tmp / "data", image=env["LOOM_IMAGE"])
    procs: list[asyncio.subprocess.Process] = []
    try:
        async with default_registry(settings, catalog=False, changelog=False) as registry:
            try:
                rows = await measure(registry, env, root, ws, args, procs)
            finally:
                for p in procs:  # first: nothing may start the sandbox again
                    if p.returncode is None:
                        p.terminate()
                        await p.wait()
                await registry.stop(ws)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [(f"{runtime}: {k}", v) for k, v in rows.items()]


async def measure(
    registry: Any,
    env: dict[str, str],
    root: Path,
    ws: Path,
    args: argparse.Namespace,
    procs: list[asyncio.subprocess.Process],
) -> dict[str, list[dict[str, float]]]:
    """The rounds, interleaved; the processes it starts go to ``procs``."""
    rows: dict[str, list[dict[str, float]]] = {"inside the sandbox (baseline)": [], "port-forward": [], "proxy": []}
    sandbox: Any = (await registry.workspace(ws)).sandbox
    server = await sandbox.spawn(["python3", "server.py", str(APP_PORT)])
    wait = f"for i in $(seq 100); do curl -sf http://127.0.0.1:{APP_PORT}/1 >/dev/null && exit 0; sleep 0.1; done"
    assert (await registry.execute("shell_execute", {"command": wait + "; exit 1"}, ws)).success
    forward = await asyncio.create_subprocess_exec(
        *CLI, "port-forward", "-w", str(ws), f":{APP_PORT}", env=env, stdout=subprocess.PIPE
    )
    procs.append(forward)
    assert forward.stdout is not None
    fport = int((await wait_line(forward.stdout)).split(":")[1].split()[0])
    sport = free_port()
    token = secrets.token_hex(8)
    senv = {**env, "LOOM_WORKSPACE_ROOT": str(root), "LOOM_API_TOKEN": token, "LOOM_PORT": str(sport)}
    service = await asyncio.create_subprocess_exec(
        *CLI, "serve", env=senv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    procs.append(service)
    async with httpx.AsyncClient() as c:
        for _ in range(300):
            try:
                if (await c.get(f"http://127.0.0.1:{sport}/healthz")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    proxy = f"http://127.0.0.1:{sport}/v1/workspaces/{ws.name}/ports/{APP_PORT}"
    for _ in range(args.rounds):  # interleaved, so a busy moment hits every path alike
        rows["inside the sandbox (baseline)"].append(await sandbox_client(registry, ws, args))
        rows["port-forward"].append(await host_client(f"http://127.0.0.1:{fport}", args))
        rows["proxy"].append(await host_client(proxy, args, f"Bearer {token}"))
    await server.close()
    return rows


async def main(args: argparse.Namespace) -> None:
    runtimes = ["runc", "runsc"] if args.runtime == "both" else [args.runtime]
    results = []
    for runtime in runtimes:
        results += await one_runtime(runtime, args)
    print(
        f"\nHTTP server in the sandbox; medians of {args.rounds} rounds; round trips: p50 of {args.requests} "
        f"requests; {args.mb} MB transfers\n"
    )
    print(
        "| runtime: path | round trip p50, kept-alive (ms) | round trip p50, new connection (ms) "
        "| download (MB/s) | upload (MB/s) | download vs inside | upload vs inside |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    base: dict[str, float] = {}
    for name, rounds in results:
        m = {k: statistics.median(r[k] for r in rounds) for k in ("keep_ms", "fresh_ms", "down", "up")}
        if name.endswith("(baseline)"):
            base = m
        print(
            f"| {name} | {m['keep_ms']:.2f} | {m['fresh_ms']:.2f} | {m['down']:.0f} | {m['up']:.0f} "
            f"| {m['down'] / base['down']:.2f} | {m['up'] / base['up']:.2f} |"
        )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", choices=("runc", "runsc", "both"), default="both")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    return ap.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
