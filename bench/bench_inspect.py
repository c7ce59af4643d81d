"""The inspect_ai provider against inspect's own ``docker`` sandbox, same image, same run.

Both are driven through inspect's ``SandboxEnvironment`` API exactly as an eval drives
them (``sample_init``, ``exec``, ``write_file``/``read_file``, ``sample_cleanup``):

- **per-sample overhead**: ``sample_init`` until the first ``exec(["true"])`` has its
  result (target: loom <= 0.5x docker), and ``sample_cleanup``;
- **exec round trip** on a warm sample, ``exec(["true"])`` (target: loom p50 <= 0.1x
  docker), and a 4 KiB ``write_file`` + ``read_file``;
- the engine's own floor, in the same run: ``docker run --rm IMAGE true`` and
  ``docker exec CONTAINER true`` (what inspect's provider issues, through compose).

inspect's docker sandbox runs its real code (``docker compose up``/``exec``/``cp``, a
compose file naming the local image with ``x-local: true``), but inspect refuses Docker
Engines older than 24.0.6 and this machine's is Debian's 20.10: the benchmark skips that
one check (``validate_prereqs``), nothing else. The two are not equally hardened:
inspect's container runs as root with Docker's default capabilities; loom's as the
workspace owner with none, read-only, limits, no network (both: no network here).

Usage: .venv/bin/python bench/bench_inspect.py [--runtime runc|runsc] [--samples 10] [--execs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

IMAGE = os.environ.get("LOOM_IMAGE", "loom-sandbox:latest")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def compose_file(tmp: Path, runtime: str) -> str:
    service = [
        "    image: " + IMAGE,
        "    x-local: true",
        "    init: true",
        "    network_mode: none",
        "    command: tail -f /dev/null",
    ]
    if runtime == "runsc":
        service.append("    runtime: runsc")
    path = tmp / "compose.yaml"
    path.write_text("services:\n  default:\n" + "\n".join(service) + "\n")
    return str(path)


async def sample_round(provider: Any, task: str, config: Any) -> tuple[float, float]:
    """One sample: (init until the first exec's result, cleanup), in ms."""
    t0 = time.perf_counter()
    envs = await provider.sample_init(task, config, {"__sample_id__": "bench"})
    r = await envs["default"].exec(["true"])
    t1 = time.perf_counter()
    if not r.success:
        raise SystemExit(f"{task}: exec failed: {r.stderr}")
    await provider.sample_cleanup(task, config, envs, False)
    return (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000


async def exec_round(env: Any) -> float:
    t = time.perf_counter()
    r = await env.exec(["true"])
    if not r.success:
        raise SystemExit(f"exec failed: {r.stderr}")
    return (time.perf_counter() - t) * 1000


async def file_round(env: Any, data: bytes) -> float:
    t = time.perf_counter()
    await env.write_file("bench.bin", data)
    got = await env.read_file("bench.bin", text=False)
    if got != data:
        raise SystemExit("read back other bytes")
    return (time.perf_counter() - t) * 1000


def cli_ms(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return (time.perf_counter() - t) * 1000


async def main(a: argparse.Namespace) -> None:
    import inspect_ai.util._sandbox.docker.docker as inspect_docker
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    async def engine_is_fine() -> None:
        return None  # inspect wants Engine >= 24.0.6; this machine's is 20.10 (see the docstring)

    inspect_docker.validate_prereqs = engine_is_fine  # type: ignore[assignment]
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-inspect-"))
    os.environ.setdefault("LOOM_DATA_DIR", str(tmp / "data"))
    loom = registry_find_sandboxenv("loom")
    docker = registry_find_sandboxenv("docker")
    loom_cfg = loom.config_deserialize({"image": IMAGE, "runtime": a.runtime, "workspace_root": str(tmp / "ws")})
    docker_cfg = compose_file(tmp, a.runtime)
    res: dict[str, list[float]] = {k: [] for k in ("li", "lc", "di", "dc", "le", "de", "lf", "df", "run", "dexec")}
    try:
        await loom.task_init("bench_loom", loom_cfg)
        await docker.task_init("bench_docker", docker_cfg)
        # Warm both (images cached, the agent runtime's volume made) before measuring.
        await sample_round(loom, "bench_loom", loom_cfg)
        await sample_round(docker, "bench_docker", docker_cfg)
        for _ in range(a.samples):  # interleaved
            i, c = await sample_round(loom, "bench_loom", loom_cfg)
            res["li"].append(i), res["lc"].append(c)
            i, c = await sample_round(docker, "bench_docker", docker_cfg)
            res["di"].append(i), res["dc"].append(c)
            res["run"].append(
                cli_ms(["docker", "run", "--rm", "--network", "none", "--runtime", a.runtime, IMAGE, "true"])
            )
        lenvs = await loom.sample_init("bench_loom", loom_cfg, {"__sample_id__": "warm"})
        denvs = await docker.sample_init("bench_docker", docker_cfg, {"__sample_id__": "warm"})
        lenv, denv = lenvs["default"], denvs["default"]
        data = os.urandom(4096)
        container = (await denv.connection()).container
        for _ in range(a.execs):
            res["le"].append(await exec_round(lenv))
            res["de"].append(await exec_round(denv))
        for _ in range(max(1, a.execs // 10)):
            res["lf"].append(await file_round(lenv, data))
            try:
                res["df"].append(await file_round(denv, data))
            except FileNotFoundError:
                # inspect's read_file is `docker cp`, which reads the container's file
                # system on the host: under gVisor the sandbox's writes are not there.
                if a.runtime != "runsc":
                    raise
            res["dexec"].append(cli_ms(["docker", "exec", str(container), "true"]))
        await loom.sample_cleanup("bench_loom", loom_cfg, lenvs, False)
        await docker.sample_cleanup("bench_docker", docker_cfg, denvs, False)
    finally:
        await loom.task_cleanup("bench_loom", loom_cfg, True)
        await docker.task_cleanup("bench_docker", docker_cfg, True)
        shutil.rmtree(tmp, ignore_errors=True)

    def row(name: str, lk: str, dk: str, target: float | None) -> str:
        if not res[dk]:
            return f"| {name} | {statistics.median(res[lk]):.2f} | n/a (docker cp sees no gVisor file) | | | |"
        lp, dp = statistics.median(res[lk]), statistics.median(res[dk])
        ratio = lp / dp
        met = "" if target is None else ("yes" if ratio <= target else "no")
        goal = "" if target is None else f"<= {target:g}x"
        return f"| {name} | {lp:.2f} | {dp:.2f} | {ratio:.3f} | {goal} | {met} |"

    print(f"runtime {a.runtime}, image {IMAGE}; {a.samples} samples each (interleaved), {a.execs} execs each")
    print("inspect docker: inspect's own provider (compose up/exec/cp); its Engine >= 24.0.6 check skipped")
    print()
    print("| measurement (median) | loom ms | inspect docker ms | loom / docker | target | met |")
    print("|---|---:|---:|---:|---|---|")
    print(row("sample_init -> first exec result", "li", "di", 0.5))
    print(row("sample_cleanup", "lc", "dc", None))
    print(row("exec(['true']) round trip, warm", "le", "de", 0.1))
    print(row("write_file + read_file 4 KiB", "lf", "df", None))
    print()
    print("| engine floor, same run (median) | ms |")
    print("|---|---:|")
    print(f"| docker run --rm IMAGE true | {statistics.median(res['run']):.1f} |")
    print(f"| docker exec CONTAINER true | {statistics.median(res['dexec']):.1f} |")
    print(f"| loom exec p90 / inspect docker exec p90 | {pct(res['le'], 0.9):.2f} / {pct(res['de'], 0.9):.2f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runtime", choices=("runc", "runsc"), default="runc")
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--execs", type=int, default=200)
    asyncio.run(main(p.parse_args()))
