"""``loom-worker exec`` with the harness API's options (issue 26): ``--stdin`` (bytes
exactly), ``--env``, an absolute ``--cwd``, ``--user`` (which the local backend cannot
honour: refused, 126), through the local worker and in-process alike, on the test-only
local backend. tests/docker/test_cli_harness.py runs them and ``cp`` on the real engine."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers import ROOT, cli_env, run_dir

CLI = [sys.executable, "-m", "worker.cli"]


@pytest.fixture(params=["worker", "in-process"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    with run_dir() as run:
        e = cli_env(run, tmp_path / "data", LOOM_ALLOW_UNSAFE_LOCAL="1")
        if request.param == "in-process":
            e["LOOM_CLI_DAEMON"] = "0"
        e.pop("LOOM_LOG_LEVEL")
        yield e


def run_exec(
    env: dict[str, str], ws: Path, *words: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    argv = [*CLI, "exec", "-w", str(ws), "--backend", "local", *words]
    return subprocess.run(argv, env=env, input=stdin, capture_output=True, timeout=120, cwd=str(ROOT))


def test_stdin_env_and_any_cwd(env: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    every = bytes(range(256)) * 4
    p = run_exec(env, workspace, "-i", "--", "sh", "-c", "cat > got.bin; wc -c < got.bin", stdin=every)
    assert (p.returncode, p.stdout.strip(), p.stderr) == (0, b"1024", b"")
    assert (workspace / "got.bin").read_bytes() == every
    p = run_exec(env, workspace, "-e", "A=1", "--env", "B=two words", "--", "sh", "-c", 'printf "%s|%s" "$A" "$B"')
    assert (p.returncode, p.stdout) == (0, b"1|two words")
    p = run_exec(env, workspace, "--cwd", str(tmp_path), "--", "pwd")
    assert (p.returncode, p.stdout.strip()) == (0, str(tmp_path).encode())
    p = run_exec(env, workspace, "--cwd", "/no/such/dir", "--", "pwd")
    assert p.returncode == 126 and b"/no/such/dir" in p.stderr


def test_refusals_and_usage(env: dict[str, str], workspace: Path) -> None:
    p = run_exec(env, workspace, "--user", "root", "--", "id")
    assert p.returncode == 126 and b"cannot run commands as another user" in p.stderr
    p = run_exec(env, workspace, "-e", "NOEQUALS", "--", "true")
    assert p.returncode == 2 and b"--env 'NOEQUALS'" in p.stderr
    p = run_exec(env, workspace, "-e", "X=1", "--", "sh", "-c", "rm -rf /")
    assert p.returncode == 126 and b"Safety violation" in p.stderr
    p = run_exec(env, workspace, "-e", "X=1", "--", "sh", "-c", "exit 7")
    assert p.returncode == 7
