"""The benchmarks the issues' figures come from still run (tiny sizes, real engine): a
benchmark that rots is a figure nobody can reproduce."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE, require_chromium

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["bench/bench_tools.py", "--n", "5", "--search-n", "2", "--files", "40"],
        ["bench/bench_tools.py", "--n", "5", "--search-n", "2", "--files", "40", "--changelog", "--loop", "asyncio"],
        [
            "bench/bench_changelog.py",
            "--n",
            "5",
            "--files",
            "60",
            "--durability",
            "both",
            "--tree-files",
            "300",
            "--tree-rounds",
            "1",
        ],
        ["bench/bench_cli.py", "--n", "2", "--n-slow", "1"],
        ["bench/bench_tools.py", "--n", "5", "--search-n", "2", "--files", "40", "--changelog", "--journal"],
        ["bench/bench_egress.py", "--rounds", "1", "--pip-rounds", "1", "--mb", "8"],
        # no pip rounds: the table leaves that row out (it had no median to print)
        ["bench/bench_egress.py", "--rounds", "1", "--pip-rounds", "0", "--mb", "4"],
        ["bench/bench_processes.py", "--n", "5", "--starts", "2"],
        ["bench/bench_stream.py", "--runtime", "runc", "--lines", "10", "--rounds", "1"],
        ["bench/bench_ports.py", "--runtime", "runc", "--requests", "5", "--mb", "2", "--rounds", "1"],
        ["bench/bench_terminal.py", "--runtime", "runc", "--n", "20", "--mb", "2", "--rounds", "1"],
        ["bench/bench_secrets.py", "--rounds", "1", "--mb", "8"],
        ["bench/bench_native.py", "--n", "3"],
        [
            "bench/bench_fork.py",
            *("--files", "200", "--mb", "4", "--source", "", "--fs", "host"),
            *("--rounds", "1", "--forks", "2", "--changed", "5"),
        ],
        ["bench/bench_ray.py", "--n", "20", "--workspaces", "6"],
        ["bench/bench_inspect.py", "--samples", "1", "--execs", "5"],
        [
            "bench/bench_scale.py",
            *("--workspaces", "1,2", "--callers", "2", "--seconds", "1", "--warmup", "0.2", "--rounds", "1"),
        ],
        [
            "bench/bench_scale.py",
            *("--workspaces", "1,2", "--callers", "2", "--seconds", "1", "--warmup", "0.2", "--rounds", "1"),
            *("--mix", "w"),
        ],
        ["bench/bench_loop.py", "--n", "20", "--rounds", "1"],
        ["bench/bench_platforms.py", "--n", "2", "--rounds", "1"],
        ["bench/bench_e2b.py", "--runtime", "runc", "--creates", "2", "--rounds", "2", "--concurrent", "3"],
    ],
    ids=[
        "tools",
        "tools-changelog-asyncio",
        "changelog",
        "cli",
        "tools-journal",
        "egress",
        "egress-no-pip",
        "processes",
        "stream",
        "ports",
        "terminal",
        "secrets",
        "native",
        "fork",
        "ray",
        "inspect",
        "scale",
        "scale-writes",
        "loop",
        "platforms",
        "e2b",
    ],
)
def test_benchmark_prints_its_table(docker_ready: None, argv: list[str]) -> None:
    env = {**os.environ, "LOOM_IMAGE": SANDBOX_IMAGE, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 3, p.stdout
    assert "p50" in rows[0] or "median" in rows[0] or "host directly" in rows[0]
    if argv[0] == "bench/bench_tools.py":
        # The floor table: loom without and with the changelog, beside the bare floor.
        for mode in ("off", "on"):
            assert any(r.startswith(f"| shell_execute `true` | {mode} |") for r in rows), p.stdout
            assert any(r.startswith(f"| read_file (4 KB) | {mode} |") for r in rows), p.stdout


def test_the_warm_pool_benchmark_prints_its_table(docker_ready: None) -> None:
    """``bench_scale.py --pool`` (issue 44): first results and ready times with the pool off
    and on, the one-after-another leg's pool sized by demand."""
    env = {**os.environ, "LOOM_IMAGE": SANDBOX_IMAGE, "PYTHONPATH": str(ROOT)}
    argv = ["bench/bench_scale.py", "--pool", "--rounds", "1", "--pool-samples", "3", "--pool-ready", "3"]
    p = subprocess.run(
        [sys.executable, *argv, "--pool-warmup", "1"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert any("sized by demand (auto)" in line for line in lines), p.stdout
    for label in ("pool off", "pool on", "on/off"):
        assert any(line.startswith(label) and line.count("ms") + line.count("x") >= 2 for line in lines), p.stdout
    on = next(line for line in p.stderr.splitlines() if "pool on:" in line)
    assert "claims 3, misses 0" in on, p.stderr  # every one of the burst found a warm one


@pytest.mark.browser
def test_dashboard_benchmark_prints_its_tables(docker_ready: None) -> None:
    require_chromium()
    env = {**os.environ, "LOOM_IMAGE": SANDBOX_IMAGE, "PYTHONPATH": str(ROOT)}
    argv = ["bench/bench_dashboard.py", "--calls", "4", "--other", "2", "--gap", "0.05"]
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert any(r.startswith("| row paintable in the dashboard") for r in rows), p.stdout
    assert any(r.startswith("| total |") for r in rows), p.stdout
