"""Sandbox latency benchmark: the agent stream vs `docker exec`, and cold start.

For each runtime (runc, and runsc when registered) it measures, in one run and against
the same container:

* read (4 KiB), write (4 KiB), list (depth 2), search (regex over ~200 files) and
  exec `true` through the sandbox API (one request over the open agent stream);
* the same work done with `docker exec` (the Docker API's exec create/start/inspect,
  i.e. what peers do per call, without the CLI's process start);
* cold start: a new workspace directory to the first `exec` result (container create +
  start + agent boot).

It prints one markdown table with p50/p99 in milliseconds and the speed-up over
`docker exec`. Timings on a shared machine are noisy: compare ratios, not absolutes.

With ``--images A,B,C`` it instead compares images (issue 15: any image works, its agent
runs from the mounted runtime): read 4 KiB, exec `true` and cold start on each image, the
images interleaved round by round in one run, with each one's ratio to the first image
(target: within 20 %).

Usage: .venv/bin/python bench/bench_sandbox.py [--iterations N] [--cold N] [--runtimes runc,runsc]
       .venv/bin/python bench/bench_sandbox.py --runtimes runc,runsc \\
           --images loom-sandbox:latest,loom-test-busybox:latest,loom-test-musl:latest
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
from common import gvisor_spec

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend, container_name
from sandbox.spec import SandboxSpec


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def docker_exec(client: Any, cid: str, cmd: list[str], stdin: bytes | None = None) -> bytes:
    """One `docker exec` round trip through the API, as a per-call design would do it."""
    api = client.api
    ex = api.exec_create(cid, cmd, stdin=stdin is not None, workdir="/workspace")
    if stdin is None:
        out = api.exec_start(ex["Id"])
    else:
        sock = api.exec_start(ex["Id"], socket=True)
        raw = getattr(sock, "_sock", sock)
        raw.sendall(stdin)
        raw.shutdown(1)
        out = b""
        while True:
            chunk = raw.recv(65536)
            if not chunk:
                break
            out += chunk
        sock.close()
    api.exec_inspect(ex["Id"])  # the exit code: part of every real call
    return bytes(out)


def make_tree(ws: Path, files: int = 200) -> None:
    for i in range(files):
        d = ws / "src" / f"pkg{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_text(f"def f{i}():\n    return {i}  # needle{i % 7}\n" * 20)
    (ws / "data.txt").write_bytes(os.urandom(2048).hex().encode())  # 4 KiB


async def bench_runtime(runtime: str, n: int, cold_n: int) -> list[tuple[str, list[float], list[float] | None]]:
    backend = DockerBackend(SandboxSpec(runtime=runtime, **gvisor_spec()), worker_id="bench")  # type: ignore[arg-type]
    client = docker.from_env()
    rows: list[tuple[str, list[float], list[float] | None]] = []
    ws = Path(tempfile.mkdtemp(prefix="loom-bench-")).resolve()
    try:
        make_tree(ws)
        box = await backend.get(ws)
        await box.info()
        cid = client.containers.get(container_name(ws)).id
        payload = os.urandom(2048).hex().encode()

        def dx(cmd: list[str], stdin: bytes | None = None) -> Callable[[], Awaitable[Any]]:
            return lambda: asyncio.to_thread(docker_exec, client, cid, cmd, stdin)

        cases: list[tuple[str, Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]] = [
            ("read 4 KiB", lambda: box.read("data.txt"), dx(["cat", "data.txt"])),
            ("write 4 KiB", lambda: box.write("out.txt", payload), dx(["sh", "-c", "cat > out.txt"], payload)),
            ("list depth 2", lambda: box.list(".", depth=2), dx(["find", ".", "-maxdepth", "2"])),
            ("search regex", lambda: box.search("needle3"), dx(["rg", "-n", "needle3", "."])),
            ("exec `true`", lambda: box.exec(ExecRequest("true")), dx(["sh", "-c", "true"])),
        ]
        for name, ours, theirs in cases:
            await timed(ours, 5)  # warm up
            await timed(theirs, 2)
            a = await timed(ours, n)
            b = await timed(theirs, max(10, n // 10))
            rows.append((f"{name} [{runtime}]", a, b))
        await backend.stop(ws)

        cold: list[float] = []
        for _ in range(cold_n):
            cws = Path(tempfile.mkdtemp(prefix="loom-cold-")).resolve()
            t = time.perf_counter()
            cbox = await backend.get(cws)
            await cbox.exec(ExecRequest("true"))
            cold.append((time.perf_counter() - t) * 1000)
            await backend.stop(cws)
            shutil.rmtree(cws, ignore_errors=True)
        rows.append((f"cold start [{runtime}]", cold, None))
    finally:
        await backend.remove_all_started()
        await backend.aclose()
        client.close()
        shutil.rmtree(ws, ignore_errors=True)
    return rows


async def bench_images(images: list[str], runtime: str, n: int, cold_n: int, rounds: int = 10) -> None:
    """read / exec `true` / cold start per image, interleaved (round r measures every image
    in turn), so a slow phase of the machine hits them all alike."""
    backends = {
        img: DockerBackend(SandboxSpec(image=img, runtime=runtime, **gvisor_spec()), worker_id="bench")  # type: ignore[arg-type]
        for img in images
    }
    results: dict[str, dict[str, list[float]]] = {img: {"read": [], "exec": [], "cold": []} for img in images}
    workspaces: list[Path] = []
    try:
        boxes = {}
        for img, backend in backends.items():
            ws = Path(tempfile.mkdtemp(prefix="loom-bench-")).resolve()
            workspaces.append(ws)
            make_tree(ws, files=20)
            boxes[img] = await backend.get(ws)
            await timed(lambda b=boxes[img]: b.read("data.txt"), 20)
            await timed(lambda b=boxes[img]: b.exec(ExecRequest("true")), 20)
        per = max(1, n // rounds)
        for _ in range(rounds):
            for img, box in boxes.items():
                results[img]["read"] += await timed(lambda b=box: b.read("data.txt"), per)
                results[img]["exec"] += await timed(lambda b=box: b.exec(ExecRequest("true")), per)
        for _ in range(cold_n):
            for img, backend in backends.items():
                cws = Path(tempfile.mkdtemp(prefix="loom-cold-")).resolve()
                t = time.perf_counter()
                await (await backend.get(cws)).exec(ExecRequest("true"))
                results[img]["cold"].append((time.perf_counter() - t) * 1000)
                await backend.stop(cws)
                shutil.rmtree(cws, ignore_errors=True)
    finally:
        for backend in backends.values():
            await backend.remove_all_started()
            await backend.aclose()
        for ws in workspaces:
            shutil.rmtree(ws, ignore_errors=True)
    base = results[images[0]]
    print(
        f"\nruntime {runtime}; {n} reads and {n} execs per image in {rounds} interleaved rounds; {cold_n} cold starts\n"
    )
    print("| image | read 4 KiB p50 ms | exec `true` p50 ms | cold start p50 ms ", end="")
    print("| read / first | exec / first | cold / first |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for img in images:
        r = results[img]
        ratios = [pct(r[k], 0.5) / pct(base[k], 0.5) for k in ("read", "exec", "cold")]
        print(
            f"| {img} | {pct(r['read'], 0.5):.3f} | {pct(r['exec'], 0.5):.3f} | {pct(r['cold'], 0.5):.0f} | "
            + " | ".join(f"{x:.2f}" for x in ratios)
            + " |"
        )


def gvisor_registered() -> bool:
    client = docker.from_env()
    try:
        return "runsc" in (client.info().get("Runtimes") or {})
    finally:
        client.close()


def print_table(rows: list[tuple[str, list[float], list[float] | None]]) -> None:
    print("| operation | sandbox p50 ms | sandbox p99 ms | docker exec p50 ms | docker exec p99 ms | speed-up (p50) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, a, b in rows:
        if b is None:
            print(f"| {name} | {pct(a, 0.5):.2f} | {pct(a, 0.99):.2f} | | | |")
        else:
            print(
                f"| {name} | {pct(a, 0.5):.3f} | {pct(a, 0.99):.3f} | {pct(b, 0.5):.2f} | {pct(b, 0.99):.2f} "
                f"| {pct(b, 0.5) / pct(a, 0.5):.0f}x |"
            )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=500)
    ap.add_argument("--cold", type=int, default=10)
    ap.add_argument("--runtimes", default="runc,runsc")
    ap.add_argument("--images", help="compare these images (comma-separated; the first is the reference)")
    args = ap.parse_args()
    if args.images:
        for runtime in args.runtimes.split(","):
            if runtime == "runsc" and not gvisor_registered():
                continue
            await bench_images(args.images.split(","), runtime, args.iterations, args.cold)
        return
    rows = []
    for runtime in args.runtimes.split(","):
        if runtime == "runsc" and not gvisor_registered():
            print("(runsc not registered: skipped)")
            continue
        rows += await bench_runtime(runtime, args.iterations, args.cold)
    print(f"\nmachine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; n={args.iterations} per sandbox op\n")
    print_table(rows)
    print(f"\nmedian of medians: {statistics.median(pct(a, 0.5) for _, a, _ in rows):.3f} ms")


if __name__ == "__main__":
    asyncio.run(main())
