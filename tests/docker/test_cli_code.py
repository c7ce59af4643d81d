"""``loom-worker run-code`` on the real engine: state that lasts between calls, what the
code prints and its results on our stdout, an image saved where asked, the exit codes
(1 an exception, 124 a timeout, 2 a usage error)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.workers import cli, cli_env, run_dir

pytestmark = pytest.mark.docker


@pytest.fixture
def env(tmp_path: Path, docker_ready: None) -> Iterator[dict[str, str]]:
    with run_dir() as run:
        yield cli_env(run, tmp_path / "data", LOOM_IMAGE=SANDBOX_IMAGE)


def test_run_code(env: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    os.chown(workspace, 1000, 1000)
    ws = str(workspace)
    try:
        p = cli(env, "run-code", "-w", ws, "-c", "x = 41\nprint('set')")
        assert (p.returncode, p.stdout) == (0, b"set\n"), p.stderr
        p = cli(env, "run-code", "-w", ws, "-c", "x + 1")
        assert (p.returncode, p.stdout) == (0, b"42\n"), p.stderr
        (tmp_path / "plot.py").write_text(
            "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
            "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 1), dpi=100)\nplt.plot([1, 2])\nplt.show()\n"
        )
        images = tmp_path / "images"
        p = cli(env, "run-code", "-w", ws, "--images", str(images), "--call-id", "plot-1", str(tmp_path / "plot.py"))
        saved = images / "plot-1-1.png"
        assert p.returncode == 0 and p.stdout == f"[image/png 200x100: {saved}]\n".encode(), (p.stdout, p.stderr)
        assert saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        p = cli(env, "run-code", "-w", ws, "-c", "1/0")
        assert p.returncode == 1 and b"ZeroDivisionError: division by zero" in p.stderr and b"\x1b[" not in p.stderr
        p = cli(env, "run-code", "-w", ws, "--timeout", "1", "-c", "while True: pass")
        assert p.returncode == 124 and b"timed out after 1 s: interrupted" in p.stderr, p.stderr
        p = cli(env, "run-code", "-w", ws, "--json", "-", stdin=b"print('a')\nx")
        lines = [json.loads(line) for line in p.stdout.splitlines()]
        assert [line["type"] for line in lines] == ["stdout", "result", "execution"], lines
        assert lines[1]["text"] == "41" and lines[-1]["outcome"] == "ok" and p.returncode == 0
        p = cli(env, "run-code", "-w", ws, "--context", "ctx-nope", "-c", "1")
        assert p.returncode == 2 and b"No code context ctx-nope" in p.stderr
        p = cli(env, "run-code", "-w", ws, "--language", "cobol", "-c", "1")
        assert p.returncode == 2 and b"language: 'cobol'" in p.stderr
    finally:
        cli(env, "stop", "--workspace", ws)
