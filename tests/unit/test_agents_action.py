"""The GitHub Action's entry point (worker.agents.action): inputs, outputs, summary,
artifacts. Only the subprocess runner is replaced, by one that does what ``loom-worker``'s
commands leave behind (a run directory, a patch, a report); the docker tier runs the real
commands (tests/docker/agents/test_action.py)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from worker.agents import action, ghio
from worker.agents.action import InputError, parse_inputs

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-ant-test-0123456789abcdef"
PATCH = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: loom agent <agent@loom.invalid>
Subject: [PATCH] claude: fix the bug

---
diff --git a/src/a.py b/src/a.py
--- a/src/a.py
+++ b/src/a.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1 @@
+hi
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "repo"
    (w / ".git").mkdir(parents=True)
    (w / ".git" / "config").write_text('[remote "origin"]\n\turl = https://github.com/o/r\n')
    return w


def env_for(ws: Path, tmp_path: Path, **inputs: str) -> dict[str, str]:
    env = {
        "GITHUB_WORKSPACE": str(ws),
        "GITHUB_ACTIONS": "true",
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "RUNNER_TEMP": str(tmp_path / "runner-temp"),
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "PATH": "/usr/bin:/bin",
    }
    for name, value in inputs.items():
        env[ghio.input_env(name.replace("_", "-"))] = value
    return env


class FakeLoom:
    """Does what each loom-worker command leaves behind; records what it was given."""

    def __init__(self, data_dir: Path, workspace: Path, *, agent_code: int = 0, patch: str = PATCH) -> None:
        self.data_dir, self.workspace = data_dir, workspace
        self.agent_code, self.patch = agent_code, patch
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv: list[str], env: Mapping[str, str], stdout: Path | None) -> int:
        self.calls.append((argv, dict(env)))
        args = argv[3:]  # python -m worker.cli
        if args[:2] == ["agent", "run"]:
            from sandbox.identity import workspace_digest

            run = self.data_dir / "workspaces" / workspace_digest(self.workspace)[:32] / "agent-runs" / "r-1"
            run.mkdir(parents=True)
            (run / "transcript.jsonl").write_text('{"type": "result"}\n')
            (run / "run.json").write_text(f'{{"exit_code": {self.agent_code}}}')
            return self.agent_code
        if args[0] == "diff":
            assert stdout is not None
            stdout.write_text(self.patch)
            return 0
        if args[0] == "report":
            assert stdout is not None
            stdout.write_text("# Report\n\n## Hosts refused\n\n- example.com:443\n")
            return 0
        return 0

    def argv(self, *head: str) -> list[str]:
        return next(a for a, _ in self.calls if a[3 : 3 + len(head)] == list(head))


def read_outputs(path: Path) -> dict[str, str]:
    """$GITHUB_OUTPUT read as GitHub reads it (heredoc form)."""
    out: dict[str, str] = {}
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        if not lines[i]:
            i += 1
            continue
        name, delim = lines[i].split("<<", 1)
        end = lines.index(delim, i + 1)
        out[name] = "\n".join(lines[i + 1 : end])
        i = end + 1
    return out


# -- inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "named"),
    [
        ({}, "agent"),
        ({"agent": "gemini"}, "agent"),
        ({"agent": "claude", "anthropic_api_key": KEY}, "prompt"),
        ({"agent": "claude", "prompt": "x"}, "anthropic-api-key"),
        ({"agent": "codex", "prompt": "x"}, "openai-api-key"),
        ({"agent": "command"}, "command"),
        ({"agent": "claude", "command": "x", "prompt": "x", "anthropic_api_key": KEY}, "command"),
        ({"agent": "command", "command": "sh 'unclosed"}, "command"),
        ({"agent": "command", "command": "sh", "prompt_file": "nope.md"}, "prompt-file"),
        ({"agent": "command", "command": "sh", "key_env": "1BAD", "key_host": "h"}, "key-env"),
        ({"agent": "command", "command": "sh", "key_env": "K"}, "key-host"),
        ({"agent": "command", "command": "sh", "key_host": "h.example"}, "key-env"),
        ({"agent": "command", "command": "sh", "api_key": "v"}, "api-key"),
        ({"agent": "command", "command": "sh", "key_env": "K", "key_host": "h.example"}, "api-key"),
        ({"agent": "command", "command": "sh", "key_env": "K", "key_host": "h/x", "api_key": "v"}, "key-host"),
        ({"agent": "command", "command": "sh", "timeout": "soon"}, "timeout"),
        ({"agent": "command", "command": "sh", "timeout": "0"}, "timeout"),
        ({"agent": "command", "command": "sh", "max_cost": "-1"}, "max-cost"),
        ({"agent": "command", "command": "sh", "max_cost": "nan"}, "max-cost"),
        ({"agent": "command", "command": "sh", "runtime": "kata"}, "runtime"),
        ({"agent": "command", "command": "sh", "base_url": "ftp://x"}, "base-url"),
        ({"agent": "command", "command": "sh", "base_url": "http://llm.example"}, "base-url"),  # agent run's rule
        ({"agent": "command", "command": "sh", "key_env": "K", "key_host": "*.example", "api_key": "v"}, "key-host"),
        ({"agent": "command", "command": "sh", "agent_args": "'x"}, "agent-args"),
    ],
)
def test_a_refused_input_is_named(ws: Path, tmp_path: Path, inputs: dict[str, str], named: str) -> None:
    with pytest.raises(InputError) as e:
        parse_inputs(env_for(ws, tmp_path, **inputs))
    assert e.value.name == named
    assert str(e.value).startswith(f"input {named}: ")
    assert KEY not in str(e.value)


def test_workspace_and_artifacts_dir_are_checked(ws: Path, tmp_path: Path) -> None:
    env = env_for(ws, tmp_path, agent="command", command="sh")
    with pytest.raises(InputError, match="GITHUB_WORKSPACE"):
        parse_inputs({**env, "GITHUB_WORKSPACE": ""})
    with pytest.raises(InputError, match="not a directory"):
        parse_inputs({**env, "GITHUB_WORKSPACE": str(tmp_path / "absent")})
    with pytest.raises(InputError) as e:
        parse_inputs({**env, "INPUT_ARTIFACTS_DIR": str(ws / "out")})
    assert e.value.name == "artifacts-dir"
    assert parse_inputs(env).artifacts == (tmp_path / "runner-temp" / "loom-agent").resolve()


def test_inputs_parsed(ws: Path, tmp_path: Path) -> None:
    (ws / "task.md").write_text("Fix the bug\nin src/a.py\n")
    i = parse_inputs(
        env_for(
            ws,
            tmp_path,
            agent="claude",
            prompt_file="task.md",
            anthropic_api_key=KEY,
            agent_version="2.1.3",
            agent_args="--model 'claude x'",
            egress="pypi, npm\nregistry.example.com",
            timeout="30m",
            max_cost="$2.5",
            runtime="runsc",
        )
    )
    assert (i.agent, i.agent_args, i.version, i.runtime) == ("claude", ["--model", "claude x"], "2.1.3", "runsc")
    assert i.prompt is None and i.prompt_file == ws / "task.md"
    assert i.keys == {"ANTHROPIC_API_KEY": KEY}
    assert i.egress == ["pypi", "npm", "registry.example.com"]
    assert (i.timeout, i.max_cost) == (1800, 2.5)
    assert i.message == "claude: task.md"
    assert KEY not in i.redacted() and "ANTHROPIC_API_KEY" in i.redacted()

    c = parse_inputs(
        env_for(ws, tmp_path, agent="command", command="./agent.sh --fast", agent_args="x", prompt="  Do it  \nmore")
    )
    assert (c.agent, c.agent_args, c.known, c.message) == ("./agent.sh", ["--fast", "x"], False, "command: Do it")
    # The key may come from the step's environment instead of an input.
    k = parse_inputs({**env_for(ws, tmp_path, agent="codex", prompt="x"), "OPENAI_API_KEY": "sk-o"})
    assert k.keys == {"OPENAI_API_KEY": "sk-o"}


# -- the runner's files -----------------------------------------------------------------


def test_outputs_use_heredoc_delimiters_not_in_the_value(tmp_path: Path) -> None:
    value = "a\nghadelimiter_x\nb"
    text = ghio.format_output("files", value)
    head, *body, tail, _ = text.split("\n")
    name, delim = head.split("<<")
    assert name == "files" and delim == tail and delim.startswith("ghadelimiter_")
    assert "\n".join(body) == value and delim not in value
    with pytest.raises(ValueError, match="output name"):
        ghio.format_output("bad name", "x")
    out = tmp_path / "o"
    out.write_text("earlier<<EOF\nkept\nEOF\n")
    ghio.set_outputs({"GITHUB_OUTPUT": str(out)}, {"a": "1", "b": "x\ny"})
    assert read_outputs(out) == {"earlier": "kept", "a": "1", "b": "x\ny"}
    assert ghio.set_outputs({}, {"a": "1"}) is None


def test_workflow_commands_and_dotenv() -> None:
    assert ghio.command("error", "a\nb 100%", title="t: x,y") == "::error title=t%3A x%2Cy::a%0Ab 100%25"
    assert ghio.command("endgroup") == "::endgroup::"
    assert ghio.format_dotenv({"changed": "true", "files": "a\nb", "exit-code": "0"}) == (
        "LOOM_AGENT_CHANGED=true\nLOOM_AGENT_FILES=a,b\nLOOM_AGENT_EXIT_CODE=0\n"
    )


# -- a whole run -------------------------------------------------------------------------


def test_a_run_writes_artifacts_outputs_and_summary(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = env_for(
        ws, tmp_path, agent="claude", prompt="Fix the bug", anthropic_api_key=KEY, egress="pypi", timeout="90"
    )
    env["LOOM_DOTENV"] = str(tmp_path / "loom.env")
    fake = FakeLoom(tmp_path / "data", ws)
    assert action.main(env, fake) == 0

    # The order of the steps, and what each got.
    heads = [a[3:5] for a, _ in fake.calls]
    assert heads == [["agent", "install"], ["workspace", "set"], ["agent", "run"], ["diff", "-w"], ["report", "-w"]]
    run_argv = fake.argv("agent", "run")
    assert run_argv[:3] == [action.sys.executable, "-m", "worker.cli"]
    assert run_argv[3:8] == ["agent", "run", "-w", str(ws.resolve()), "claude"]
    assert "--timeout" in run_argv and run_argv[run_argv.index("--timeout") + 1] == "90"
    assert fake.argv("workspace", "set")[-2:] == ["--egress", "pypi"]
    assert fake.argv("diff")[-2:] == ["--message", "claude: Fix the bug"]
    assert fake.argv("report")[-2:] == ["--run", "r-1"]
    for argv, e in fake.calls:
        assert KEY not in " ".join(argv)
        assert not any(k.startswith("INPUT_") for k in e)
        assert e["LOOM_DATA_DIR"] == str(tmp_path / "data")
        assert (e.get("ANTHROPIC_API_KEY") == KEY) == (argv[3:5] == ["agent", "run"])

    art = tmp_path / "runner-temp" / "loom-agent"
    assert (art / "agent.patch").read_text() == PATCH
    assert (art / "transcript.jsonl").read_text() == '{"type": "result"}\n'
    assert (art / "run.json").is_file() and (art / "report.md").is_file()
    assert (art / "prompt.txt").read_text() == "Fix the bug"

    out = read_outputs(tmp_path / "output")
    assert out == {
        "artifacts": str(art),
        "patch": str(art / "agent.patch"),
        "report": str(art / "report.md"),
        "transcript": str(art / "transcript.jsonl"),
        "changed": "true",
        "files": "src/a.py\nnew.txt",
        "exit-code": "0",
        "run-id": "r-1",
    }
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("## loom agent: claude (exit 0, 2 files changed)")
    assert "- `src/a.py`" in summary and "- example.com:443" in summary
    dotenv = (tmp_path / "loom.env").read_text()
    assert dotenv.startswith("LOOM_AGENT_CHANGED=true\nLOOM_AGENT_FILES=src/a.py,new.txt\n")
    stdout = capsys.readouterr().out
    assert "::group::loom-worker agent run" in stdout and KEY not in stdout


def test_the_agents_status_and_a_failed_step(ws: Path, tmp_path: Path) -> None:
    env = env_for(ws, tmp_path, agent="command", command="./agent.sh", key_env="K", key_host="h.example", api_key="v")
    fake = FakeLoom(tmp_path / "data", ws, agent_code=3, patch="")
    assert action.main(env, fake) == 3
    run_argv = fake.argv("agent", "run")
    assert run_argv[-4:] == ["--key-env", "K", "--key-host", "h.example"]
    assert "--prompt-file" not in run_argv
    assert not any(a[3:5] == ["agent", "install"] for a, _ in fake.calls)  # a command is not installed
    out = read_outputs(tmp_path / "output")
    assert (out["changed"], out["files"], out["exit-code"]) == ("false", "", "3")
    assert "(exit 3, 0 files changed)" in (tmp_path / "summary.md").read_text()

    def failing_install(argv: list[str], e: Mapping[str, str], stdout: Path | None) -> int:
        return 1 if argv[3:5] == ["agent", "install"] else fake(argv, e, stdout)

    (tmp_path / "output").unlink()
    env = env_for(ws, tmp_path, agent="codex", prompt="x", openai_api_key="sk-o")
    assert action.main(env, failing_install) == 1
    out = read_outputs(tmp_path / "output")
    assert out["exit-code"] == "" and out["changed"] == "false"
    assert "**Failed loom steps:** agent install" in (tmp_path / "summary.md").read_text()


def test_a_checkout_that_kept_a_token_is_refused(ws: Path, tmp_path: Path) -> None:
    env = env_for(ws, tmp_path, agent="command", command="sh")
    fake = FakeLoom(tmp_path / "data", ws)
    (ws / ".git" / "config").write_text(
        '[http "https://github.com/"]\n\textraheader = AUTHORIZATION: basic eC1hY2Nlc3MtdG9rZW46Z2hz\n'
    )
    assert action.main(env, fake) == 1 and fake.calls == []
    (ws / ".git" / "config").write_text('[remote "origin"]\n\turl = https://gitlab-ci-token:glcbt-x@gitlab.com/o/r\n')
    assert action.main(env, fake) == 1 and fake.calls == []


def test_bad_input_exits_2_before_anything_runs(ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeLoom(tmp_path / "data", ws)
    assert action.main(env_for(ws, tmp_path, agent="claude", prompt="x"), fake) == 2
    assert fake.calls == [] and not (tmp_path / "output").exists()
    captured = capsys.readouterr()
    assert "input anthropic-api-key:" in captured.err
    assert "::error title=loom agent%3A bad input::input anthropic-api-key" in captured.out


# -- the files users copy ------------------------------------------------------------------


def test_action_yml_inputs_are_read_mapped_and_documented() -> None:
    spec = yaml.safe_load((ROOT / "action.yml").read_text())
    assert spec["runs"]["using"] == "composite"
    inputs = set(spec["inputs"])
    assert inputs == set(action.INPUTS) | set(action.SETUP_INPUTS)
    step = next(s for s in spec["runs"]["steps"] if s.get("id") == "agent")
    assert step["run"] == "python -m worker.agents.action"
    for name in action.INPUTS:
        assert f"inputs.{name}" in step["env"][ghio.input_env(name)], name
    assert {k for k in step["env"] if k.startswith("INPUT_")} == {ghio.input_env(n) for n in action.INPUTS}
    text = (ROOT / "action.yml").read_text()
    for name in action.SETUP_INPUTS:
        assert f"inputs.{name}" in text, name
    assert set(spec["outputs"]) == set(action.OUTPUTS)
    upload = next(s for s in spec["runs"]["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["uses"] == "actions/upload-artifact@v4" and "always()" in upload["if"]
    docs = (ROOT / "docs" / "ci.md").read_text()
    for name in sorted(inputs | set(action.OUTPUTS)):
        assert re.search(rf"`{re.escape(name)}`", docs), f"docs/ci.md does not document {name}"


def test_workflow_and_gitlab_template_parse() -> None:
    wf = yaml.safe_load((ROOT / "examples" / "github" / "agent-workflow.yml").read_text())
    agent, propose = wf["jobs"]["agent"], wf["jobs"]["propose"]
    assert agent["permissions"] == {"contents": "read"}
    assert propose["needs"] == "agent"
    assert propose["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert any("git am" in s.get("run", "") for s in propose["steps"])
    gl = yaml.safe_load((ROOT / "ci" / "gitlab" / "loom-agent.gitlab-ci.yml").read_text())
    assert gl["loom-agent"]["artifacts"]["reports"]["dotenv"] == "loom-agent/loom.env"
    assert gl["loom-propose"]["needs"][0]["job"] == "loom-agent"
    script = "\n".join(gl["loom-agent"]["script"])
    for name in action.INPUTS:
        if name not in ("anthropic-api-key", "openai-api-key", "api-key"):  # keys: from the job's environment
            assert ghio.input_env(name) in script, name
    # A shell can run the scripts as written.
    for job in ("loom-agent", "loom-propose"):
        body = "\n".join(gl[job]["script"])
        assert subprocess.run(["bash", "-n"], input=body, text=True, check=False).returncode == 0
