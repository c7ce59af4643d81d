"""``agent run``'s orchestration: an agent CLI (or any command) run headless in a
workspace's sandbox as a loom background process, its provider key a gateway secret.

For the run: the key becomes a secret of the workspace for the provider's API host only
(the sandbox sees ``$KEY_ENV`` = a placeholder; a ``--key-file`` is named, never copied);
that host joins the workspace's egress allowlist; a known agent's install from the agents
store is asked for (the ``agents`` setting); the agent starts with its base URL and its
telemetry off; its stdout is handed to ``out`` as it comes and saved as
``transcript.jsonl`` (stderr to ``err`` and ``stderr.log``), under
``<data>/workspaces/<hash>/agent-runs/<run-id>/`` with ``run.json``. ``timeout`` ends it
(its whole tree); ``max_cost`` (USD, :mod:`.cost`) too. What it changed is recorded in the
changelog (one group per session, or per tool call with :mod:`.turns`). Afterwards the
secret and the allowlist are as they were.

    RunError (ValueError)    what was asked cannot be run (no key, a refused setting)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandbox.capabilities import background

from ..changelog.recorder import workspace_dir
from . import launch as launching
from . import pending, turns
from .cost import CostMeter
from .providers import Provider

#: Exit status when --max-cost stopped the agent; --timeout gives 124 (as timeout(1)).
EXIT_COST, EXIT_TIMEOUT = 3, 124


class RunError(ValueError):
    """The run cannot start as asked; ``field`` names the option at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class RunRequest:
    """One ``agent run``. ``key_value``: the key read from the host (never logged, never
    in run.json); ``key_file``: a file holding it (the secret names the file)."""

    agent: str
    prompt: str | None = None
    extra: list[str] = field(default_factory=list)
    provider: Provider | None = None
    key_value: str | None = field(default=None, repr=False)
    key_file: Path | None = None
    timeout: float = 3600.0
    max_cost: float | None = None
    #: Turn by turn recording (the agent's hooks); False: one group for the session.
    turns: bool = True


@dataclass
class RunResult:
    """How it ended: ``outcome`` exit, timeout, signal or cost; ``exit_code`` ours."""

    run_id: str
    run_dir: Path
    exit_code: int
    outcome: str
    cost_usd: float | None
    turns: int | None
    changed: list[str]


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def runs_dir(data_dir: Path, root: Path) -> Path:
    """Where a workspace's runs are saved (host side, outside the workspace)."""
    return workspace_dir(data_dir, root) / "agent-runs"


# -- provisioning: the secret, the allowlist, the install ----------------------------------


@dataclass
class _Restore:
    """What the run changed in the workspace's configuration, to put back after it (also
    on disk, :mod:`.pending`, before it is changed: a run whose worker dies is put back by
    the next one)."""

    secret_name: str | None = None
    old_secret: Any = None  # the workspace's own Secret it replaced, or None: delete it
    egress: list[str] | None = None
    egress_changed: bool = False
    agents: list[str] | None = None
    agents_changed: bool = False
    ws_dir: Path | None = None  # where its record is (None: none was written)
    process_id: str | None = None
    run_id: str | None = None

    def record(self) -> dict[str, Any]:
        old = self.old_secret
        return {
            "run_id": self.run_id,
            "process_id": self.process_id,
            "secret_name": self.secret_name,
            "old_secret": None if old is None else {
                "name": old.name, "hosts": list(old.hosts), "header": old.header.text if old.header else None,
                "query": old.query, "value": old.value, "value_file": old.value_file,
            },
            "egress": self.egress, "egress_changed": self.egress_changed,
            "agents": self.agents, "agents_changed": self.agents_changed,
        }  # fmt: skip

    @staticmethod
    def from_record(data: dict[str, Any], ws_dir: Path) -> _Restore:
        return _Restore(
            secret_name=data.get("secret_name"), old_secret=data.get("old_secret"),
            egress=data.get("egress"), egress_changed=bool(data.get("egress_changed")),
            agents=data.get("agents"), agents_changed=bool(data.get("agents_changed")),
            ws_dir=ws_dir, process_id=data.get("process_id"), run_id=data.get("run_id"),
        )  # fmt: skip


async def recover(registry: Any, root: Path, data_dir: Path, progress: Callable[[str], None] = lambda _m: None) -> None:
    """Put back what a run whose worker died left in the workspace's configuration (its
    key as a secret, a wider allowlist) and stop its agent in the sandbox. Raises RunError
    when the run that wrote the record is still going (another run on this workspace)."""
    ws_dir = workspace_dir(data_dir, root)
    found = await asyncio.to_thread(pending.load, ws_dir)
    if found is None:
        return
    if pending.owner_alive(found):
        owner = found.get("owner") or {}
        raise RunError(
            "workspace",
            f"another agent run ({found.get('run_id')}, host pid {owner.get('pid')}) is using this workspace: "
            "wait for it to end, or stop it",
        )
    restore = _Restore.from_record(found, ws_dir)
    progress(f"putting back what the interrupted run {restore.run_id or '(unknown)'} left (its key, its allowlist)")
    if restore.process_id:
        with contextlib.suppress(Exception):  # long ended, or the sandbox was removed
            await background((await registry.workspace(root)).sandbox).process_kill(restore.process_id)
    await unprovision(registry, root, restore)


async def provision(
    registry: Any,
    root: Path,
    req: RunRequest,
    *,
    data_dir: Path | None = None,
    process_id: str | None = None,
    run_id: str | None = None,
) -> _Restore:
    """Store the key as a secret for the provider's hosts, open them in the allowlist,
    ask for the agent's install. With ``data_dir``, what it changes is first written to
    the workspace's record (:mod:`.pending`), after a run that died before putting its
    own back is put back (:func:`recover`). Returns what to put back. Raises RunError (no
    key anywhere; a refused name or host; another run on the workspace), SettingsError,
    SecretError, OSError."""
    from ..workspace_settings import WorkspaceSettings

    restore = _Restore(process_id=process_id, run_id=run_id)
    if data_dir is not None:
        await recover(registry, root, data_dir)
    own, effective = await registry.workspace_settings(root)
    changes: dict[str, Any] = {}
    p = req.provider
    set_secret = False
    if p is not None:
        store = registry.configs.secrets.store
        old = store.load(root).get(p.key_env)
        if req.key_value is None and req.key_file is None:
            if old is None or not set(p.hosts) <= set(old.hosts):
                raise RunError(
                    "--key-env" if p.name == "custom" else "key",
                    f"{p.key_env} is not set in this environment: export it, or give --key-file FILE",
                )
        else:
            set_secret = True
            # A default (operator-wide) secret of that name is not the workspace's own:
            # putting back means removing the run's, so the default shows through again.
            own_old = old if old is not None and getattr(old, "scope", "workspace") == "workspace" else None
            restore.secret_name, restore.old_secret = p.key_env, own_old
        allowed = list(effective.get("egress") or [])
        missing = [h for h in p.egress if h not in allowed]
        if missing:
            restore.egress, restore.egress_changed = own.egress, True
            changes["egress"] = allowed + missing
    # The agents store's mount (part ag-store's setting), when this worker has it.
    if req.agent in launching.KINDS and "agents" in WorkspaceSettings.model_fields:
        current = list(getattr(own, "agents", None) or [])
        if req.agent not in current:
            restore.agents, restore.agents_changed = getattr(own, "agents", None), True
            changes["agents"] = [*current, req.agent]
    if data_dir is not None and (set_secret or changes):
        ws_dir = workspace_dir(data_dir, root)
        if await asyncio.to_thread(pending.claim, ws_dir, restore.record()) is not None:
            raise RunError("workspace", "another agent run started on this workspace at the same time: try again")
        restore.ws_dir = ws_dir
    try:
        if set_secret and p is not None:
            registry.configs.secrets.store.set(
                root, p.key_env, hosts=list(p.hosts), header=p.header,
                value=req.key_value, value_file=None if req.key_file is None else str(req.key_file.resolve()),
            )  # fmt: skip
        if changes:
            await registry.configure_workspace(root, changes)
    except BaseException:
        await unprovision(registry, root, restore)
        raise
    return restore


async def unprovision(registry: Any, root: Path, restore: _Restore) -> None:
    """Put back what :func:`provision` changed, then drop the run's record. Raises
    OSError, SettingsError."""
    changes: dict[str, Any] = {}
    if restore.egress_changed:
        changes["egress"] = restore.egress
    if restore.agents_changed:
        changes["agents"] = restore.agents
    if changes:
        await registry.configure_workspace(root, changes)
    if restore.secret_name is not None:
        store = registry.configs.secrets.store
        old = restore.old_secret
        if isinstance(old, dict):  # (from a record on disk)
            store.set(
                root, old["name"], hosts=list(old["hosts"]), header=old.get("header"),
                query=old.get("query"), value=old.get("value"), value_file=old.get("value_file"),
            )  # fmt: skip
        elif old is None:
            store.delete(root, restore.secret_name)
        else:
            store.set(
                root, old.name, hosts=list(old.hosts), header=old.header.text if old.header else None,
                query=old.query, value=old.value, value_file=old.value_file,
            )  # fmt: skip
    if restore.ws_dir is not None:
        await asyncio.to_thread(pending.release, restore.ws_dir)


# -- the run ------------------------------------------------------------------------------


async def _home(registry: Any, root: Path) -> str:
    out = await registry.sandbox(root).exec(["sh", "-c", 'printf %s "$HOME"'], timeout=30)
    return str(out.stdout.decode().strip() or "/tmp")


async def run_agent(
    registry: Any,
    data_dir: Path,
    workspace: Path,
    req: RunRequest,
    *,
    out: Callable[[bytes], None],
    err: Callable[[bytes], None],
    progress: Callable[[str], None] = lambda _m: None,
    run_id: str | None = None,
) -> RunResult:
    """Run ``req`` in ``workspace``'s sandbox (see the module docstring). Returns how it
    ended. Raises RunError, SettingsError, SecretError, ToolError (no such directory),
    AgentError (too many background processes), SandboxError, OSError."""
    root = workspace.resolve()
    run_id = run_id or new_run_id()
    run_dir = runs_dir(data_dir, root) / run_id
    meter = CostMeter(model=launching.model_in(req.extra))
    process_id = "agent-" + secrets.token_hex(6)
    started = time.time()
    restore = await provision(registry, root, req, data_dir=data_dir, process_id=process_id, run_id=run_id)
    outcome, code, info = "exit", 1, None
    try:
        ws = await registry.workspace(root)
        home = await _home(registry, root)  # (the sandbox is up after this: its gateway too)
        # Turn by turn: on the egress gateway's directory (None: no egress, one group).
        host_dir = registry.pool.turn_dir(ws.root) if req.turns else None
        files = turns.hook_files(req.agent, process_id=process_id) if host_dir is not None else {}
        if files:  # into $HOME: outside the workspace, so not recorded
            handle = registry.sandbox(root)
            for rel, text in files.items():
                await handle.write_file(f"{home}/{rel}", text)
        launch = launching.build(
            req.agent, req.prompt, req.extra, provider=req.provider,
            turn_args=turns.agent_args(req.agent, home) if host_dir is not None else [],
        )  # fmt: skip
        await asyncio.to_thread(run_dir.mkdir, 0o700, True, True)
        progress(f"{req.agent}: running in the sandbox (run {run_id}, process {process_id})")
        async with turns.TurnChannel.open(ws, process_id, host_dir) as channel:
            env = {**launch.env, **channel.env()}
            box = background(ws.sandbox)
            # Headless: no input, ever (Codex otherwise waits for more of the prompt on stdin).
            command = f"exec </dev/null; {launch.command}"
            await ws.start_background(command, timeout=req.timeout, process_id=process_id, env=env)
            outcome, info = await _pump(box, process_id, req, meter, run_dir, out, err, started)
        await ws.settle_background(prefer=process_id)
        changed = await _changed_by(ws, process_id)
    finally:
        if info is None or info.running:  # cancelled (Ctrl-C) or failed: nothing outlives the run
            with contextlib.suppress(Exception):
                await background((await registry.workspace(root)).sandbox).process_kill(process_id)
        await unprovision(registry, root, restore)
    if outcome == "cost":
        code = EXIT_COST
    elif info.outcome == "timeout" or outcome == "timeout":
        outcome, code = "timeout", EXIT_TIMEOUT
    elif info.outcome == "signal" and outcome != "cost":
        outcome, code = "signal", info.exit_code if info.exit_code is not None else 128 + (info.signal or 9)
    else:
        code = info.exit_code if info.exit_code is not None else 1
    result = RunResult(run_id, run_dir, code, outcome, meter.cost if meter.known else None, meter.turns, changed)
    await asyncio.to_thread(
        _write_json, run_dir / "run.json", _record(req, launch, result, started, info, process_id, data_dir)
    )
    return result


async def _pump(
    box: Any, process_id: str, req: RunRequest, meter: CostMeter, run_dir: Path,
    out: Callable[[bytes], None], err: Callable[[bytes], None], started: float,
) -> tuple[str, Any]:  # fmt: skip
    """Relay the process's output until it ends; kill it at --max-cost, or when the
    host's deadline (a little after the supervisor's own timeout) passes. Returns
    (outcome, its last ProcessInfo)."""
    outcome = "exit"
    deadline = started + req.timeout + 15.0
    transcript = await asyncio.to_thread(open, run_dir / "transcript.jsonl", "ab")
    errlog = await asyncio.to_thread(open, run_dir / "stderr.log", "ab")
    try:
        while True:
            o = await box.process_output(process_id, wait=1.0)
            if o.stdout:
                await asyncio.to_thread(_append, transcript, o.stdout)
                out(o.stdout)
                meter.feed(o.stdout)
            if o.stderr:
                await asyncio.to_thread(_append, errlog, o.stderr)
                err(o.stderr)
            if o.done:
                return outcome, o.info
            if outcome == "exit" and req.max_cost is not None and meter.cost > req.max_cost:
                outcome = "cost"
                await box.process_kill(process_id)
            elif outcome == "exit" and time.time() > deadline:
                outcome = "timeout"
                await box.process_kill(process_id, signal=9)
    finally:
        transcript.close()
        errlog.close()


def _append(f: Any, data: bytes) -> None:
    f.write(data)
    f.flush()


async def _changed_by(ws: Any, process_id: str) -> list[str]:
    """Every path the run's turns and its closing group changed (applied entries; both
    names of a move), sorted ([] without a changelog). Raises ChangelogStorageError."""
    from ..changelog import Changelog

    if not isinstance(ws.recorder, Changelog):
        return []
    paths: set[str] = set()
    for e in await ws.recorder.log(call_group=process_id):
        if e.state == "applied":
            paths.add(e.path)
            if e.new_path:
                paths.add(e.new_path)
    return sorted(paths)


def _record(
    req: RunRequest, launch: Any, result: RunResult, started: float, info: Any, pid: str, data_dir: Path
) -> dict[str, Any]:
    """run.json: never the key (only the variable's name and the hosts)."""
    p = req.provider
    return {
        "run_id": result.run_id,
        "agent": req.agent,
        "version": _version(req.agent, data_dir),
        "argv": launch.argv,
        "process_id": pid,
        "provider": None if p is None else {"name": p.name, "key_env": p.key_env, "hosts": list(p.hosts)},
        "started": started,
        "ended": info.ended if info is not None and info.ended else time.time(),
        "exit_code": result.exit_code,
        "agent_exit_code": None if info is None else info.exit_code,
        "outcome": result.outcome,
        "turns": result.turns,
        "cost_usd": result.cost_usd,
        "max_cost_usd": req.max_cost,
        "timeout": req.timeout,
        "changed": result.changed,
    }


def _version(agent: str, data_dir: Path) -> str | None:
    """The pinned version in the agents store (part ag-store), when there is one."""
    if agent not in launching.KINDS:
        return None
    try:
        store = importlib.import_module(f"{__package__}.store")
    except ModuleNotFoundError:
        return None
    try:
        got = store.AgentStore(data_dir / "agents").get(agent)
    except Exception:  # a store it cannot read says nothing about this run
        return None
    return None if got is None else str(got.version)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def as_dict(result: RunResult) -> dict[str, Any]:
    """``--json``'s form of a result."""
    d = asdict(result)
    d["run_dir"] = str(result.run_dir)
    return d
