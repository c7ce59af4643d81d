"""Egress benchmark: through the gateway from inside a sandbox versus the host directly,
in one run, interleaved round by round.

* time to first byte of a small HTTPS request to PyPI (curl's ``time_starttransfer``);
* throughput of a large HTTPS download from a test server on this machine's loopback
  (allowed by the operator's trusted-network override, ``LOOM_EGRESS_TRUSTED_NETWORKS``,
  which is what it is for), curl's ``speed_download``; target: ratio >= 0.8;
* ``pip install --target`` of a package with a few dependencies (requests: urllib3,
  idna, charset-normalizer, certifi), wall time of the command.

Inside the sandbox the timings are curl's and the command's own, so the tool call's
overhead is not counted. The host reaches PyPI through this machine's TLS-intercepting
proxy, and so does the gateway: both paths pay it.

Usage: .venv/bin/python bench/bench_egress.py [--runtime runc|runsc|both] [--rounds 7] [--mb 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trustme

from worker.registry import default_registry
from worker.settings import Settings

HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
PYPI_URL = "https://pypi.org/simple/six/"


def big_server(mb: int) -> tuple[ThreadingHTTPServer, int]:
    """An HTTPS server on 127.0.0.1 answering /big with ``mb`` MiB (self-signed)."""
    chunk = os.urandom(1 << 20)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(mb << 20))
            self.end_headers()
            for _ in range(mb):
                self.wfile.write(chunk)

        def log_message(self, *args: object) -> None:
            pass

    ca = trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def host_curl(args: list[str]) -> float:
    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", *args], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


PIP = "pip install -q --no-cache-dir --disable-pip-version-check"


def host_pip(target: Path) -> float:
    shutil.rmtree(target, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", *PIP.split(), "--target", str(target), "requests"],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t


async def sandbox_cmd(registry: Any, ws: Path, command: str, timeout: float = 600) -> Any:
    r = await registry.execute("shell_execute", {"command": command, "timeout": timeout}, workspace=str(ws))
    if not r.success:
        raise SystemExit(f"sandbox command failed: {command}\n{r.output}")
    return r


def med(values: list[float]) -> float:
    return statistics.median(values)


async def main(args: argparse.Namespace) -> None:
    srv, port = big_server(args.mb)
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-egress-"))
    runtimes = ["runc", "runsc"] if args.runtime == "both" else [args.runtime]
    settings = Settings(
        data_dir=tmp / "data",
        runtime=runtimes[0],
        ca_bundle=Path(HOST_CA),
        egress_trusted_networks="127.0.0.1/32",
        catalog=False,
        cpus=args.cpus,
    )
    host: dict[str, list[float]] = {"ttfb": [], "tput": [], "pip": []}
    box: dict[str, dict[str, list[float]]] = {r: {"ttfb": [], "tput": [], "pip": []} for r in runtimes}
    allowed = 0
    try:
        async with default_registry(settings) as registry:
            spaces = {}
            for runtime in runtimes:  # one workspace per runtime, the rounds interleaved
                ws = tmp / f"ws-{runtime}"
                ws.mkdir()
                os.chown(ws, 1000, 1000)
                await registry.configure_workspace(ws, {"egress": ["pypi", f"127.0.0.1:{port}"], "runtime": runtime})
                await sandbox_cmd(registry, ws, f"curl -sS -o /dev/null {PYPI_URL}")  # warm: container, relay
                spaces[runtime] = ws
            proxy = "-x http://127.0.0.1:3128 --noproxy ''"
            big = f"https://127.0.0.1:{port}/big"
            for _ in range(args.rounds):
                host["ttfb"].append(
                    await asyncio.to_thread(host_curl, ["-w", "%{time_starttransfer}", PYPI_URL]) * 1000
                )
                host["tput"].append(await asyncio.to_thread(host_curl, ["-k", "-w", "%{speed_download}", big]) / 1e6)
                for runtime, ws in spaces.items():
                    r = await sandbox_cmd(
                        registry, ws, f"curl -sS -o /dev/null -w '%{{time_starttransfer}}' {PYPI_URL}"
                    )
                    box[runtime]["ttfb"].append(float(r.output.strip()) * 1000)
                    r = await sandbox_cmd(
                        registry, ws, f"curl -sS -k {proxy} -o /dev/null -w '%{{speed_download}}' {big}"
                    )
                    box[runtime]["tput"].append(float(r.output.strip()) / 1e6)
            for _ in range(args.pip_rounds):
                host["pip"].append(await asyncio.to_thread(host_pip, tmp / "host-target"))
                for runtime, ws in spaces.items():
                    r = await sandbox_cmd(registry, ws, f"rm -rf /tmp/t && {PIP} --target /tmp/t requests")
                    box[runtime]["pip"].append(float((r.data or {})["duration_ms"]) / 1000)
            for ws in spaces.values():
                status = registry.egress_status(ws, limit=10_000)
                allowed += sum(1 for e in status["entries"] if e["verdict"] == "allowed")
                await registry.stop(ws)
    finally:
        srv.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    measurements = [
        ("time to first byte, small HTTPS request to PyPI", "ms", "ttfb", False),
        (f"download of {args.mb} MiB over HTTPS from a local server", "MB/s", "tput", True),
        ("pip install --target: requests and its 4 dependencies", "s", "pip", False),
    ]
    platform = os.environ.get("LOOM_GVISOR_PLATFORM", "systrap")
    print(
        f"runtimes {', '.join(runtimes)} (gVisor platform {platform}); sandbox cpus {args.cpus:g} "
        f"(host: {os.cpu_count()}); {args.rounds} interleaved rounds (pip: {args.pip_rounds}); medians; "
        f"{allowed} allowed connections logged"
    )
    print()
    head = "| measurement | unit | host directly |"
    head += "".join(f" {r} through the gateway |" for r in runtimes)
    head += "".join(f" {r}: ratio (gateway speed / direct) |" for r in runtimes)
    head += " runsc / runc (speed) |" if len(runtimes) > 1 else ""
    print(head)
    print("|---|---|" + "---:|" * (head.count("|") - 3))
    for name, unit, key, higher_better in measurements:
        if not host[key]:
            continue  # not measured this run (--pip-rounds 0)
        h = med(host[key])
        vals = [med(box[r][key]) for r in runtimes]
        ratios = [(v / h if higher_better else h / v) for v in vals]
        cells = [f"{h:.1f}", *(f"{v:.1f}" for v in vals), *(f"{x:.2f}" for x in ratios)]
        if len(runtimes) > 1:
            cells.append(f"{ratios[1] / ratios[0]:.2f}")
        print(f"| {name} | {unit} | " + " | ".join(cells) + " |")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=("runc", "runsc", "both"), default="runc")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pip-rounds", type=int, default=3)
    ap.add_argument("--mb", type=int, default=256, help="size of the large download")
    ap.add_argument(
        "--cpus",
        type=float,
        default=1.0,
        help="the sandbox's CPU limit (default 1, as LOOM_CPUS): the host's curl has every core, and "
        "the sandbox's curl decrypts under this quota; the host's core count measures the gateway alone",
    )
    return ap.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
