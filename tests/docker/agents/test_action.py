"""The GitHub Action's entry point run as a GitHub runner runs it, on the real engine
(runc and gVisor): ``python -m worker.agents.action`` with ``GITHUB_WORKSPACE``,
``GITHUB_OUTPUT``, ``GITHUB_STEP_SUMMARY`` and the inputs as ``INPUT_*``, on a fixture git
repository, the agent a small shell script (``agent: command``) that edits a file, adds
one, and tries ``https://example.com``, which the egress gateway refuses (only pypi.org is
allowed). The artifacts are written, the patch applies with ``git am`` in a clean clone,
and the job summary names the refused host.

Needs ``agent run``, ``diff --format patch`` and ``report`` (issue 43's other parts).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE, TEST_OWNER
from tests.docker.conftest import require_runtime
from worker.owner import OWNER_FILE

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[3]

AGENT = """\
set -u
echo "agent: editing"
sed -i 's/return a - b/return a + b/' src/calc.py
printf 'def twice(x):\\n    return 2 * x\\n' > src/twice.py
echo "agent: reaching out"
curl -sS --max-time 20 -o /dev/null https://example.com/ && echo "agent: reached" || echo "agent: refused"
echo "agent: done"
"""


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "checkout"
    (r / "src").mkdir(parents=True)
    (r / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (r / "agent.sh").write_text(AGENT)
    (r / "README.md").write_text("# fixture\n")
    git(r, "init", "-q", "-b", "main")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "fixture")
    subprocess.run(["chown", "-R", "1000:1000", str(r)], check=True)
    return r


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_the_action_on_a_runner(docker_ready: None, tmp_path: Path, repo: Path, runtime: str) -> None:
    require_runtime(runtime)
    data = tmp_path / "data"
    data.mkdir()
    (data / OWNER_FILE).write_text(TEST_OWNER + "\n")  # the run's sandboxes are the run's
    artifacts = tmp_path / "runner-temp" / "loom-agent"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))},
        "PYTHONPATH": str(ROOT),
        "LOOM_DATA_DIR": str(data),
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_CATALOG": "false",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKSPACE": str(repo),
        "GITHUB_OUTPUT": str(tmp_path / "github_output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "step_summary.md"),
        "RUNNER_TEMP": str(tmp_path / "runner-temp"),
        "INPUT_AGENT": "command",
        "INPUT_COMMAND": "sh agent.sh",
        "INPUT_EGRESS": "pypi.org",
        "INPUT_RUNTIME": runtime,
        "INPUT_TIMEOUT": "5m",
        "INPUT_COMMIT_MESSAGE": "agent: make add add",
    }
    try:
        r = subprocess.run(
            [sys.executable, "-m", "worker.agents.action"], cwd=repo, env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert "agent: refused" in r.stdout and "agent: reached" not in r.stdout

        for name in ("agent.patch", "report.md", "transcript.jsonl", "run.json"):
            assert (artifacts / name).is_file(), name
        assert "agent: done" in (artifacts / "transcript.jsonl").read_text()

        outputs = (tmp_path / "github_output").read_text()
        assert "patch<<" in outputs and str(artifacts / "agent.patch") in outputs
        lines = outputs.splitlines()
        assert lines[lines.index(next(x for x in lines if x.startswith("changed<<"))) + 1] == "true"
        files_at = lines.index(next(x for x in lines if x.startswith("files<<")))
        assert sorted(lines[files_at + 1 : files_at + 3]) == ["src/calc.py", "src/twice.py"]

        # The patch applies with `git am` in a clean clone, and gives the agent's tree.
        clone = tmp_path / "clone"
        # (git refuses to clone a repository of another user, here the sandbox's uid 1000:
        # safe.directory does not reach the local transport; the run is over, so take it back)
        subprocess.run(["chown", "-R", "0:0", str(repo)], check=True)
        git(tmp_path, "clone", "-q", str(repo), str(clone))
        git(clone, "am", str(artifacts / "agent.patch"))
        assert "agent: make add add" in git(clone, "log", "-1", "--format=%s")
        assert (clone / "src" / "calc.py").read_text() == (repo / "src" / "calc.py").read_text()
        assert "return a + b" in (clone / "src" / "calc.py").read_text()
        assert (clone / "src" / "twice.py").read_text() == "def twice(x):\n    return 2 * x\n"
        assert git(clone, "status", "--porcelain") == ""

        summary = (tmp_path / "step_summary.md").read_text()
        assert summary.startswith("## loom agent: sh (exit 0, 2 files changed)")
        assert "example.com" in summary  # the refused host, from the report
        assert (artifacts / "report.md").read_text() in summary
    finally:
        subprocess.run(
            [sys.executable, "-m", "worker.cli", "stop", "-w", str(repo)], env=env, capture_output=True, check=False
        )
