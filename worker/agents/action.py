"""``python -m worker.agents.action``: the GitHub Action's (``action.yml``) one entry point,
run after loom is set up on the runner (docs/ci.md).

It reads the action's inputs from ``INPUT_*`` (:func:`.ghio.input_env`), checks them all
before anything runs (a bad one: exit 2, the message naming the input), then drives the
``loom-worker`` command as its own subprocesses (the same interpreter, ``-m worker.cli``):

1. ``agent install AGENT [VERSION]`` (a known agent);
2. ``workspace set -w $GITHUB_WORKSPACE --egress ... --runtime ...`` (when asked);
3. ``agent run -w $GITHUB_WORKSPACE AGENT --prompt-file F ...``, the provider's key in *its*
   environment only (``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``, the ``key-env``), never on
   a command line; ``agent run`` keeps it on the host as a gateway secret;
4. ``diff --format patch`` into ``agent.patch``, ``report --run ID`` into ``report.md``;

and writes the artifacts directory (``agent.patch``, ``report.md``, ``transcript.jsonl``,
``run.json``), the step's outputs (:data:`OUTPUTS`) and the job summary; with
``LOOM_DOTENV`` set (GitLab), a dotenv report of the outputs too. Steps 4 and the
outputs happen whatever the agent did, so a failed or timed-out session still hands over
what it changed.

Exit status: 2 a refused input; the agent's own status when it was not 0; 1 when a loom
step failed (install, settings, diff, report: the log says which); else 0.

This is a program, not library code: it prints (workflow commands on stdout, its own
lines on stderr) and runs its subprocesses one after the other, synchronously (nothing
else runs beside them). The subprocess runner is a parameter so the tests can drive
everything else without an engine.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import ghio, providers

#: The inputs this entry point reads (action.yml maps each to ``INPUT_*`` in its step).
INPUTS = (
    "agent",
    "command",
    "prompt",
    "prompt-file",
    "agent-version",
    "agent-args",
    "anthropic-api-key",
    "openai-api-key",
    "api-key",
    "key-env",
    "key-host",
    "base-url",
    "egress",
    "timeout",
    "max-cost",
    "runtime",
    "commit-message",
    "artifacts-dir",
)
#: The inputs only action.yml's own steps use (setting loom up, uploading).
SETUP_INPUTS = ("loom-version", "python-version", "artifact-name")
#: The step's outputs.
OUTPUTS = ("artifacts", "patch", "report", "transcript", "changed", "files", "exit-code", "run-id")

AGENTS = ("claude", "codex", "opencode", "command")
#: Each known agent's key input and the variable ``agent run`` takes it from.
PROVIDER_KEYS = {"claude": ("anthropic-api-key", "ANTHROPIC_API_KEY"), "codex": ("openai-api-key", "OPENAI_API_KEY")}
RUNTIMES = ("runc", "runsc")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([smh]?)$")
_DIFF_FILE = re.compile(r"^diff --git a/(.+?) b/(.+)$", re.MULTILINE)


class InputError(ValueError):
    """A refused input: ``name`` and why."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"input {name}: {message}")
        self.name = name


@dataclass
class Inputs:
    """The checked inputs."""

    workspace: Path
    agent: str  # a catalog name, or the command's program
    agent_args: list[str]
    prompt: str | None
    prompt_file: Path | None
    version: str | None
    keys: dict[str, str] = field(default_factory=dict)  # variable -> value, for `agent run` only
    key_env: str | None = None
    key_host: str | None = None
    base_url: str | None = None
    egress: list[str] = field(default_factory=list)
    timeout: int | None = None
    max_cost: float | None = None
    runtime: str | None = None
    message: str = ""
    artifacts: Path = Path("loom-agent")
    known: bool = True  # a catalog agent (installed first)

    def redacted(self) -> str:
        """What the log may say about the run (no key values)."""
        keys = ", ".join(sorted(self.keys)) or "none"
        return f"agent {self.agent} in {self.workspace}; keys from {keys}; egress {','.join(self.egress) or '-'}"


def _seconds(name: str, text: str) -> int | None:
    if not text:
        return None
    m = _DURATION.match(text.lower())
    if not m:
        raise InputError(name, f"{text!r} is not a duration (seconds, or a number with s, m or h)")
    value = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if value <= 0:
        raise InputError(name, "must be more than 0")
    return math.ceil(value)


def _cost(name: str, text: str) -> float | None:
    if not text:
        return None
    try:
        value = float(text.lstrip("$"))
    except ValueError:
        raise InputError(name, f"{text!r} is not an amount in USD") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(name, "must be a positive amount in USD")
    return value


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def parse_inputs(env: Mapping[str, str]) -> Inputs:
    """The inputs of ``env`` checked, paths resolved against ``$GITHUB_WORKSPACE``.

    Raises :class:`InputError` naming the first refused input (``GITHUB_WORKSPACE`` too)."""
    get = lambda name: ghio.read_input(env, name)  # noqa: E731
    ws_text = env.get("GITHUB_WORKSPACE", "").strip()
    if not ws_text:
        raise InputError("GITHUB_WORKSPACE", "not set (the repository's checkout the agent works on)")
    workspace = Path(ws_text).resolve()
    if not workspace.is_dir():
        raise InputError("GITHUB_WORKSPACE", f"{workspace} is not a directory")

    agent = get("agent")
    if agent not in AGENTS:
        choices = ", ".join(AGENTS)
        raise InputError("agent", f"{agent!r}: one of {choices}" if agent else f"required: {choices}")
    command = get("command")
    extra_text = get("agent-args")
    try:
        extra = shlex.split(extra_text)
    except ValueError as e:
        raise InputError("agent-args", f"cannot be split as a shell would: {e}") from None
    if agent == "command":
        if not command:
            raise InputError("command", "required with agent: command (the program and its arguments)")
        try:
            argv = shlex.split(command)
        except ValueError as e:
            raise InputError("command", f"cannot be split as a shell would: {e}") from None
        program, args = argv[0], argv[1:] + extra
    else:
        if command:
            raise InputError("command", f"only with agent: command (agent is {agent})")
        program, args = agent, extra

    prompt, prompt_file_text = env.get(ghio.input_env("prompt"), ""), get("prompt-file")
    if prompt.strip() and prompt_file_text:
        raise InputError("prompt-file", "give prompt or prompt-file, not both")
    prompt_file = None
    if prompt_file_text:
        prompt_file = (workspace / prompt_file_text).resolve()
        if not prompt_file.is_file():
            raise InputError("prompt-file", f"{prompt_file_text}: no such file (relative to GITHUB_WORKSPACE)")
    elif not prompt.strip():
        prompt = ""
        if agent != "command":
            raise InputError("prompt", f"required for agent {agent} (or prompt-file)")

    keys: dict[str, str] = {}
    if agent in PROVIDER_KEYS:
        key_input, variable = PROVIDER_KEYS[agent]
        value = get(key_input) or env.get(variable, "")
        if not value:
            raise InputError(key_input, f"required for agent {agent} (a secret: ${{{{ secrets.{variable} }}}})")
        keys[variable] = value
    key_env, key_host, api_key = get("key-env"), get("key-host"), get("api-key")
    if key_env and not _ENV_NAME.match(key_env):
        raise InputError("key-env", f"{key_env!r} is not an environment variable name")
    if bool(key_env) != bool(key_host):
        raise InputError("key-host" if key_env else "key-env", "key-env and key-host go together")
    if key_env and key_host:
        try:  # `agent run`'s own check (named hosts only: no wildcard), before anything runs
            providers.custom(key_env, key_host)
        except providers.ProviderError as e:
            raise InputError("key-host", str(e).removeprefix("--key-host: ")) from None
    if api_key and not key_env:
        raise InputError("api-key", "needs key-env and key-host (which variable, for which host)")
    if key_env:
        value = api_key or env.get(key_env, "")
        if not value:
            raise InputError("api-key", f"no key: give api-key, or set {key_env} in the step's env")
        keys[key_env] = value

    base_url = get("base-url") or None
    if base_url:
        try:  # `agent run`'s own check: https only (a key is never sent over plain HTTP)
            providers.host_of_url(base_url)
        except providers.ProviderError as e:
            raise InputError("base-url", str(e).removeprefix("--base-url: ")) from None
    egress = [e.strip() for e in re.split(r"[,\s]+", get("egress")) if e.strip()]
    runtime = get("runtime") or None
    if runtime and runtime not in RUNTIMES:
        raise InputError("runtime", f"{runtime!r}: one of {', '.join(RUNTIMES)}")

    artifacts_text = get("artifacts-dir") or os.path.join(env.get("RUNNER_TEMP") or ".", "loom-agent")
    artifacts = Path(artifacts_text)
    artifacts = (artifacts if artifacts.is_absolute() else Path.cwd() / artifacts).resolve()
    if _inside(artifacts, workspace):
        # The patch and report would land in the tree the next job applies the patch to.
        raise InputError("artifacts-dir", f"{artifacts} is inside GITHUB_WORKSPACE; choose a directory outside it")

    first_line = next((line.strip() for line in prompt.splitlines() if line.strip()), "")
    if not first_line and prompt_file is not None:
        first_line = prompt_file.name
    # The patch's subject: what the agent was asked, as far as a subject line goes.
    subject = f"{agent}: {first_line}"[:72].rstrip() if first_line else f"loom agent: {agent}"
    message = get("commit-message") or subject
    return Inputs(
        workspace=workspace,
        agent=program,
        agent_args=args,
        prompt=prompt if prompt.strip() else None,
        prompt_file=prompt_file,
        version=get("agent-version") or None,
        keys=keys,
        key_env=key_env or None,
        key_host=key_host or None,
        base_url=base_url,
        egress=egress,
        timeout=_seconds("timeout", get("timeout")),
        max_cost=_cost("max-cost", get("max-cost")),
        runtime=runtime,
        message=message,
        artifacts=artifacts,
        known=agent != "command",
    )


_URL_CREDENTIALS = re.compile(r"://[^/\s@:]+:[^/\s@]+@")


def persisted_token(workspace: Path) -> bool:
    """Whether the checkout kept a credential in ``.git/config``, which the sandbox would
    see: actions/checkout's ``extraheader`` (``persist-credentials: true``), or a remote
    URL holding one (GitLab's ``https://gitlab-ci-token:TOKEN@...``)."""
    try:
        text = (workspace / ".git" / "config").read_text(errors="replace")
    except OSError:
        return False
    return "extraheader" in text.lower() or bool(_URL_CREDENTIALS.search(text))


#: ``runner(argv, env, stdout)``: runs argv with env, its stdout into the file (None: ours);
#: its exit status.
Runner = Callable[[list[str], Mapping[str, str], Path | None], int]


def run_subprocess(argv: list[str], env: Mapping[str, str], stdout: Path | None) -> int:
    """The real runner. Raises :class:`OSError` when argv cannot be started."""
    sys.stdout.flush()
    if stdout is None:
        return subprocess.run(argv, env=dict(env), check=False).returncode
    with open(stdout, "wb") as out:
        return subprocess.run(argv, env=dict(env), stdout=out, check=False).returncode


def loom(*args: str) -> list[str]:
    """The ``loom-worker`` command line of this very installation."""
    return [sys.executable, "-m", "worker.cli", *args]


def run_dirs(data_dir: Path, workspace: Path) -> set[Path]:
    """The workspace's ``agent-runs/<id>`` directories (ag-run's layout)."""
    from sandbox.identity import workspace_digest

    root = data_dir / "workspaces" / workspace_digest(workspace)[:32] / "agent-runs"
    try:
        return {p for p in root.iterdir() if p.is_dir()}
    except OSError:
        return set()


def changed_files(patch: str) -> list[str]:
    """The paths a patch touches, in order, once each."""
    seen: dict[str, None] = {}
    for a, b in _DIFF_FILE.findall(patch):
        seen.setdefault(b if b != "/dev/null" else a, None)
    return list(seen)


@dataclass
class Outcome:
    """What the run left: the values behind the step's outputs."""

    exit_code: int = 0
    agent_code: int | None = None
    run_id: str = ""
    files: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # loom steps that failed


class Action:
    """One run of the action: :meth:`run` does the steps, :meth:`finish` the hand-off."""

    def __init__(self, inputs: Inputs, env: Mapping[str, str], data_dir: Path, runner: Runner) -> None:
        self.inputs = inputs
        self.data_dir = data_dir
        self.runner = runner
        self.github = ghio.on_runner(env)
        # Subprocesses get the runner's environment without the inputs (keys included).
        self.env = {k: v for k, v in env.items() if not k.startswith("INPUT_")}
        self.env["LOOM_DATA_DIR"] = str(data_dir)
        self.outcome = Outcome()

    def _say(self, text: str) -> None:
        print(f"loom agent action: {text}", file=sys.stderr, flush=True)

    def _step(
        self, what: str, argv: list[str], *, env: Mapping[str, str] | None = None, out: Path | None = None
    ) -> int:
        if self.github:
            print(ghio.command("group", f"loom-worker {what}"), flush=True)
        try:
            code = self.runner(argv, env if env is not None else self.env, out)
        except OSError as e:
            self._say(f"{what}: cannot run: {e}")
            code = 127
        finally:
            if self.github:
                print(ghio.command("endgroup"), flush=True)
        if code != 0 and what != "agent run":
            self.outcome.failed.append(what)
            self._say(f"{what} failed (exit {code})")
            if self.github:
                print(ghio.command("error", f"loom-worker {what} failed (exit {code})", title="loom agent"))
        return code

    def run(self) -> Outcome:
        """Installs, configures, runs the agent, writes the artifacts and outputs."""
        i = self.inputs
        i.artifacts.mkdir(parents=True, exist_ok=True)
        self._say(i.redacted())
        ok = True
        if i.known:
            version = [i.version] if i.version else []
            ok = self._step("agent install", loom("agent", "install", i.agent, *version)) == 0
        if ok and (i.egress or i.runtime):
            settings = ["--egress", ",".join(i.egress)] if i.egress else []
            settings += ["--runtime", i.runtime] if i.runtime else []
            ok = self._step("workspace set", loom("workspace", "set", "-w", str(i.workspace), *settings)) == 0
        if ok:
            before = run_dirs(self.data_dir, i.workspace)
            code = self._step("agent run", self._run_argv(), env={**self.env, **i.keys})
            self.outcome.agent_code = code
            new = sorted(run_dirs(self.data_dir, i.workspace) - before, key=lambda p: p.stat().st_mtime)
            if new:
                self.outcome.run_id = new[-1].name
                for name in ("transcript.jsonl", "run.json"):
                    if (new[-1] / name).is_file():
                        shutil.copyfile(new[-1] / name, i.artifacts / name)
        self._handoff()
        o = self.outcome
        o.exit_code = o.agent_code if o.agent_code else (1 if o.failed or o.agent_code is None else 0)
        return o

    def _run_argv(self) -> list[str]:
        i = self.inputs
        argv = loom("agent", "run", "-w", str(i.workspace), i.agent)
        if i.prompt is not None:
            # A file, not argv: a prompt may be longer than a command line can be.
            prompt = i.artifacts / "prompt.txt"
            prompt.write_text(i.prompt, encoding="utf-8")
            argv += ["--prompt-file", str(prompt)]
        elif i.prompt_file is not None:
            argv += ["--prompt-file", str(i.prompt_file)]
        if i.timeout is not None:
            argv += ["--timeout", str(i.timeout)]
        if i.max_cost is not None:
            argv += ["--max-cost", f"{i.max_cost:g}"]
        if i.key_env and i.key_host:
            argv += ["--key-env", i.key_env, "--key-host", i.key_host]
        if i.base_url:
            argv += ["--base-url", i.base_url]
        if i.agent_args:
            argv += ["--", *i.agent_args]
        return argv

    def _handoff(self) -> None:
        i, o = self.inputs, self.outcome
        patch = i.artifacts / "agent.patch"
        ws = str(i.workspace)
        if self._step("diff", loom("diff", "-w", ws, "--format", "patch", "--message", i.message), out=patch) != 0:
            patch.unlink(missing_ok=True)
        report = i.artifacts / "report.md"
        if self._step("report", loom("report", "-w", ws, *(["--run", o.run_id] if o.run_id else [])), out=report):
            report.unlink(missing_ok=True)
        text = patch.read_text(errors="replace") if patch.is_file() else ""
        o.files = changed_files(text)

    def outputs(self) -> dict[str, str]:
        """The step's outputs (:data:`OUTPUTS`)."""
        i, o = self.inputs, self.outcome
        patch = i.artifacts / "agent.patch"
        return {
            "artifacts": str(i.artifacts),
            "patch": str(patch) if patch.is_file() else "",
            "report": str(i.artifacts / "report.md") if (i.artifacts / "report.md").is_file() else "",
            "transcript": str(i.artifacts / "transcript.jsonl") if (i.artifacts / "transcript.jsonl").is_file() else "",
            "changed": "true" if o.files else "false",
            "files": "\n".join(o.files),
            "exit-code": "" if o.agent_code is None else str(o.agent_code),
            "run-id": o.run_id,
        }

    def summary(self) -> str:
        """The job summary: a headline, then the report (or why there is none)."""
        i, o = self.inputs, self.outcome
        state = "did not run" if o.agent_code is None else f"exit {o.agent_code}"
        n = len(o.files)
        lines = [f"## loom agent: {i.agent} ({state}, {n} file{'s' if n != 1 else ''} changed)", ""]
        if o.failed:
            lines += [f"**Failed loom steps:** {', '.join(o.failed)} (see the step's log)", ""]
        if o.files:
            lines += ["The patch (`agent.patch` in the artifacts) changes:", ""]
            lines += [f"- `{f}`" for f in o.files] + [""]
        report = i.artifacts / "report.md"
        if report.is_file():
            lines.append(report.read_text(errors="replace"))
        else:
            lines.append("_No report: `loom-worker report` did not produce one._")
        return "\n".join(lines).rstrip("\n") + "\n"


def main(env: Mapping[str, str] | None = None, runner: Runner = run_subprocess) -> int:
    """The entry point; its exit status (module docstring)."""
    env = dict(os.environ if env is None else env)
    try:
        inputs = parse_inputs(env)
    except InputError as e:
        print(f"loom agent action: error: {e}", file=sys.stderr)
        if ghio.on_runner(env):
            print(ghio.command("error", str(e), title="loom agent: bad input"))
        return 2
    if persisted_token(inputs.workspace):
        message = (
            "the checkout kept a token in .git/config (an http extraheader or a remote URL with credentials), "
            "which the agent's sandbox would read: check out with `persist-credentials: false`"
        )
        print(f"loom agent action: error: {message}", file=sys.stderr)
        if ghio.on_runner(env):
            print(ghio.command("error", message, title="loom agent"))
        return 1
    from ..settings import Settings

    data_dir = Path(env["LOOM_DATA_DIR"]) if env.get("LOOM_DATA_DIR") else Settings().data_dir
    action = Action(inputs, env, data_dir, runner)
    outcome = action.run()
    outputs = action.outputs()
    ghio.set_outputs(env, outputs)
    if env.get("LOOM_DOTENV"):
        # GitLab's dotenv report (ci/gitlab/loom-agent.gitlab-ci.yml): what a later job may
        # read; the paths are this job's own, so they are left out.
        dotenv = {k: outputs[k] for k in ("changed", "files", "exit-code", "run-id")}
        Path(env["LOOM_DOTENV"]).write_text(ghio.format_dotenv(dotenv), encoding="utf-8")
    ghio.append_summary(env, action.summary())
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
