"""``agent run`` on the real engine (runc and gVisor), with a custom-command agent: a shell
script that prints JSON lines, calls the provider's host through the gateway (an HTTPS
origin of ``tests/origins.py`` that records what it receives), writes files and exits 7.

The key reaches the origin and is found nowhere else: not in the sandbox (its variables,
every process's ``/proc/*/environ``, the workspace), not in the transcript, run.json or
anything under the data directory after the run, not in loom's log lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from sandbox.capabilities import background
from sandbox.errors import PathNotFoundError
from tests.docker.conftest import own_registry
from tests.origins import Net
from tests.workers import remove_sandboxes_under
from worker.agents.providers import custom
from worker.agents.run import EXIT_COST, EXIT_TIMEOUT, RunError, RunRequest, provision, run_agent
from worker.changelog.recorder import workspace_dir

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

AGENT = r"""
echo '{"type":"system","subtype":"init"}'
curl -s https://api.test/v1/messages -d '{"model":"m"}' -o /dev/null -w '{"type":"http","status":%{http_code}}\n'
usage='"usage":{"input_tokens":1000,"output_tokens":100}'
echo '{"type":"assistant","message":{"id":"m1","model":"claude-sonnet-4-5",'"$usage"'}}'
mkdir -p out
printf '%s\n' "$TEST_KEY" > out/key-var.txt
cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' > out/environ.txt
echo made > out/made.txt
echo 'to stderr' >&2
exit 7
"""


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    n = Net.start(tmp_path)
    try:
        yield n
    finally:
        n.stop()


async def _registry(tmp_path: Path, runtime: str, net: Net) -> AsyncIterator[Any]:
    async with own_registry(tmp_path, runtime, **net.settings(tmp_path)) as reg:
        net.resolve_for(reg)
        yield reg


@pytest.fixture(params=["runc", "runsc"])
async def registry(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path, net: Net) -> AsyncIterator[Any]:
    async for reg in _registry(tmp_path, request.param, net):
        yield reg


@pytest.fixture
async def runc_registry(docker_ready: None, tmp_path: Path, net: Net) -> AsyncIterator[Any]:
    async for reg in _registry(tmp_path, "runc", net):
        yield reg


def workspace(tmp_path: Path, script: str) -> Path:
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "agent.sh").write_text(script)
    for p in (ws, ws / "agent.sh"):
        os.chown(p, 1000, 1000)
    return ws


class Sink:
    def __init__(self) -> None:
        self.out = bytearray()
        self.err = bytearray()


async def test_key_reaches_the_host_only_and_the_exit_status_is_the_agents(
    registry: Any, tmp_path: Path, net: Net
) -> None:
    key = "sk-test-" + uuid.uuid4().hex
    ws = workspace(tmp_path, AGENT)
    data = tmp_path / "data"
    sink = Sink()
    req = RunRequest(
        "sh agent.sh", prompt=None, provider=custom("TEST_KEY", "api.test", "x-api-key: {value}"),
        key_value=key, timeout=120,
    )  # fmt: skip
    with capture_logs() as logs:
        result = await run_agent(registry, data, ws, req, out=sink.out.extend, err=sink.err.extend)

    assert result.exit_code == 7 and result.outcome == "exit"
    # The gateway put the key into the request to the provider's host.
    seen = net.seen("api.test")
    assert [s.header("x-api-key") for s in seen] == [[key]]
    assert b'{"type":"http","status":200}' in sink.out
    assert b"to stderr" in sink.err
    # The sandbox saw a placeholder, in its variable and every process's environment.
    var = (ws / "out/key-var.txt").read_text().strip()
    assert var.startswith("loom-secret:TEST_KEY:")
    assert f"TEST_KEY={var}" in (ws / "out/environ.txt").read_text()
    # The transcript is the agent's stdout as it came; run.json says how it went.
    transcript = (result.run_dir / "transcript.jsonl").read_bytes()
    assert transcript == bytes(sink.out)
    assert json.loads(transcript.splitlines()[0]) == {"type": "system", "subtype": "init"}
    record = json.loads((result.run_dir / "run.json").read_text())
    assert record["exit_code"] == 7 and record["agent_exit_code"] == 7
    assert record["provider"] == {"name": "custom", "key_env": "TEST_KEY", "hosts": ["api.test"]}
    assert record["cost_usd"] == pytest.approx(1000 * 3e-6 + 100 * 15e-6)
    assert "out/made.txt" in record["changed"]
    # The key is nowhere: the workspace, the data directory (run files, settings, logs,
    # changelog: the secret was removed after the run), loom's log lines.
    needle = key.encode()
    for root in (ws, data):
        for p in root.rglob("*"):
            if p.is_file() and not p.is_symlink():
                assert needle not in p.read_bytes(), p
    assert key not in repr(logs)
    # The configuration is as it was: no secret left, no host left open.
    assert registry.configs.secrets.store.load(ws.resolve()) == {}
    own, _ = await registry.workspace_settings(ws)
    assert own.egress is None


async def test_a_run_whose_worker_died_is_put_back_by_the_next(runc_registry: Any, tmp_path: Path) -> None:
    """A worker SIGKILLed mid-run never reaches its ``finally``: its key stays a secret of
    the workspace and its host stays open, and its agent runs on. The next run on the
    workspace puts all of that back first; while the first run's worker lives, a second
    run on the workspace is refused."""
    reg = runc_registry
    ws = workspace(tmp_path, "sleep 600\n")
    root = ws.resolve()
    data = tmp_path / "data"
    store = reg.configs.secrets.store

    def req(key: str, command: str) -> RunRequest:
        provider = custom("TEST_KEY", "api.test", "x-api-key: {value}")
        return RunRequest(command, provider=provider, key_value=key, timeout=600)

    # The first run: provisioned, its agent started, and then its worker is killed.
    await provision(reg, root, req("sk-dead", "sh agent.sh"), data_dir=data, process_id="agent-dead", run_id="run-dead")
    w = await reg.workspace(root)
    await w.start_background("sh agent.sh", timeout=600, process_id="agent-dead")
    assert "TEST_KEY" in store.load(root)
    with pytest.raises(RunError) as busy:  # its worker (this process) still lives
        await provision(reg, root, req("sk-2", "true"), data_dir=data)
    assert busy.value.field == "workspace" and "run-dead" in str(busy.value)
    record = workspace_dir(data, root) / "agent-run.json"
    found = json.loads(record.read_text())
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    found["owner"]["pid"] = gone.pid  # the worker is gone
    record.write_text(json.dumps(found))
    assert "TEST_KEY" in store.load(root)  # what it left: the key, usable by any command
    own, _ = await reg.workspace_settings(ws)
    assert own.egress is not None and "api.test" in own.egress

    sink = Sink()
    result = await run_agent(reg, data, ws, req("sk-new", "echo ran"), out=sink.out.extend, err=sink.err.extend)
    assert result.exit_code == 0 and b"ran" in sink.out
    assert store.load(root) == {} and not record.exists()
    own, _ = await reg.workspace_settings(ws)
    assert own.egress is None
    # The dead run's agent was stopped (and released): no process of its is left.
    with pytest.raises(PathNotFoundError):
        await background(w.sandbox).process_output("agent-dead")
    ps = await reg.sandbox(root).exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], timeout=30)
    assert b"sleep 600" not in ps.stdout, ps.stdout


async def test_timeout_kills_the_agent_and_everything_it_started(runc_registry: Any, tmp_path: Path) -> None:
    ws = workspace(tmp_path, 'echo \'{"type":"start"}\'\n(sleep 600; echo late > late.txt) &\nsleep 600\n')
    sink = Sink()
    result = await run_agent(
        runc_registry, tmp_path / "data", ws, RunRequest("sh agent.sh", timeout=3),
        out=sink.out.extend, err=sink.err.extend,
    )  # fmt: skip
    assert (result.exit_code, result.outcome) == (EXIT_TIMEOUT, "timeout")
    assert sink.out == b'{"type":"start"}\n'
    processes = await runc_registry.sandbox(ws).exec(["sh", "-c", "ps -eo args | grep -c '[s]leep 600' || true"])
    assert processes.stdout.strip() == b"0"
    assert json.loads((result.run_dir / "run.json").read_text())["outcome"] == "timeout"


async def test_max_cost_stops_the_agent_with_status_3(runc_registry: Any, tmp_path: Path) -> None:
    line = '{"type":"turn.completed","usage":{"input_tokens":2000000,"output_tokens":10}}'
    ws = workspace(tmp_path, f"echo '{line}'\nsleep 600\n")
    result = await run_agent(
        runc_registry, tmp_path / "data", ws, RunRequest("sh agent.sh", timeout=300, max_cost=1.0),
        out=lambda _b: None, err=lambda _b: None,
    )  # fmt: skip
    assert (result.exit_code, result.outcome) == (EXIT_COST, "cost")
    assert result.cost_usd is not None and result.cost_usd > 1.0


def test_tty_runs_the_agent_on_a_terminal_with_the_placeholder_and_its_exit_status(
    docker_ready: None, tmp_path: Path
) -> None:
    """``agent run --tty`` through the CLI on a pseudo-terminal of ours, as a user's: the
    agent's stdin is a terminal, it sees the placeholder (never the key), and its exit
    status is ours."""
    import pty
    import select
    import subprocess
    import sys
    import time

    from tests.conftest import SANDBOX_IMAGE

    ws = workspace(tmp_path, "")
    key = "sk-tty-" + uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_") or k == "LOOM_TEST_OWNER"}
    env |= {
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "TTY_KEY": key,
    }
    (tmp_path / "run").mkdir()
    agent = "sh -c 'test -t 0 && echo \"is a tty: $TTY_KEY\"; exit 5'"
    argv = [sys.executable, "-m", "worker.cli", "agent", "run", "-w", str(ws), "--tty"]
    argv += ["--key-env", "TTY_KEY", "--key-host", "api.test", agent]
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closed: the CLI ended
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
        remove_sandboxes_under(tmp_path)  # (the CLI's, left to their idle TTL: not the suite's gc's)
    text = out.decode(errors="replace")
    assert code == 5, text
    assert "is a tty: loom-secret:TTY_KEY:" in text
    assert key not in text
