"""The README's commands, run as a newcomer runs them: from a fresh clone.

Every command line of the README's ``sh`` blocks is either run here or named in
:data:`ELSEWHERE` with the test that runs it (CI itself runs ``scripts/test``); a command
added to the README that neither runs is a failure, and so is an entry here that the README
no longer has. The clone is installed with ``pip install .`` into a virtualenv of its own
(no editable install, no test dependencies: what a user gets), then ``loom-worker setup``,
``doctor``, ``demo``, the "One tool call" block in a project directory, the Python example
and the MCP client configuration are used exactly as printed (only the example paths are
replaced by the test's own).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_docker

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

#: README commands another test or CI runs: the command -> where.
ELSEWHERE = {
    "scripts/demo": "CI's scripts/test runs scripts/setup; `loom-worker demo` (its other half) runs here",
    "scripts/test": "CI (.ci/run)",
    "docker compose up -d --wait": "tests/e2e/test_compose.py, from a fresh clone",
    "docker compose exec worker cat /var/lib/loom/api-token": "tests/e2e/test_compose.py reads the token there",
    ".venv/bin/pytest tests/unit": "CI runs every tier (scripts/test)",
}


def readme_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def readme_commands() -> list[str]:
    """Every command line of the README's ``sh`` blocks, without its trailing comment."""
    out = []
    for block in readme_blocks("sh"):
        for line in block.splitlines():
            command = re.sub(r"\s+#\s.*$", "", line).strip()
            if command and not command.startswith("#"):
                out.append(command)
    return out


def test_every_readme_command_is_accounted_for() -> None:
    """No check of Docker: the bookkeeping between the README and these tests."""
    commands = readme_commands()
    ran_here = {c for c in commands if c.startswith(("pip install", "loom-worker "))}
    unknown = [c for c in commands if c not in ran_here and c not in ELSEWHERE]
    assert not unknown, f"README commands no test runs (run them here or name their test in ELSEWHERE): {unknown}"
    stale = [c for c in ELSEWHERE if c not in commands]
    assert not stale, f"ELSEWHERE names commands the README no longer has: {stale}"
    assert "tests/e2e/test_compose.py" in " ".join(ELSEWHERE.values())
    assert (REPO / "tests/e2e/test_compose.py").read_text().count("api-token") >= 1


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh clone of what is committed, ``pip install .`` into a virtualenv of its own;
    (its bin directory, the environment to run it in)."""
    require_docker()
    root = tmp_path_factory.mktemp("readme")
    clone = root / "loom-worker"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "."], cwd=clone, capture_output=True, text=True, timeout=600
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOM_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
        HOME=str(root / "home"),  # a newcomer's data directory, not this run's
        TESTCONTAINERS_RYUK_DISABLED="true",
    )
    env.pop("LOOM_CLI_DAEMON", None)  # as a user runs it: through the CLI's local worker
    (root / "home").mkdir()
    yield venv / "bin", env
    for args in (["daemon", "stop"], ["gc"]):
        subprocess.run([str(venv / "bin/loom-worker"), *args], env=env, capture_output=True, timeout=120)
    shutil.rmtree(root, ignore_errors=True)


def run(
    env: dict[str, str], command: str, cwd: Path, *, ok: tuple[int, ...] = (0,)
) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode in ok, f"{command}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def test_the_pip_path_setup_doctor_demo(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    _bin, env = installed
    commands = [c for c in readme_commands() if c.startswith("loom-worker ") and " --workspace " not in c]
    assert commands == ["loom-worker setup", "loom-worker doctor"], commands
    first = run(env, "loom-worker setup", tmp_path)
    assert "[FAIL]" not in first.stdout, first.stdout
    again = run(env, "loom-worker setup", tmp_path)
    assert "[done]" not in again.stdout, again.stdout  # a second run builds nothing
    doctor = run(env, "loom-worker doctor", tmp_path)
    assert "[FAIL]" not in doctor.stdout, doctor.stdout
    demo = run(env, "loom-worker demo", tmp_path)  # what scripts/demo runs after setting up
    assert "demo ok" in demo.stdout, (demo.stdout, demo.stderr)
    # Its own scratch workspace is not root's: no warning about it on the main job's screen.
    assert "root_workspace" not in demo.stderr + doctor.stderr, (demo.stderr, doctor.stderr)


def test_one_tool_call_as_printed(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    _bin, env = installed
    proj = tmp_path / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "README.md").write_text("# proj\n")
    (proj / "tests/__init__.py").write_text("")
    (proj / "tests/test_it.py").write_text(
        "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        self.assertTrue(True)\n"
    )
    commands = [c for c in readme_commands() if c.startswith("loom-worker ") and " --workspace ./proj" in c]
    assert len(commands) >= 4, commands
    outputs = {}
    for command in commands:
        outputs[command] = run(env, command, tmp_path).stdout
    read = next(v for k, v in outputs.items() if "read_file" in k)
    assert json.loads(read)["success"] and "# proj" in json.loads(read)["output"]
    shell = next(v for k, v in outputs.items() if "shell_execute" in k)
    assert json.loads(shell)["success"], shell
    log = next(v for k, v in outputs.items() if k.startswith("loom-worker log"))
    undo = next(v for k, v in outputs.items() if k.startswith("loom-worker undo"))
    assert log is not None and undo is not None
    run(env, f"loom-worker stop --workspace {proj}", tmp_path)


def test_the_python_example_as_printed(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    bin_dir, env = installed
    (example,) = [b for b in readme_blocks("python") if "default_registry" in b]
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hello.txt").write_text("hi\n")
    script = example.replace("/path/to/proj", str(proj))
    code = "import asyncio\n\nasync def main():\n" + "\n".join("    " + line for line in script.splitlines())
    code += "\n\nasyncio.run(main())\n"
    p = subprocess.run([str(bin_dir / "python"), "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("True") and "hello.txt" in p.stdout, p.stdout
    run(env, f"loom-worker stop --workspace {proj}", tmp_path)


def test_the_mcp_client_configuration_as_printed(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    bin_dir, env = installed
    (config,) = [json.loads(b) for b in readme_blocks("json") if "mcpServers" in b]
    server = config["mcpServers"]["loom"]
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "notes.md").write_text("from the README test\n")
    args = [str(proj) if a == "/path/to/proj" else a for a in server["args"]]
    params = StdioServerParameters(command=str(bin_dir / server["command"]), args=args, env=env)

    async def session() -> tuple[set[str], str]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            result = await s.call_tool("read_file", {"path": "notes.md"})
            return names, result.content[0].text  # type: ignore[union-attr]

    names, text = asyncio.run(session())
    assert {"read_file", "write_file", "edit_file", "shell_execute"} <= names
    assert "from the README test" in text
    run(env, f"loom-worker stop --workspace {proj}", tmp_path)
