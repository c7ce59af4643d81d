"""``loom-worker serve --token-file``: the token docker compose generates at the first start
and keeps in its data volume (tests/e2e/test_compose.py runs it under compose)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from structlog.testing import capture_logs

from tests.workers import ROOT
from worker.cli.service import token_from_file


def test_generated_once_then_read(tmp_path: Path) -> None:
    path = tmp_path / "data" / "api-token"
    with capture_logs() as logs:
        token = token_from_file(path)
        assert token_from_file(path) == token
    assert len(token) >= 40 and path.read_text() == token + "\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert [log.get("generated") for log in logs] == [True, None]
    assert all(log["source"] == str(path) for log in logs) and token not in json.dumps(logs)
    assert sorted(p.name for p in path.parent.iterdir()) == ["api-token"]  # no temporary file left


def test_an_empty_file_gets_a_token_and_a_given_one_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "api-token"
    path.write_text("")
    assert len(token_from_file(path)) >= 40
    path.write_text("  my-own-token\n")
    assert token_from_file(path) == "my-own-token"


def test_serve_beyond_loopback_starts_with_the_file_and_not_without(tmp_path: Path) -> None:
    """Without LOOM_API_TOKEN, serve refuses 0.0.0.0 (exit 2) unless --token-file gives it one;
    an unwritable file is exit 1, naming it."""
    argv = [sys.executable, "-m", "worker.cli", "serve", "--host", "0.0.0.0", "--port", "1"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LOOM_DATA_DIR": str(tmp_path / "d")}
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "LOOM_API_TOKEN" in p.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    p = subprocess.run([*argv, "--token-file", str(blocked / "api-token")], env=env, capture_output=True, text=True)
    assert p.returncode == 1 and f"--token-file {blocked}/api-token: Not a directory" in p.stderr, p.stderr
