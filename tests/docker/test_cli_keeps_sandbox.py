"""Every CLI command that touches a workspace reaches its running sandbox, made with the
workspace's own settings: the container is the same one before and after each, a file in
its ``$HOME`` and a background process survive all of them.

The workspace's settings differ from the process's (its runtime, its memory, a variable):
a command that made its sandbox from the process-wide settings would replace the running
one (``diff`` and ``undo`` did). Each command runs in its own process (the local worker
off), as a user types it; ``call`` also through the local worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.docker.config import container_name
from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import require_runtime
from tests.workers import LOOM, cli, cli_env, run_dir

pytestmark = pytest.mark.docker

PATCH = b"""*** Begin Patch
*** Add File: patched.txt
+patched
*** End Patch
"""


def _state(name: str) -> tuple[str, str]:
    """The container's id and when it started (a restart would keep the id)."""
    out = subprocess.run(
        ["docker", "inspect", "-f", "{{.Id}} {{.State.StartedAt}}", name], capture_output=True, check=True
    )
    cid, started = out.stdout.decode().split()
    return cid, started


def _ok(p: subprocess.CompletedProcess[bytes], what: str) -> bytes:
    assert p.returncode == 0, f"{what}: {p.returncode}\n{p.stdout[-2000:]!r}\n{p.stderr[-2000:]!r}"
    return p.stdout


def _port_forward(env: dict[str, str], ws: Path) -> None:
    """``port-forward`` to a server in the sandbox: one request through it, then stop it."""
    proc = subprocess.Popen(
        [LOOM, "port-forward", "-w", str(ws), ":8765"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        port = int(line.rsplit(":", 1)[1].split()[0].strip().rstrip(")"))
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /a.txt HTTP/1.0\r\n\r\n")
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        assert b"200" in got.split(b"\r\n", 1)[0], got
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _mcp(env: dict[str, str], ws: Path) -> None:
    """``mcp`` over stdio: initialize, then one tool call."""
    msgs = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "shell_execute", "arguments": {"command": "cat $HOME/keep"}}},
    ]  # fmt: skip
    proc = subprocess.Popen(
        [LOOM, "mcp", "--workspace", str(ws)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    answers = {}
    try:
        for m in msgs:
            proc.stdin.write(json.dumps(m).encode() + b"\n")
            proc.stdin.flush()
            if "id" in m:
                while True:
                    line = json.loads(proc.stdout.readline())
                    if line.get("id") == m["id"]:
                        answers[m["id"]] = line
                        break
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert "kept" in json.dumps(answers[2]), answers


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_every_cli_command_keeps_the_workspace_sandbox(runtime: str, tmp_path: Path, docker_ready: None) -> None:
    require_runtime(runtime)
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    (tmp_path / "in.txt").write_bytes(b"from the host\n")
    (tmp_path / "forks").mkdir()
    with run_dir() as run:
        # The process's settings: runc, the default memory. The workspace's own: below.
        env = cli_env(run, tmp_path / "data", LOOM_IMAGE=SANDBOX_IMAGE, LOOM_CLI_DAEMON="0")
        env.pop("LOOM_RUNTIME", None)
        _ok(
            cli(env, "workspace", "set", "-w", str(ws), "--runtime", runtime, "--memory", "768m", "--env", "OWN=1"),
            "workspace set",
        )

        def call(tool: str, args: dict[str, object], daemon: str = "0") -> bytes:
            return _ok(
                cli({**env, "LOOM_CLI_DAEMON": daemon}, "call", tool, "-w", str(ws), "--args", json.dumps(args)),
                f"call {tool}",
            )

        call("shell_execute", {"command": 'echo kept > $HOME/keep && echo a > a.txt && test "$OWN" = 1'})
        call("shell_execute", {"command": "sleep 100000", "background": True})
        call("shell_execute", {"command": "cd /workspace && python3 -m http.server 8765", "background": True})
        name = container_name(ws)
        before = _state(name)
        snap: list[str] = []

        def do(*argv: str, stdin: bytes | None = None) -> bytes:
            return _ok(cli(env, *argv, stdin=stdin), " ".join(argv[:2]))

        w = ["-w", str(ws)]
        batch = b'{"tool": "list_directory", "arguments": {}, "id": 1}\n'
        commands: list[tuple[str, Callable[[], object]]] = [
            ("workspace show", lambda: do("workspace", "show", *w)),
            ("call", lambda: call("read_file", {"path": "a.txt"})),
            ("call through the local worker", lambda: call("read_file", {"path": "a.txt"}, daemon="1")),
            ("call shell", lambda: call("shell_execute", {"command": "echo b > b.txt"})),
            ("batch", lambda: do("batch", *w, stdin=batch)),
            ("exec", lambda: do("exec", *w, "--", "sh", "-c", "echo c > c.txt")),
            ("cp in", lambda: do("cp", *w, str(tmp_path / "in.txt"), ":in.txt")),
            ("cp out", lambda: do("cp", *w, ":in.txt", str(tmp_path / "out.txt"))),
            ("apply-patch", lambda: do("apply-patch", *w, stdin=PATCH)),
            ("log", lambda: do("log", *w)),
            ("diff", lambda: do("diff", *w)),
            ("diff --summary", lambda: do("diff", *w, "--summary")),
            ("undo --dry-run", lambda: do("undo", *w, "--all", "--dry-run")),
            ("undo", lambda: do("undo", *w, "--entry", _last_entry(env, ws))),
            ("egress-log", lambda: do("egress-log", *w)),
            ("snapshot create", lambda: snap.append(do("snapshot", "create", *w).decode().split()[0])),
            ("snapshot list", lambda: do("snapshot", "list", *w)),
            ("restore --dry-run", lambda: do("restore", *w, "--snapshot", snap[0], "--dry-run")),
            ("restore", lambda: do("restore", *w, "--snapshot", snap[0])),
            ("fork", lambda: do("fork", *w, "--snapshot", snap[0], "--into", str(tmp_path / "forks"))),
            ("port-forward", lambda: _port_forward(env, ws)),
            ("shell", lambda: do("shell", *w, "--", "sh", "-c", 'echo d > d.txt && test "$OWN" = 1', stdin=b"")),
            ("exec -t", lambda: do("exec", "-t", *w, "--", "true", stdin=b"")),
            ("shell --list", lambda: do("shell", *w, "--list")),
            ("mcp", lambda: _mcp(env, ws)),
            ("demo --workspace", lambda: do("demo", "--workspace", str(ws))),
        ]
        try:
            for what, how in commands:
                how()
                assert _state(name) == before, f"`{what}` replaced the workspace's sandbox"
            out = call("shell_execute", {"command": "cat $HOME/keep; ps -eo args | grep -c '^sleep 100000'"})
            result = json.loads(out)
            assert result["output"].split()[:2] == ["kept", "1"], result
        finally:
            subprocess.run([LOOM, "stop", "-w", str(ws)], env=env, capture_output=True, check=False)
            forks = tmp_path / "forks"
            for d in forks.iterdir() if forks.exists() else []:
                subprocess.run([LOOM, "stop", "-w", str(d)], env=env, capture_output=True, check=False)


def _last_entry(env: dict[str, str], ws: Path) -> str:
    out = _ok(cli(env, "log", "-w", str(ws), "--json"), "log")
    entries = [json.loads(line) for line in out.decode().splitlines()]
    return str([e for e in entries if e["path"] == "b.txt"][-1]["id"])
