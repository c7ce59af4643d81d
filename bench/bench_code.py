"""Code interpreter benchmark: one execution's round trip, for each surface, beside a
kernel started on this host and driven by ``jupyter_client`` in the same run (targets:
``1 + 1``'s p50 <= 1.5 x the host kernel's; the first execution in a new workspace,
sandbox and kernel start included, <= 2 s under runc):

* baseline: an IPython kernel on the host (``jupyter_client.KernelManager``), a
  ``BlockingKernelClient`` sending ``execute`` and waiting for the reply and the idle
  status (what any Jupyter client does);
* the harness API: ``registry.sandbox(ws).run_code(...)`` in this process (recorded in the
  changelog, as every execution is);
* HTTP: ``POST /v1/workspaces/{id}/code/execute`` of ``loom-worker serve`` (a separate
  process), its NDJSON read whole by an httpx client;
* the service's floor: ``GET /healthz`` on the same connection (what any HTTP round
  trip costs here, kernel or not);
* the model's ``run_code`` tool (``registry.execute("run_code", ...)``): measured once a
  tool of that name is registered (issue 41's other half), else shown as not there.

Two programs: ``1 + 1`` (the round trip) and a 1 MiB stdout (``sys.stdout.write('x' *
(1 << 20))``: what an execution keeps of a stream). Paths are interleaved round by round
so a busy moment hits each alike. Then the first execution in a new workspace: a fresh
workspace's ``run_code("1 + 1")``, the sandbox's start and the kernel's included.

Usage: .venv/bin/python bench/bench_code.py [--runtime runc|runsc|both] [--rounds 100] [--first 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from common import env_for, free_port

from worker.registry import default_registry
from worker.settings import Settings

CLI = [sys.executable, "-m", "worker.cli"]
PROGRAMS = {"1 + 1": "1 + 1", "1 MiB stdout": "import sys\nsys.stdout.write('x' * (1 << 20))"}
#: The model tool's name, measured when a tool of that name is registered.
TOOL = "run_code"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class HostKernel:
    """The baseline: an IPython kernel on this host, a blocking jupyter_client client."""

    def __init__(self) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str) -> None:
        msg_id = self.kc.execute(code, allow_stdin=False)
        idle = reply = False
        while not (idle and reply):
            if not reply:
                msg = self.kc.get_shell_msg(timeout=60)
                reply = msg["parent_header"].get("msg_id") == msg_id
            while not idle:
                msg = self.kc.get_iopub_msg(timeout=60)
                idle = (
                    msg["parent_header"].get("msg_id") == msg_id
                    and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"
                )

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


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


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    await fn()
    return (time.perf_counter() - t) * 1000.0


def workspace(root: Path, name: str) -> Path:
    ws = root / name
    ws.mkdir(parents=True)
    os.chown(ws, 1000, 1000)  # as on a developer's machine: the sandbox runs as that user
    return ws


async def one_runtime(
    runtime: str, args: argparse.Namespace, host: HostKernel
) -> list[tuple[str, str, str, list[float]]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-code-"))
    root = tmp / "root"
    ws_id = "ws-" + secrets.token_hex(3)
    ws = workspace(root, ws_id)
    run = tmp / "run"
    run.mkdir(mode=0o700)
    env = env_for(runtime, tmp / "data", run)
    token = secrets.token_hex(8)
    settings = Settings(runtime=runtime, data_dir=tmp / "data", image=env["LOOM_IMAGE"])
    rows: dict[tuple[str, str], list[float]] = {}
    service, base = await serve(env, root, token)
    try:
        async with (
            default_registry(settings, catalog=False) as registry,
            httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=300) as api,
        ):
            handle = registry.sandbox(ws)
            has_tool = registry.get(TOOL) is not None

            async def harness(code: str) -> None:
                ex = await handle.run_code(code)
                assert ex.outcome == "ok", ex

            async def http(code: str) -> None:
                r = await api.post(f"/v1/workspaces/{ws_id}/code/execute", json={"code": code})
                assert r.status_code == 200 and r.text.rstrip().endswith("}"), r.text[-300:]

            async def tool(code: str) -> None:  # the model's tool (issue 41's other half)
                r = await registry.execute(TOOL, {"code": code}, workspace=str(ws))
                assert r.success, r.error

            async def baseline(code: str) -> None:
                host.run(code)

            paths: dict[str, Callable[[str], Awaitable[None]]] = {
                "baseline: host kernel, jupyter_client": baseline,
                "harness API run_code": harness,
                "HTTP code/execute (NDJSON)": http,
            }
            if has_tool:
                paths[f"tool {TOOL} (registry.execute)"] = tool

            async def healthz(_code: str) -> None:  # the service's own floor: no sandbox, no kernel
                assert (await api.get("/healthz")).status_code == 200

            paths["HTTP floor: GET /healthz (no kernel)"] = healthz
            for fn in paths.values():  # warm: the sandbox, the kernel, the service's own
                for code in PROGRAMS.values():
                    await fn(code)
            for label, code in PROGRAMS.items():
                n = args.rounds if label == "1 + 1" else max(5, args.rounds // 10)
                for _ in range(n):
                    for name, fn in paths.items():
                        rows.setdefault((label, name), []).append(await timed(lambda fn=fn, code=code: fn(code)))
            if not has_tool:
                rows[("1 + 1", f"tool {TOOL}: not registered here (issue 41's other half)")] = []
            await registry.stop(ws)
            if runtime == "runc" or args.first_gvisor:
                for i in range(args.first):
                    fresh = workspace(root, f"first-{i}")
                    rows.setdefault(("first execution", "harness API, a new workspace"), []).append(
                        await timed(lambda fresh=fresh: registry.sandbox(fresh).run_code("1 + 1"))
                    )
                    await registry.stop(fresh)
    finally:
        service.terminate()
        await service.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return [(runtime, label, name, values) for (label, name), values in rows.items()]


async def main(args: argparse.Namespace) -> None:
    import ipykernel
    import jupyter_client

    runtimes = ["runc", "runsc"] if args.runtime == "both" else [args.runtime]
    host = HostKernel()
    results: list[Any] = []
    try:
        for runtime in runtimes:
            results += await one_runtime(runtime, args, host)
    finally:
        host.close()
    base = {(rt, label): statistics.median(v) for rt, label, name, v in results if name.startswith("baseline") and v}
    print(
        f"\nexecution round trip (ms), {args.rounds} rounds of 1 + 1, {max(5, args.rounds // 10)} of 1 MiB stdout, "
        f"interleaved; host kernel: ipykernel {ipykernel.__version__}, jupyter_client {jupyter_client.__version__}\n"
    )
    print("| runtime | program | path | p50 (ms) | p99 (ms) | n | x host p50 | target |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for rt, label, name, values in results:
        if not values:
            print(f"| {rt} | {label} | {name} | | | 0 | | |")
            continue
        p50 = statistics.median(values)
        ratio = p50 / base[(rt, label)] if (rt, label) in base else float("nan")
        if name.startswith(("baseline", "HTTP floor")) or label == "1 MiB stdout":
            target = ""
        elif label == "first execution":
            target = ("yes" if p50 <= 2000 else "NO") + " (<= 2 s)" if rt == "runc" else "(runc's)"
        else:
            target = ("yes" if ratio <= 1.5 else "NO") + " (<= 1.5x)"
        shown = "" if label == "first execution" or name.startswith("baseline") else f"{ratio:.2f}"
        print(f"| {rt} | {label} | {name} | {p50:.2f} | {pct(values, 0.99):.2f} | {len(values)} | {shown} | {target} |")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", choices=("runc", "runsc", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=100, help="Executions of 1 + 1 per path (interleaved).")
    ap.add_argument("--first", type=int, default=3, help="New workspaces whose first execution is timed.")
    ap.add_argument("--first-gvisor", action="store_true", help="Time the first execution under gVisor too.")
    return ap.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
