"""``loom-worker snapshot|fork|restore`` as a script uses them, on the real engine: ids and
directories on stdout, one a line; refusals and usage errors with their exit codes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.docker.fork_volumes import remove_fork_volumes

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "tinycalc"


class Cli:
    """``loom-worker`` of this checkout with its own data directory; the workspaces it
    used have their sandboxes stopped afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
        self.env.update(
            {
                "LOOM_DATA_DIR": str(tmp_path / "data"),
                "LOOM_IMAGE": SANDBOX_IMAGE,
                "LOOM_CLI_DAEMON": "0",
                "PYTHONPATH": str(ROOT),
            }
        )
        self.used: list[Path] = []

    def __call__(self, *argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "worker.cli", *argv]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def run(docker_ready: None, tmp_path: Path) -> Iterator[Cli]:
    cli = Cli(tmp_path)
    yield cli
    for w in cli.used:
        cli("stop", "--workspace", str(w))
    remove_fork_volumes(tmp_path)


def test_snapshot_fork_restore_from_the_command_line(run: Cli, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    shutil.copytree(FIXTURE, ws)
    used = run.used
    used.append(ws)
    r = run("snapshot", "create", "--workspace", str(ws), "prepared")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert sid.startswith("snap-") and "\n" not in sid
    into = tmp_path / "attempts"  # made by the fork, as the docs' example expects
    r = run("fork", "--workspace", str(ws), "--snapshot", "prepared", "--count", "3", "--into", str(into))
    assert r.returncode == 0, r.stderr
    forks = [Path(line) for line in r.stdout.splitlines()]
    used += forks
    assert len(forks) == 3 and all(f.parent == into and (f / "tinycalc" / "ops.py").is_file() for f in forks)
    r = run("snapshot", "list", "--workspace", str(ws))
    assert r.returncode == 0 and sid in r.stdout and "3 fork(s)" in r.stdout
    r = run("snapshot", "show", sid)
    assert r.returncode == 0 and f"fork       {forks[0]}\n" in r.stdout  # (an overlay fork too: its directory)

    (forks[0] / "README.md").write_text("changed on the host\n")
    r = run("call", "shell_execute", "--workspace", str(forks[0]), "--args", '{"command": "rm setup.py"}')
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("restore", "--workspace", str(forks[0]), "--snapshot", sid, "--dry-run")
    assert (
        r.returncode == 0
        and "-changed on the host" in r.stdout
        and (forks[0] / "README.md").read_text().startswith("changed")
    )
    r = run("restore", "--workspace", str(forks[0]), "--snapshot", sid)
    assert r.returncode == 0, r.stderr
    assert "undo with: loom-worker undo" in r.stderr and (forks[0] / "setup.py").is_file()
    assert (forks[0] / "README.md").read_text() == (ws / "README.md").read_text()
    call = r.stderr.split("--call ")[1].split()[0]
    r = run("undo", "--workspace", str(forks[0]), "--call", call)
    assert r.returncode == 0, r.stderr
    assert not (forks[0] / "setup.py").exists() and (forks[0] / "README.md").read_text() == "changed on the host\n"
    r = run("log", "--workspace", str(forks[0]))
    assert r.stdout.startswith(f"# history starts at snapshot {sid} of {ws}")

    r = run("snapshot", "delete", sid)
    assert r.returncode == 1 and "3 live fork(s)" in r.stderr and str(forks[1]) in r.stderr
    r = run("snapshot", "delete", sid, "--force")
    assert r.returncode == 0 and r.stderr.count("left live fork") == 3

    # from the live workspace (a snapshot first), and the usage errors
    r = run("fork", "--workspace", str(ws), "--into", str(into))
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr
    used.append(Path(r.stdout.strip()))
    assert run("snapshot", "show", "nope").returncode == 2
    assert run("fork", "--workspace", str(ws), "--count", "0").returncode == 2
    assert run("fork", "--workspace", str(tmp_path / "missing"), "--count", "1").returncode == 2
    assert run("restore", "--workspace", str(ws), "--snapshot", sid).returncode == 2  # deleted

    # deleting forks: each one whole (an overlay fork's volume and layers too), then gc
    # finds no fork volume of this data directory to remove
    volumes = {Path(os.path.realpath(f)).parent.name for f in forks}
    r = run("snapshot", "delete-fork", *map(str, forks))
    assert r.returncode == 0 and r.stderr.count("deleted fork") == 3, r.stderr
    assert not any(os.path.lexists(f) for f in forks)
    assert run("snapshot", "delete-fork", str(ws)).returncode == 2  # not a fork
    if any(v.startswith("loom-fork-") for v in volumes):
        listed = subprocess.run(["docker", "volume", "ls", "-q"], capture_output=True, text=True).stdout.split()
        assert not volumes & set(listed)
        assert not {v for v in volumes if (tmp_path / "data" / "fork-layers" / v).exists()}
    r = run("gc")
    assert r.returncode == 0 and "fork volume" not in r.stderr, r.stderr
