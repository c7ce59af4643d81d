"""``diff --format patch``, ``export`` and ``report`` end to end on the local backend (no
Docker): a git repository workspace changed by writes and shell commands, the patch taken by
``git am`` in a clone, the branch made without touching the checkout, a tampered
repository refused."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox.base import ExecRequest
from sandbox.local import LocalProcessBackend
from worker.changelog import Changelog
from worker.cli import main
from worker.egress.log import EgressLog, EgressRecord
from worker.workspace import Workspace

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

ENV = {
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
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, input=data, capture_output=True, check=True).stdout.decode()


@pytest.fixture
def data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LOOM_ALLOW_UNSAFE_LOCAL", "1")
    return tmp_path / "data"


@pytest.fixture
def repo(workspace: Path) -> Path:
    git(workspace, "init", "-q", "-b", "main")
    (workspace / "keep.txt").write_text("keep\n")
    (workspace / "edit.txt").write_text("a\nb\nc\n")
    (workspace / "gone.txt").write_text("gone\n")
    (workspace / "old.txt").write_text("renamed\n")
    (workspace / "run.sh").write_text("#!/bin/sh\n")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "start")
    return workspace


def session(data: Path, ws: Path, *commands: str) -> None:
    async def go() -> None:
        backend = LocalProcessBackend()
        try:
            box = await backend.get(ws)
            async with Changelog.open(data, ws) as cl:
                w = Workspace(ws, box, cl)
                await w.run_shell(ExecRequest("true"))  # the baseline
                await cl.write(box, "edit.txt", b"a\nB\nc\n", call_id="w1")
                await cl.write(box, "img.bin", b"\x00\x01\x02binary", call_id="w2")
                for i, cmd in enumerate(commands):
                    await w.run_shell(ExecRequest(cmd), call_id=f"s{i}")
        finally:
            await backend.aclose()

    asyncio.run(go())


SHELL = ("rm gone.txt && mv old.txt new.txt && chmod +x run.sh && mkdir -p d && echo n > d/n.txt",)


def test_patch_applies_with_git_am(
    data: Path, repo: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    session(data, repo, *SHELL)
    assert (
        main(["diff", "-w", str(repo), "--backend", "local", "--format", "patch", "-m", "Agent work\n\nDetails."]) == 0
    )
    patch = capsysbinary.readouterr().out
    assert b"Subject: [PATCH] Agent work" in patch and b"GIT binary patch" in patch
    git(clone, "am", "-q", data=patch)
    git(repo, "add", "-A")
    assert git(clone, "rev-parse", "HEAD^{tree}") == git(repo, "write-tree")
    assert "rm gone.txt" in git(clone, "log", "-1", "--format=%b")


def test_export_makes_a_branch_and_leaves_the_checkout(
    data: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session(data, repo, *SHELL)
    head, status = git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain")
    assert main(["export", "-w", str(repo), "--backend", "local", "--branch", "agent/x", "--json"]) == 0
    commit = json.loads(capsys.readouterr().out)["commit"]
    assert git(repo, "rev-parse", "agent/x").strip() == commit
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == status
    git(repo, "add", "-A")
    assert git(repo, "rev-parse", "agent/x^{tree}") == git(repo, "write-tree")
    assert git(repo, "rev-parse", "agent/x^") == head
    # An existing branch is refused, a bad name is a usage error.
    assert main(["export", "-w", str(repo), "--backend", "local", "--branch", "agent/x"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["export", "-w", str(repo), "--backend", "local", "--branch", "bad..name"]) == 2


@pytest.mark.parametrize(
    "plant",
    [
        "printf '#!/bin/sh\\ntouch {M}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit",
        "git config core.fsmonitor 'touch {M}'",
        "printf '* filter=x\\n' > .gitattributes",
        "echo ../elsewhere > .git/commondir",
    ],
)
def test_export_refuses_a_tampered_repository(
    data: Path, repo: Path, tmp_path: Path, plant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    session(data, repo, plant.format(M=marker))
    assert main(["export", "-w", str(repo), "--backend", "local", "--branch", "agent/y"]) == 1
    err = capsys.readouterr().err
    assert "refused" in err and (".git" in err or ".gitattributes" in err)
    assert not marker.exists()
    assert not (repo / ".git/refs/heads/agent/y").exists()


def test_report_lists_files_commands_hosts_and_secrets(
    data: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session(data, repo, *SHELL)
    log = EgressLog(data)
    log.append(repo, EgressRecord(str(repo), "connect", "evil.example", 443, "denied", reason="not on the allowlist"))
    log.append(repo, EgressRecord(str(repo), "connect", "api.anthropic.com", 443, "allowed", bytes_up=10))
    log.append(repo, EgressRecord(str(repo), "secret", "api.anthropic.com", 443, "allowed", secret="ANTHROPIC_API_KEY"))
    runs = data / "workspaces"
    (next(runs.iterdir()) / "agent-runs" / "r1").mkdir(parents=True)
    (next(runs.iterdir()) / "agent-runs" / "r1" / "run.json").write_text(
        json.dumps({"agent": "claude", "version": "2.1.0", "exit_code": 0})
    )
    assert main(["report", "-w", str(repo), "--backend", "local"]) == 0
    md = capsys.readouterr().out
    for want in (
        "`evil.example:443`",
        "`ANTHROPIC_API_KEY`",
        "`api.anthropic.com:443`",
        "`new.txt` | renamed from `old.txt`",
        "`gone.txt` | deleted",
        "`d/n.txt` | created",
        "mode 100644 -> 100755",
        "rm gone.txt",
        "claude",
    ):
        assert want in md, want
    assert main(["report", "-w", str(repo), "--backend", "local", "--json", "--run", "r1"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["run"]["agent"] == "claude" and rep["hosts_refused"][0]["host"] == "evil.example:443"
    assert main(["report", "-w", str(repo), "--backend", "local", "--run", "../x"]) == 2
