"""E2B's API benchmark: E2B's own Python SDK against ``loom-worker serve``, beside loom's
own HTTP API in the same run and on the same service (targets: create-to-first-command
p50 <= 0.3 s under runc; a command's round trip <= 3 x loom's own API's):

* create to first command: ``Sandbox.create()`` then ``commands.run("true")``, a new
  sandbox each time (E2B publishes 0.44 s for its median, Daytona 0.11 s); beside it
  loom's ``POST /v1/workspaces`` then ``POST .../sandbox/exec``;
* a command's round trip: ``sbx.commands.run("true")`` beside ``POST
  /v1/workspaces/{id}/sandbox/exec {"cmd": "true"}`` on the same sandbox, interleaved
  (E2B's SDK runs every command as ``/bin/bash -l -c CMD``: loom's API running that same
  command is shown too, without a target);
* a 4 KB file written and read back: ``sbx.files.write`` + ``read`` beside ``PUT`` +
  ``GET .../sandbox/files``, interleaved;
* 50 sandboxes created at once (threads, each ``Sandbox.create()`` + ``run("true")``):
  the wall time until all have answered, beside 50 of loom's own.

The service runs in a process of its own (``LOOM_E2B_API=true``, a token), under each
runtime in turn; the SDK reaches it the way a user's code does, through
``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY``.

Usage: .venv/bin/python bench/bench_e2b.py [--runtime runc|runsc|both] [--rounds 50] [--creates 20] [--concurrent 50]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from common import env_for, free_port

CLI = [sys.executable, "-m", "worker.cli"]
DATA = os.urandom(4096)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def serve(runtime: str, tmp: Path, token: str) -> tuple[subprocess.Popen[bytes], str]:
    """``loom-worker serve`` with E2B's API, in a process of its own."""
    root, run = tmp / "root", tmp / "run"
    root.mkdir()
    run.mkdir(mode=0o700)
    port = free_port()
    env = env_for(runtime, tmp / "data", run)
    env.update(
        {
            "LOOM_WORKSPACE_ROOT": str(root),
            "LOOM_API_TOKEN": token,
            "LOOM_PORT": str(port),
            "LOOM_E2B_API": "true",
            "LOOM_UID": "1000",
            "LOOM_GID": "1000",
            "LOOM_CATALOG": "false",
        }
    )
    # (its log to a file: a pipe nobody reads would stop the service once full)
    log = open(tmp / "serve.log", "wb")
    p = subprocess.Popen([*CLI, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                return p, base
        except httpx.HTTPError:
            pass
        if p.poll() is not None:
            raise RuntimeError("the service did not start: " + (tmp / "serve.log").read_text(errors="replace")[-2000:])
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("the service did not start")


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000.0


def one_runtime(runtime: str, args: argparse.Namespace) -> list[tuple[str, str, str, list[float]]]:
    from e2b import Sandbox

    tmp = Path(tempfile.mkdtemp(prefix="bench-e2b-"))
    token = secrets.token_hex(16)
    service, base = serve(runtime, tmp, token)
    os.environ.update({"E2B_API_URL": base, "E2B_SANDBOX_URL": base, "E2B_API_KEY": token})
    rows: dict[tuple[str, str], list[float]] = {}
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=300)
    made: list[Any] = []
    try:

        def loom_create_and_run() -> str:
            ws = api.post("/v1/workspaces", json={}).json()["id"]
            r = api.post(f"/v1/workspaces/{ws}/sandbox/exec", json={"cmd": "true"})
            assert r.status_code == 200 and r.json()["returncode"] == 0, r.text
            return str(ws)

        def e2b_create_and_run() -> Any:
            sbx = Sandbox.create()
            assert sbx.commands.run("true").exit_code == 0
            return sbx

        # warm: the image, the service's first sandbox
        made.append(e2b_create_and_run())
        loom_create_and_run()
        for _ in range(args.creates):
            t = time.perf_counter()
            made.append(e2b_create_and_run())
            rows.setdefault(("create to first command", "E2B SDK: Sandbox.create + commands.run"), []).append(
                (time.perf_counter() - t) * 1000.0
            )
            rows.setdefault(("create to first command", "loom API: POST workspaces + sandbox/exec"), []).append(
                timed(loom_create_and_run)
            )
            made[-1].kill()

        sbx = made[0]
        ws = sbx.sandbox_id
        path = "/home/user/bench-4k.bin"

        def e2b_run() -> None:
            assert sbx.commands.run("true").exit_code == 0

        def loom_run() -> None:
            r = api.post(f"/v1/workspaces/{ws}/sandbox/exec", json={"cmd": "true"})
            assert r.status_code == 200 and r.json()["returncode"] == 0, r.text

        def loom_run_same() -> None:  # what E2B's SDK asks for: a login bash
            r = api.post(f"/v1/workspaces/{ws}/sandbox/exec", json={"cmd": ["/bin/bash", "-l", "-c", "true"]})
            assert r.status_code == 200 and r.json()["returncode"] == 0, r.text

        def e2b_file() -> None:
            sbx.files.write(path, DATA)
            assert sbx.files.read(path, format="bytes") == DATA

        def loom_file() -> None:
            files, where = f"/v1/workspaces/{ws}/sandbox/files", {"path": "bench-4k.bin"}
            assert api.put(files, params=where, content=DATA).is_success
            assert api.get(files, params=where).content == DATA

        for label, pair in {
            "command round trip (true)": (e2b_run, loom_run),
            "4 KB file write + read": (e2b_file, loom_file),
        }.items():
            for fn in pair:
                fn()
            for _ in range(args.rounds):
                rows.setdefault((label, "E2B SDK"), []).append(timed(pair[0]))
                rows.setdefault((label, "loom API"), []).append(timed(pair[1]))
                if pair[1] is loom_run:
                    rows.setdefault((label, "(loom API, E2B's command: bash -l -c true)"), []).append(
                        timed(loom_run_same)
                    )

        n = args.concurrent
        with ThreadPoolExecutor(n) as pool:
            t = time.perf_counter()
            many = list(pool.map(lambda _i: e2b_create_and_run(), range(n)))
            rows[(f"{n} created at once", "E2B SDK: all answered")] = [(time.perf_counter() - t) * 1000.0]
            # (each burst alone: 100 sandboxes at once is another measure, and more than
            # this 2-core machine runs under gVisor)
            list(pool.map(lambda s: s.kill(), many))
            t = time.perf_counter()
            ids = list(pool.map(lambda _i: loom_create_and_run(), range(n)))
            rows[(f"{n} created at once", "loom API: all answered")] = [(time.perf_counter() - t) * 1000.0]
            list(pool.map(lambda i: api.delete(f"/v1/workspaces/{i}"), ids))
    finally:
        for s in made:
            try:
                s.kill()
            except Exception:  # (already killed)
                pass
        api.close()
        service.terminate()
        service.wait(60)
        subprocess.run(
            [*CLI, "gc", "--all"],
            env={**env_for(runtime, tmp / "data", tmp / "run")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        shutil.rmtree(tmp, ignore_errors=True)
    return [(runtime, label, name, values) for (label, name), values in rows.items()]


def main(args: argparse.Namespace) -> None:
    import e2b

    runtimes = ["runc", "runsc"] if args.runtime == "both" else [args.runtime]
    results: list[Any] = []
    for runtime in runtimes:
        results += one_runtime(runtime, args)
    base = {(rt, label): statistics.median(v) for rt, label, name, v in results if name.startswith("loom") and v}
    print(
        f"\nE2B's Python SDK {e2b.__version__ if hasattr(e2b, '__version__') else ''} against loom-worker serve, "
        f"beside loom's own API on the same service; {args.creates} creates, {args.rounds} interleaved rounds\n"
    )
    print("| runtime | measure | path | p50 (ms) | p99 (ms) | n | x loom API | target |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for rt, label, name, values in results:
        p50 = statistics.median(values)
        ratio = p50 / base[(rt, label)] if (rt, label) in base and not name.startswith("loom") else float("nan")
        target = ""
        if name.startswith("E2B") and label == "create to first command":
            target = ("yes" if p50 <= 300 else "NO") + " (<= 0.3 s)" if rt == "runc" else "(runc's)"
        elif name.startswith("E2B") and label.startswith("command round trip"):
            target = ("yes" if ratio <= 3 else "NO") + " (<= 3x)"
        shown = f"{ratio:.2f}" if ratio == ratio else ""
        print(f"| {rt} | {label} | {name} | {p50:.1f} | {pct(values, 0.99):.1f} | {len(values)} | {shown} | {target} |")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", choices=("runc", "runsc", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=50, help="Interleaved rounds of each round trip.")
    ap.add_argument("--creates", type=int, default=20, help="Sandboxes created one after another (timed).")
    ap.add_argument("--concurrent", type=int, default=50, help="Sandboxes created at once.")
    return ap.parse_args()


if __name__ == "__main__":
    main(parse_args())
