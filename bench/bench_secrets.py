"""Secrets benchmark: an HTTPS request that carries a secret (the gateway terminates TLS,
adds the header and speaks TLS again to the host) against the same request to a host
without secrets (a spliced tunnel, as every other allowed host) and against the host
directly, in one run, interleaved round by round.

* time to first byte of a small request (curl's ``time_starttransfer``, a new connection
  each time: TCP, the proxy's CONNECT, TLS and the answer's first byte); target:
  intercepted <= 1.5x spliced;
* throughput of a large download (curl's ``speed_download``); target: intercepted >= 0.5x
  spliced.

Both names are one HTTPS server of this script's on a loopback address (a test CA the
gateway trusts through ``LOOM_EGRESS_UPSTREAM_CA`` and the sandbox through its CA bundle;
loopback allowed by ``LOOM_EGRESS_TRUSTED_NETWORKS``), so the only difference between the
two sandbox rows is interception. The gateway resolves the names with a resolver of the
script's own (no real lookup is made).

Usage: .venv/bin/python bench/bench_secrets.py [--runtime runc|runsc] [--rounds 11] [--mb 256]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import multiprocessing
import os
import random
import shutil
import ssl
import statistics
import subprocess
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trustme

from worker.registry import default_registry
from worker.settings import Settings

HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
SECRET_HOST, PLAIN_HOST = "secret.bench.test", "plain.bench.test"


def serve(cert_pem: bytes, key_pem: bytes, address: str, mb: int) -> None:
    """HTTPS on ``address``:443 for both names, until killed: /small (a few bytes), /big
    (``mb`` MiB). Runs in a process of its own: in this one it would share the
    interpreter's lock with the gateway's event loop, which a real host never does."""
    chunk = os.urandom(1 << 20)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            big = self.path == "/big"
            self.send_response(200)
            self.send_header("Content-Length", str(mb << 20 if big else 3))
            self.end_headers()
            if not big:
                self.wfile.write(b"ok\n")
                return
            for _ in range(mb):
                self.wfile.write(chunk)

        def log_message(self, *args: object) -> None:
            pass

    d = Path(tempfile.mkdtemp(prefix="loom-bench-origin-"))
    (d / "cert.pem").write_bytes(cert_pem)
    (d / "key.pem").write_bytes(key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(d / "cert.pem", d / "key.pem")
    shutil.rmtree(d)
    srv = ThreadingHTTPServer((address, 443), Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    ready.set()
    srv.serve_forever()


ready = multiprocessing.get_context("fork").Event()


def start_origin(ca: trustme.CA, address: str, mb: int) -> multiprocessing.Process:
    cert = ca.issue_cert(SECRET_HOST, PLAIN_HOST)
    cert_pem = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
    proc = multiprocessing.get_context("fork").Process(
        target=serve, args=(cert_pem, cert.private_key_pem.bytes(), address, mb), daemon=True
    )
    proc.start()
    if not ready.wait(30):
        raise SystemExit("the origin server did not start")
    return proc


def host_curl(url: str, address: str, ca_file: Path, what: str) -> float:
    host = url.split("/")[2]
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "--cacert",
            str(ca_file),
            "--resolve",
            f"{host}:443:{address}",
            "-o",
            "/dev/null",
            "-w",
            what,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


async def sandbox_curl(registry: Any, ws: Path, url: str, what: str) -> float:
    r = await registry.execute(
        "shell_execute", {"command": f"curl -sS -o /dev/null -w '{what}' {url}", "timeout": 600}, workspace=str(ws)
    )
    if not r.success:
        raise SystemExit(f"sandbox curl failed: {url}\n{r.output}")
    return float(r.output.strip())


def med(values: list[float]) -> float:
    return statistics.median(values)


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-secrets-"))
    ca = trustme.CA()
    ca_file = tmp / "bench-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    address = f"127.{random.randint(100, 250)}.{random.randint(0, 250)}.{random.randint(2, 250)}"
    origin = start_origin(ca, address, args.mb)
    trust = tmp / "sandbox-trust.pem"
    trust.write_bytes(Path(HOST_CA).read_bytes() + ca_file.read_bytes())
    ws = tmp / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    settings = Settings(
        data_dir=tmp / "data",
        runtime=args.runtime,
        ca_bundle=trust,
        egress_trusted_networks=f"{address}/32",
        egress_upstream_ca=ca_file,
        catalog=False,
        cpus=args.cpus,
    )
    rows = {k: [] for k in ("ttfb_h", "ttfb_s", "ttfb_i", "tput_h", "tput_s", "tput_i")}  # type: dict[str, list[float]]
    try:
        async with default_registry(settings) as registry:
            make = registry.pool.egress_factory

            async def resolver(host: str, port: int) -> list[Any]:
                return [ipaddress.ip_address(address)]

            def factory() -> Any:
                gw = make()
                gw.upstream.resolver = resolver
                return gw

            registry.pool.egress_factory = factory
            await registry.configure_workspace(ws, {"egress": [SECRET_HOST, PLAIN_HOST]})
            registry.configs.secrets.store.set(
                ws,
                "BENCH_TOKEN",
                hosts=[SECRET_HOST],
                header="Authorization: Bearer {value}",
                value="bench-" + "v" * 40,
            )
            ttfb, speed = "%{time_starttransfer}", "%{speed_download}"
            for host in (SECRET_HOST, PLAIN_HOST):  # warm: the container, the relay, the leaf certificate
                await sandbox_curl(registry, ws, f"https://{host}/small", ttfb)
            for _ in range(args.rounds):
                for key, host in (("h", SECRET_HOST), ("s", PLAIN_HOST), ("i", SECRET_HOST)):
                    small, big = f"https://{host}/small", f"https://{host}/big"
                    if key == "h":
                        rows["ttfb_h"].append(await asyncio.to_thread(host_curl, small, address, ca_file, ttfb) * 1000)
                        rows["tput_h"].append(await asyncio.to_thread(host_curl, big, address, ca_file, speed) / 1e6)
                    else:
                        rows[f"ttfb_{key}"].append(await sandbox_curl(registry, ws, small, ttfb) * 1000)
                        rows[f"tput_{key}"].append(await sandbox_curl(registry, ws, big, speed) / 1e6)
            status = registry.egress_status(ws, limit=100_000)
            await registry.stop(ws)
    finally:
        origin.kill()
        origin.join()
        shutil.rmtree(tmp, ignore_errors=True)
    uses = sum(1 for e in status["entries"] if e["kind"] == "secret" and e["verdict"] == "allowed")
    print(
        f"runtime {args.runtime}; sandbox cpus {args.cpus:g} (host: {os.cpu_count()}); {args.rounds} interleaved "
        f"rounds; medians; {uses} requests with the secret added (logged)"
    )
    print()
    print(
        "| measurement | unit | host directly | sandbox, spliced (no secret) | sandbox, intercepted (secret) "
        "| intercepted / spliced | target |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    t = {k: med(v) for k, v in rows.items()}
    print(
        f"| time to first byte, small HTTPS request (new connection) | ms | {t['ttfb_h']:.1f} | {t['ttfb_s']:.1f} "
        f"| {t['ttfb_i']:.1f} | {t['ttfb_i'] / t['ttfb_s']:.2f} | <= 1.5 |"
    )
    print(
        f"| download of {args.mb} MiB over HTTPS | MB/s | {t['tput_h']:.1f} | {t['tput_s']:.1f} | {t['tput_i']:.1f} "
        f"| {t['tput_i'] / t['tput_s']:.2f} | >= 0.5 |"
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=("runc", "runsc"), default="runc")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--mb", type=int, default=256, help="size of the large download")
    ap.add_argument("--cpus", type=float, default=1.0, help="the sandbox's CPU limit (default 1, as LOOM_CPUS)")
    return ap.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
