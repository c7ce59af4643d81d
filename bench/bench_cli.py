"""The ``loom-worker`` command against ``docker exec`` on the same container (issue 18).

    .venv/bin/python bench/bench_cli.py [--n 20] [--image loom-sandbox:latest] [--compare-with /path/to/checkout]

Every row is a whole process, started and waited for the way a CI step runs it, wall
time from ``subprocess.run`` to its exit:

* ``loom-worker call read_file`` (4 KiB) and ``call shell_execute true`` through the
  local worker (warm: the worker and the sandbox are already running), and the same with
  ``LOOM_CLI_DAEMON=0`` (in-process: what every call did before the worker);
* ``docker exec <container> cat /workspace/read4k.txt`` and ``docker exec <container>
  true`` on the very container the calls use (the Docker CLI, as a script would run it);
* ``loom-worker --help``, ``loom-worker tools`` (from its cache) and ``python -c pass``
  (the interpreter's own start: the floor of any Python CLI);
* with ``--compare-with DIR``, the two calls, ``--help`` and ``tools`` run with
  ``PYTHONPATH=DIR`` too (another checkout of the project, e.g. the main branch before this
  change).

The rows are interleaved round by round (one of each per round), so load from other users
of the machine falls on all of them alike, in two phases: the fast rows (``--n`` rounds),
then the in-process and ``--compare-with`` calls (``--n-slow`` rounds), each of which
spends about a second of CPU on this 2-core machine and would otherwise load the fast
rows' machine; each phase times ``docker exec`` again. The table gives medians and, for
the calls, the ratio to the ``docker exec`` doing the same work in the same phase
(target: at most 1, and the warm call's median at most 30 ms). The packages are
byte-compiled first, as ``pip install`` does: with ``PYTHONDONTWRITEBYTECODE=1`` set
(as on this machine) an editable checkout would otherwise compile its modules on every
start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOM = str(Path(sys.executable).with_name("loom-worker"))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Milliseconds from start to exit; the command must succeed."""
    t = time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ms = (time.perf_counter() - t) * 1000
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed ({p.returncode}): {p.stderr.decode()[-500:]}")
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30, help="rounds of the fast rows (one of each per round)")
    ap.add_argument("--n-slow", type=int, default=10, help="rounds of the in-process rows")
    ap.add_argument("--image", default=os.environ.get("LOOM_IMAGE", "loom-sandbox:latest"))
    ap.add_argument("--compare-with", type=Path, help="another checkout to time the calls with (PYTHONPATH)")
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", "worker", "sandbox"], cwd=ROOT, check=True)
    if args.compare_with:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "worker", "sandbox"], cwd=args.compare_with)

    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-", dir="/tmp"))
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "read4k.txt").write_text(("0123456789abcdef" * 4 + "\n") * 63)  # 4,095 bytes
    run = tmp / "run"
    run.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "XDG_RUNTIME_DIR": str(run),
            "LOOM_DATA_DIR": str(tmp / "data"),
            "LOOM_IMAGE": args.image,
            "LOOM_LOG_LEVEL": "warning",
            "LOOM_CLI_DAEMON": "1",
        }
    )
    off = {**env, "LOOM_CLI_DAEMON": "0"}
    read = ["call", "read_file", "-w", str(ws), "--args", '{"path": "read4k.txt"}']
    true = ["call", "shell_execute", "-w", str(ws), "--args", '{"command": "true"}']
    try:
        first = timed([LOOM, *read], env)  # starts the worker and the sandbox
        timed([LOOM, "tools"], env)  # fills the `tools` cache
        from sandbox.docker import container_name

        container = container_name(ws)
        cat = (["docker", "exec", container, "cat", "/workspace/read4k.txt"], env)
        nop = (["docker", "exec", container, "true"], env)
        fast: dict[str, tuple[list[str], dict[str, str]]] = {
            "call read_file, local worker": ([LOOM, *read], env),
            "docker exec cat": cat,
            "call shell_execute true, local worker": ([LOOM, *true], env),
            "docker exec true": nop,
            "loom-worker --help": ([LOOM, "--help"], env),
            "loom-worker tools (cached)": ([LOOM, "tools"], env),
            "python -c pass": ([sys.executable, "-c", "pass"], env),
        }
        slow: dict[str, tuple[list[str], dict[str, str]]] = {
            "call read_file, in-process (LOOM_CLI_DAEMON=0)": ([LOOM, *read], off),
            "docker exec cat": cat,
            "call shell_execute true, in-process (LOOM_CLI_DAEMON=0)": ([LOOM, *true], off),
            "docker exec true": nop,
        }
        if args.compare_with:
            other = {**off, "PYTHONPATH": str(args.compare_with.resolve())}
            slow[f"call read_file, {args.compare_with}"] = ([LOOM, *read], other)
            slow[f"call shell_execute true, {args.compare_with}"] = ([LOOM, *true], other)
            slow[f"loom-worker --help, {args.compare_with}"] = ([LOOM, "--help"], other)
            slow[f"loom-worker tools, {args.compare_with}"] = ([LOOM, "tools"], other)
        phases = [(args.n, fast), (args.n_slow, slow)]
        times: list[dict[str, list[float]]] = []
        for n, rows in phases:
            times.append({name: [] for name in rows})
            for _ in range(n):
                for name, (argv, e) in rows.items():
                    times[-1][name].append(timed(argv, e))
        load = os.getloadavg()[0]
        status = subprocess.run([LOOM, "daemon", "status", "--json"], env=env, capture_output=True, text=True)
        served = json.loads(status.stdout)["this"].get("calls")
    finally:
        subprocess.run([LOOM, "daemon", "stop"], env=env, capture_output=True)
        subprocess.run([LOOM, "stop", "-w", str(ws)], env=off, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\n{os.cpu_count()} cores, load {load:.1f}; image {args.image}; "
        f"first call (starts the worker and the sandbox): {first:.0f} ms; the worker served {served} calls\n"
    )
    print("| phase | command | n | median ms | p90 ms | median / docker exec doing the same |")
    print("|---|---|---:|---:|---:|---:|")
    for phase, measured in enumerate(times, 1):
        med = {name: statistics.median(t) for name, t in measured.items()}
        vs = {"call read_file": med["docker exec cat"], "call shell_execute true": med["docker exec true"]}
        for name, t in measured.items():
            base = next((v for prefix, v in vs.items() if name.startswith(prefix)), None)
            ratio = f"{med[name] / base:.2f}" if base else ""
            print(f"| {phase} | {name} | {len(t)} | {med[name]:.1f} | {pct(t, 0.9):.1f} | {ratio} |")


if __name__ == "__main__":
    main()
