"""Hand-off on the real engine (runc), through the CLI as a pipeline uses it: a git
repository workspace changed by shell commands and ``write_file`` (a new file, a deleted
one, a rename, a binary file, a chmod, a symlink); ``diff --format patch`` applies with
``git am`` in a fresh clone and gives the same tree; ``export --branch`` makes that commit
and leaves the checkout alone; a session that planted a git hook makes ``export`` refuse
and the hook never runs; ``report`` lists a refused host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "dev",
    "GIT_AUTHOR_EMAIL": "dev@x",
    "GIT_COMMITTER_NAME": "dev",
    "GIT_COMMITTER_EMAIL": "dev@x",
}


def git(cwd: Path, *args: str, data: bytes | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, input=data, capture_output=True, check=True
    ).stdout.decode()


class Cli:
    """``loom-worker`` of this checkout with its own data directory (runc)."""

    def __init__(self, tmp_path: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOM_", "GIT_"))}
        self.env.update(
            {
                "LOOM_DATA_DIR": str(tmp_path / "data"),
                "LOOM_IMAGE": SANDBOX_IMAGE,
                "LOOM_RUNTIME": "runc",
                "LOOM_CLI_DAEMON": "0",
                "PYTHONPATH": str(ROOT),
            }
        )
        self.used: list[Path] = []

    def __call__(self, *argv: str, data: str | None = None) -> subprocess.CompletedProcess[bytes]:
        cmd = [sys.executable, "-m", "worker.cli", *argv]
        return subprocess.run(
            cmd, env=self.env, input=None if data is None else data.encode(), capture_output=True, timeout=300
        )

    def sh(self, ws: Path, command: str) -> None:
        r = self("exec", "-w", str(ws), "--", command)
        assert r.returncode == 0, r.stderr

    def write(self, ws: Path, path: str, content: str) -> None:
        r = self(
            "call", "write_file", "-w", str(ws), "--args", "-", data=json.dumps({"path": path, "content": content})
        )
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def cli(docker_ready: None, tmp_path: Path) -> Iterator[Cli]:
    c = Cli(tmp_path)
    yield c
    for w in c.used:
        c("stop", "--workspace", str(w))


def make_repo(tmp_path: Path, cli: Cli, *, hooks: bool = True) -> Path:
    ws = tmp_path / "proj"
    ws.mkdir()
    # Without a hooks directory (an empty template), .git/hooks is not a read-only mount in
    # the sandbox: the plant below can be made, as in a repository cloned that way.
    git(ws, "init", "-q", "-b", "main", *(() if hooks else ("--template=",)))
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("def f():\n    return 1\n")
    (ws / "README.md").write_text("# proj\n")
    (ws / "old.txt").write_text("to be renamed\n")
    (ws / "gone.txt").write_text("to be removed\n")
    (ws / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "start")
    cli.used.append(ws)
    return ws


def test_patch_applies_and_export_makes_the_same_tree(cli: Cli, tmp_path: Path) -> None:
    ws = make_repo(tmp_path, cli)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(ws), str(clone))
    r = cli("workspace", "set", "--workspace", str(ws), "--egress", "pypi")
    assert r.returncode == 0, r.stderr
    cli.sh(ws, "true")  # the session's baseline
    cli.write(ws, "src/app.py", "def f():\n    return 2\n")
    cli.write(ws, "src/new_mod.py", "X = 1\n")
    cli.sh(ws, "rm gone.txt && mv old.txt renamed.txt && chmod +x tool.sh && ln -s README.md link.md")
    cli.sh(ws, "printf '\\000\\001\\002\\377binary' > data.bin")
    fetch = "import urllib.request as u; u.urlopen('https://example.com/', timeout=10)"
    cli.sh(ws, f'python3 -c "{fetch}" 2>/dev/null || true')  # refused by the egress allowlist

    r = cli("diff", "-w", str(ws), "--format", "patch", "-m", "Agent session", "--author", "Agent <agent@example.com>")
    assert r.returncode == 0, r.stderr
    patch = r.stdout
    assert b"Subject: [PATCH] Agent session" in patch and b"GIT binary patch" in patch
    assert b"rename from old.txt" in patch and b"new mode 100755" in patch and b"new file mode 120000" in patch
    git(clone, "am", "-q", data=patch)
    head, status = git(ws, "rev-parse", "HEAD"), git(ws, "status", "--porcelain")

    r = cli("export", "-w", str(ws), "--branch", "agent/session", "-m", "Agent session", "--json")
    assert r.returncode == 0, r.stderr
    commit = json.loads(r.stdout)["commit"]
    # The checkout is as it was: HEAD, index, files.
    assert git(ws, "rev-parse", "HEAD") == head and git(ws, "status", "--porcelain") == status
    assert git(ws, "rev-parse", "agent/session").strip() == commit
    tree = git(ws, "rev-parse", f"{commit}^{{tree}}")
    assert git(clone, "rev-parse", "HEAD^{tree}") == tree
    git(ws, "add", "-A")  # and it is the tree of the files now
    assert git(ws, "write-tree") == tree

    r = cli("report", "-w", str(ws))
    assert r.returncode == 0, r.stderr
    md = r.stdout.decode()
    assert "`renamed.txt` | renamed from `old.txt`" in md and "`gone.txt` | deleted" in md
    assert "## Hosts refused" in md and "example.com" in md.split("## Hosts refused", 1)[1]


def test_export_refuses_a_planted_hook_and_it_never_runs(cli: Cli, tmp_path: Path) -> None:
    ws = make_repo(tmp_path, cli, hooks=False)
    marker = tmp_path / "hook-ran"
    cli.sh(ws, "true")
    cli.write(ws, "src/app.py", "def f():\n    return 3\n")
    # The hook would touch a file on the host's side of the workspace's parent: it must not.
    hook = f'#!/bin/sh\ntouch {marker}\ntouch "$GIT_DIR/../hook-ran-in-ws"\n'
    cli.sh(ws, f"mkdir -p .git/hooks && printf '%s' '{hook}' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit")
    for hook_name in ("post-commit", "reference-transaction"):
        cli.sh(ws, f"cp .git/hooks/pre-commit .git/hooks/{hook_name}")
    r = cli("export", "-w", str(ws), "--branch", "agent/evil")
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "refused" in err and ".git/hooks/pre-commit" in err
    assert not marker.exists() and not (ws / "hook-ran-in-ws").exists()
    assert not (ws / ".git" / "refs" / "heads" / "agent" / "evil").exists()
