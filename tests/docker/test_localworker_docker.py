"""The CLI's local worker on the real engine: the same bytes and exit codes through the
worker as in-process for every tool, the same changelog; 10 MB arguments through it; a
worker killed mid-command; a custom tool edited under a running worker; a sandbox
removed under it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.workers import LOOM, cli, cli_env, run_dir, statuses, wait_for

pytestmark = pytest.mark.docker

#: (tool, arguments or raw --args text, expected exit code): every tool, successes,
#: failures of each kind, an unknown tool, a usage error.
CALLS: list[tuple[str, object, int]] = [
    ("write_file", {"path": "src/app.py", "content": "print('hi')\n"}, 0),
    ("read_file", {"path": "src/app.py"}, 0),
    ("edit_file", {"path": "src/app.py", "old_str": "hi", "new_str": "yo"}, 0),
    ("shell_execute", {"command": "python3 src/app.py; echo made > made.txt; mkdir -p d && touch d/x"}, 0),
    ("shell_execute", {"command": "echo out; echo err >&2; exit 3"}, 1),
    ("search_files", {"pattern": "print"}, 0),
    ("list_directory", {"depth": 2}, 0),
    ("read_file", {"path": "missing.txt"}, 1),
    ("read_file", {"nope": 1}, 2),  # --args the schema refuses: a usage error
    ("shell_execute", {"command": "rm -rf /"}, 1),
    ("read_file", {"path": "../../etc/passwd"}, 1),
    ("write_file", {"path": "bad\udcffname.txt", "content": "odd name"}, 0),
    ("list_directory", {}, 0),
    ("tool_search", {"query": "run a shell command"}, 0),
    ("format_disk", {}, 2),
    ("read_file", "{not json", 2),
]


def normalize(out: bytes) -> bytes:
    """A result with its timings blanked (also inside ``output``, where tool_search puts
    its JSON): the one thing two runs may not share."""
    return re.sub(rb'(\\?"(?:duration_ms|search_time_ms)\\?": ?)[0-9.e+-]+', rb"\g<1>0", out)


@pytest.fixture
def run() -> Iterator[str]:
    with run_dir() as d:
        yield d


def base_env(run: str, data: Path, daemon: str) -> dict[str, str]:
    return cli_env(run, data, LOOM_IMAGE=SANDBOX_IMAGE, LOOM_CLI_DAEMON=daemon)


def stop_sandbox(env: dict[str, str], ws: Path) -> None:
    cli({**env, "LOOM_CLI_DAEMON": "0"}, "stop", "-w", str(ws))


def run_calls(env: dict[str, str], ws: Path) -> list[tuple[int, bytes]]:
    out = []
    for tool, args, _expected in CALLS:
        text = args if isinstance(args, str) else json.dumps(args)
        p = cli(env, "call", tool, "-w", str(ws), "--args", text, "--call-id", f"c-{tool}")
        out.append((p.returncode, normalize(p.stdout)))
    return out


def changelog(env: dict[str, str], ws: Path) -> list[dict[str, object]]:
    p = cli({**env, "LOOM_CLI_DAEMON": "0"}, "log", "-w", str(ws), "--json")
    assert p.returncode == 0, p.stderr
    return [{k: v for k, v in json.loads(line).items() if k != "ts"} for line in p.stdout.decode().splitlines()]


def test_call_through_the_worker_is_byte_for_byte_the_in_process_call(
    docker_ready: None, run: str, tmp_path: Path
) -> None:
    results: dict[str, list[tuple[int, bytes]]] = {}
    logs: dict[str, list[dict[str, object]]] = {}
    for daemon in ("1", "0"):
        ws = tmp_path / f"ws{daemon}"
        ws.mkdir()
        (ws / "README.md").write_text("# a project\n")
        env = base_env(run, tmp_path / f"data{daemon}", daemon)
        try:
            results[daemon] = run_calls(env, ws)
            logs[daemon] = changelog(env, ws)
        finally:
            stop_sandbox(env, ws)
    assert [code for code, _ in results["1"]] == [expected for _t, _a, expected in CALLS]
    for (tool, _args, _e), through_worker, in_process in zip(CALLS, results["1"], results["0"], strict=True):
        assert through_worker == in_process, tool
    assert len(statuses(run)) == 1  # the worker path did use a worker (the other never starts one)
    assert logs["1"] == logs["0"] and len(logs["1"]) >= 5
    assert {e["call_id"] for e in logs["1"]} >= {"c-write_file", "c-edit_file", "c-shell_execute"}


def test_batch_through_the_worker_is_the_in_process_batch(docker_ready: None, run: str, tmp_path: Path) -> None:
    lines = [
        {"tool": "write_file", "arguments": {"path": "a.txt", "content": "1\n"}, "id": "w"},
        {"tool": "read_file", "arguments": {"path": "a.txt"}, "id": 2},
        "not json",
        {"tool": "shell_execute", "arguments": {"command": "cat a.txt; exit 1"}},
        {"tool": "nope"},
        {"tool": "list_directory", "args": {}},
    ]
    stdin = ("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n").encode()
    out = {}
    for daemon in ("1", "0"):
        ws = tmp_path / f"ws{daemon}"
        ws.mkdir()
        env = base_env(run, tmp_path / f"data{daemon}", daemon)
        try:
            p = cli(env, "batch", "-w", str(ws), stdin=stdin)
            out[daemon] = (p.returncode, normalize(p.stdout))
        finally:
            stop_sandbox(env, ws)
    assert out["1"] == out["0"]
    assert out["1"][0] == 1 and len(out["1"][1].splitlines()) == 6


@pytest.mark.parametrize("form", ["@FILE", "-"])
def test_ten_megabytes_through_the_worker(docker_ready: None, run: str, tmp_path: Path, form: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = base_env(run, tmp_path / "data", "1")
    content = "x" * 99 + "\n"
    content *= 100_000  # 10 MB
    payload = json.dumps({"path": "big.txt", "content": content}).encode()
    stdin = None
    if form == "@FILE":
        (tmp_path / "a.json").write_bytes(payload)
        arg = f"@{tmp_path / 'a.json'}"
    else:
        arg, stdin = "-", payload
    try:
        p = cli(env, "call", "write_file", "-w", str(ws), "--args", arg, stdin=stdin)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["data"]["bytes_written"] == 10_000_000
        assert (ws / "big.txt").read_text() == content
        assert len(statuses(run)) == 1
    finally:
        stop_sandbox(env, ws)


def test_a_worker_killed_mid_command(docker_ready: None, run: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = base_env(run, tmp_path / "data", "1")
    try:
        assert cli(env, "call", "list_directory", "-w", str(ws)).returncode == 0
        [status] = statuses(run).values()
        args = json.dumps({"command": "touch started; sleep 30", "timeout": 60})
        client = subprocess.Popen(
            [LOOM, "call", "shell_execute", "-w", str(ws), "--args", args], env=env, stdout=subprocess.PIPE
        )
        assert wait_for(lambda: (ws / "started").exists())
        os.kill(int(status["pid"]), signal.SIGKILL)
        out, _ = client.communicate(timeout=120)
        result = json.loads(out)
        assert client.returncode == 1 and result["data"]["error_kind"] == "infrastructure"
        p = cli(env, "call", "shell_execute", "-w", str(ws), "--args", '{"command": "echo alive"}')
        assert p.returncode == 0 and json.loads(p.stdout)["output"] == "alive\n"
    finally:
        stop_sandbox(env, ws)


def test_a_custom_tool_edited_under_a_running_worker(docker_ready: None, run: str, tmp_path: Path) -> None:
    """The next call sees the new definition: the worker answers "retry" before running
    anything, and a fresh one (built from the new file) takes the call."""
    ws = tmp_path / "ws"
    ws.mkdir()
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = "name: greet\ndescription: Say something.\ncommand: [echo, {word}]\n"
    (tools / "greet.yaml").write_text(tool.format(word="hello"))
    env = base_env(run, tmp_path / "data", "1")
    env["LOOM_TOOLS_DIR"] = str(tools)
    try:
        p = cli(env, "call", "greet", "-w", str(ws))
        assert p.returncode == 0 and json.loads(p.stdout)["output"] == "hello\n"
        [old] = statuses(run).values()
        (tools / "greet.yaml").write_text(tool.format(word="goodbye"))
        p = cli(env, "call", "greet", "-w", str(ws))
        assert p.returncode == 0 and json.loads(p.stdout)["output"] == "goodbye\n"
        [new] = statuses(run).values()
        assert new["pid"] != old["pid"]
    finally:
        stop_sandbox(env, ws)


def test_a_sandbox_removed_under_the_worker(docker_ready: None, run: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = base_env(run, tmp_path / "data", "1")
    try:
        assert cli(env, "call", "write_file", "-w", str(ws), "--args", '{"path": "f", "content": "1"}').returncode == 0
        stop_sandbox(env, ws)  # `loom-worker stop` from another process removes the container
        p = cli(env, "call", "read_file", "-w", str(ws), "--args", '{"path": "f"}')
        assert p.returncode == 0 and json.loads(p.stdout)["output"] == "1"
    finally:
        stop_sandbox(env, ws)


def test_doctor_says_whether_the_local_worker_runs(docker_ready: None, run: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = base_env(run, tmp_path / "data", "1")
    try:
        p = cli(env, "doctor")
        assert p.returncode == 0, p.stdout
        assert b"[ok] local worker (CLI): not running: the next `loom-worker call` starts it" in p.stdout
        assert cli(env, "call", "list_directory", "-w", str(ws)).returncode == 0
        [status] = statuses(run).values()
        p = cli(env, "doctor")
        assert f"[ok] local worker (CLI): running: pid {status['pid']}".encode() in p.stdout
        p = cli({**env, "LOOM_CLI_DAEMON": "0"}, "doctor")
        assert b"[ok] local worker (CLI): off (LOOM_CLI_DAEMON=0)" in p.stdout
    finally:
        stop_sandbox(env, ws)
