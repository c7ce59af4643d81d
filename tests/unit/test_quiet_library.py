"""A program that imports ``worker`` prints nothing of ours on stdout or stderr unless it
configures logging; our entry points (the CLI, the MCP stdio server) still log, to stderr.

Each case is a real subprocess: what reaches its file descriptors 1 and 2 is the point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOOM = str(Path(sys.executable).with_name("loom-worker"))

#: Tool calls through the library on the local backend: successes, a model error, an
#: unknown tool, a refused command, and default_registry() built with a custom tool file
#: that does not load (a warning the catalog logs).
PROGRAM = textwrap.dedent(
    """
    import asyncio, logging, sys
    from pathlib import Path

    from sandbox.local import LocalProcessBackend
    from worker import ToolRegistry, default_registry

    if sys.argv[2] == "basicConfig":
        logging.basicConfig(level=logging.INFO)

    async def main() -> None:
        ws = Path(sys.argv[1])
        async with default_registry() as reg:
            assert "tool_search" in reg.names()
        async with ToolRegistry(backend=LocalProcessBackend()) as reg:
            results = [
                await reg.execute("write_file", {"path": "a.txt", "content": "x"}, ws),
                await reg.execute("read_file", {"path": "a.txt"}, ws),
                await reg.execute("shell_execute", {"command": "echo out; echo err >&2"}, ws),
                await reg.execute("read_file", {"path": "missing"}, ws),
                await reg.execute("nope", {}, ws),
                await reg.execute("shell_execute", {"command": "rm -rf /"}, ws),
            ]
        Path(sys.argv[3]).write_text(" ".join(str(r.success) for r in results))

    asyncio.run(main())
    """
)


def run_program(workspace: Path, tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "broken.yaml").write_text("name: [unclosed\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LOOM_")},
        "PYTHONPATH": str(ROOT),
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_TOOLS_DIR": str(tools),
    }
    done = tmp_path / "done"
    p = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(workspace), mode, str(done)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert done.read_text() == "True True True False False False"  # the calls really ran
    return p


def test_the_library_prints_nothing(workspace: Path, tmp_path: Path) -> None:
    p = run_program(workspace, tmp_path, "quiet")
    assert p.stdout == ""
    assert p.stderr == ""


def test_a_program_that_configures_logging_gets_our_events(workspace: Path, tmp_path: Path) -> None:
    p = run_program(workspace, tmp_path, "basicConfig")
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    calls = [line for line in lines if line.startswith("INFO:worker.registry:tool.call ")]
    assert len(calls) == 6, p.stderr
    assert "tool='write_file'" in calls[0] and "success=True" in calls[0] and "duration_ms=" in calls[0]
    assert any(line.startswith("WARNING:worker.catalog:catalog.load_error ") for line in lines), p.stderr
    assert "content" not in "".join(calls)  # arguments are never logged


def test_the_cli_logs_to_stderr_only(workspace: Path, tmp_path: Path) -> None:
    (workspace / "a.txt").write_text("hi\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LOOM_ALLOW_UNSAFE_LOCAL": "1",
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_LOG_FORMAT": "json",
        "LOOM_LOG_LEVEL": "info",
        "LOOM_CLI_DAEMON": "0",
    }
    argv = [LOOM, "call", "read_file", "-w", str(workspace), "--args", '{"path": "a.txt"}', "--backend", "local"]
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [json.loads(line)["output"] for line in p.stdout.splitlines()] == ["hi\n"]
    events = [json.loads(line) for line in p.stderr.splitlines()]
    [call] = [e for e in events if e["event"] == "tool.call"]
    assert call["tool"] == "read_file" and call["success"] is True and call["logger"] == "worker.registry"
    assert call["level"] == "info" and call["workspace"] == str(workspace)


def test_the_cli_log_level_is_honoured(workspace: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LOOM_ALLOW_UNSAFE_LOCAL": "1",
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_LOG_LEVEL": "warning",
        "LOOM_CLI_DAEMON": "0",
    }
    argv = [LOOM, "call", "list_directory", "-w", str(workspace), "--backend", "local"]
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stderr == "" and json.loads(p.stdout)["success"] is True


def test_the_mcp_stdio_server_writes_only_protocol_on_stdout(workspace: Path, tmp_path: Path) -> None:
    import mcp_types

    (workspace / "a.txt").write_text("hi\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LOOM_ALLOW_UNSAFE_LOCAL": "1",
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_LOG_FORMAT": "json",
        "LOOM_LOG_LEVEL": "info",
    }
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": mcp_types.LATEST_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        *(
            {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "read_file", "arguments": a}}
            for n, a in ((2, {"path": "a.txt"}), (3, {"path": "no"}))
        ),
    ]
    # stdin stays open until the answers are in (closing it ends the session at once).
    proc = subprocess.Popen(
        [LOOM, "mcp", "--workspace", str(workspace), "--backend", "local"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(3)]  # each line must be JSON
        proc.stdin.close()
        proc.wait(timeout=60)
        rest, err = proc.stdout.read(), proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rest == ""
    assert [a["id"] for a in answers] == [1, 2, 3] and all(a["jsonrpc"] == "2.0" for a in answers)
    assert answers[1]["result"]["isError"] is False and answers[2]["result"]["isError"] is True
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [e["success"] for e in events if e["event"] == "tool.call"] == [True, False]


def test_the_service_logs_json_lines_to_stderr(tmp_path: Path) -> None:
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path / "workspaces"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_WORKSPACE_ROOT": str(root),
        "LOOM_LOG_FORMAT": "json",
        "LOOM_LOG_LEVEL": "info",
        "LOOM_STOP_SANDBOXES_ON_EXIT": "false",
    }
    server = subprocess.Popen(
        [LOOM, "serve", "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "the service did not come up"
            time.sleep(0.1)
        assert httpx.post(f"{base}/v1/workspaces", json={"name": "w"}, timeout=10).status_code in (200, 201)
        r = httpx.post(f"{base}/v1/workspaces/w/execute", json={"tool": "no_such_tool", "arguments": {}}, timeout=30)
        assert r.status_code == 200 and r.json()["success"] is False
    finally:
        server.terminate()
        out, err = server.communicate(timeout=60)
    assert out == ""
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    [call] = [e for e in events if e["event"] == "tool.call"]
    assert call["logger"] == "worker.registry" and call["tool"] == "no_such_tool" and call["success"] is False
    assert all(line.startswith("{") for line in err.splitlines() if line.strip()), err  # JSON lines only


def test_enabled_for_says_whether_an_event_would_go_anywhere() -> None:
    """``LibraryLogger.enabled_for``: what the level filter of the configuration in force
    says (structlog's when it is configured, the standard logger's otherwise)."""
    import logging

    import structlog

    from sandbox.logs import get_logger

    log = get_logger("loom.test.enabled")
    try:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        assert not log.enabled_for(logging.INFO) and log.enabled_for(logging.WARNING)
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
        assert log.enabled_for(logging.INFO)
    finally:
        structlog.reset_defaults()
    std = logging.getLogger("loom.test.enabled")
    std.setLevel(logging.ERROR)
    try:
        assert not log.enabled_for(logging.WARNING) and log.enabled_for(logging.ERROR)
    finally:
        std.setLevel(logging.NOTSET)
