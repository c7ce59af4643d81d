"""Turn by turn undo, the fast parts: the request's cleaning, the hook script (run with the
host's node against a socket of the test's), the channel's serving, the changelog's groups."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from worker.agents.hooks import CLAUDE_SETTINGS, HOOK_SCRIPT, SCRIPT
from worker.agents.turns import MAX_LINE, MAX_SUMMARY, MAX_TOOL, TurnChannel, agent_args, hook_files, parse_request
from worker.changelog.groups import group
from worker.changelog.model import Entry


def test_a_request_is_cleaned_and_cut() -> None:
    req = parse_request(json.dumps({"tool": "Ed\x1b[31mit\n", "summary": "a\u202eb.py\r\n" + "x" * 500}).encode())
    assert req.tool == "Ed [31mit"
    assert req.summary.startswith("a b.py") and len(req.summary) == MAX_SUMMARY
    assert parse_request(b'{"tool": "' + b"T" * 200 + b'"}').tool == "T" * MAX_TOOL
    assert parse_request(b'{"tool": 3, "summary": ["x"]}') == parse_request(b"{}")
    assert parse_request(b"{}").tool == "tool" and parse_request(b"{}").summary == ""
    for bad in (b"[1]", b"not json", b'"x"', b"{" + b" " * MAX_LINE + b"}"):
        with pytest.raises(ValueError):
            parse_request(bad)


def test_hook_files_and_args() -> None:
    files = hook_files("claude")
    settings = json.loads(files[CLAUDE_SETTINGS])
    (entry,) = settings["hooks"]["PostToolUse"]
    assert "Edit" in entry["matcher"].split("|") and "Bash" in entry["matcher"].split("|")
    assert HOOK_SCRIPT in entry["hooks"][0]["command"] and files[HOOK_SCRIPT] == SCRIPT
    assert agent_args("claude", "/home/sandbox") == ["--settings", f"/home/sandbox/{CLAUDE_SETTINGS}"]
    codex = agent_args("codex")
    assert "--dangerously-bypass-hook-trust" in codex and codex[codex.index("-c") + 1].startswith("hooks.PostToolUse=")
    assert hook_files("codex") == {HOOK_SCRIPT: SCRIPT}
    assert hook_files("opencode") == {} and agent_args("opencode") == []
    # with the agent's process id (a workspace with the egress proxy): Claude Code's HTTP hook
    (entry,) = json.loads(hook_files("claude", process_id="agent-0a1b")[CLAUDE_SETTINGS])["hooks"]["PostToolUse"]
    assert entry["hooks"][0]["type"] == "http"
    assert entry["hooks"][0]["url"] == "http://127.0.0.1:3128/.loom/turn/agent-0a1b"


class _Server:
    """A unix socket answering each line with ``{"ok": true}``; keeps what it got."""

    def __init__(self, path: Path) -> None:
        self.got: list[dict[str, Any]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                line = conn.makefile("rb").readline()
                self.got.append(json.loads(line))
                conn.sendall(b'{"ok": true, "group": 1}\n')

    def close(self) -> None:
        self.sock.close()


def _hook(tmp_path: Path, stdin: str, sock: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    """The hook script as the sandbox runs it (``python3 -I -S``: no site, no environment)."""
    script = tmp_path / "loom-turn.py"
    script.write_text(SCRIPT)
    env = {"PATH": "/usr/bin:/bin"} | ({"LOOM_TURN_SOCKET": str(sock)} if sock else {})
    argv = [sys.executable, "-I", "-S", str(script), *args]
    return subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True, timeout=60)


def test_the_hook_sends_the_tool_and_its_summary(tmp_path: Path) -> None:
    sock = tmp_path / "t.sock"
    server = _Server(sock)
    patch = "*** Begin Patch\n*** Update File: a.py\n@@\n-1\n+2\n*** Add File: b/c.py\n+x\n*** End Patch\n"
    calls = [("Edit", {"file_path": "src/a.py"}), ("Bash", {"command": "x" * 300}), ("apply_patch", {"command": patch})]
    try:
        for tool, tool_input in calls:
            r = _hook(tmp_path, json.dumps({"tool_name": tool, "tool_input": tool_input}), sock)
            assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
        r = _hook(tmp_path, json.dumps({"tool_name": "Bash", "tool_input": {"command": "ls"}}), sock, "before")
        assert r.returncode == 0
    finally:
        server.close()
    assert server.got == [
        {"tool": "Edit", "summary": "src/a.py"},
        {"tool": "Bash", "summary": "x" * 200},
        {"tool": "apply_patch", "summary": "a.py b/c.py"},
        {"tool": "apply_patch", "summary": "edits made before ls"},
    ]


def test_the_hook_never_fails_the_agent(tmp_path: Path) -> None:
    for stdin, sock in (("{}", tmp_path / "absent.sock"), ("not json", tmp_path / "absent.sock"), ("{}", None)):
        r = _hook(tmp_path, stdin, sock)
        assert (r.returncode, r.stdout) == (0, "")


class _Workspace:
    """Stands in for a Workspace: records each settle, one at a time (checked)."""

    def __init__(self) -> None:
        self.turns: list[dict[str, str]] = []
        self.busy = False

    async def settle_background(self, *, prefer: str, turn: dict[str, str]) -> list[str]:
        assert not self.busy, "turns are recorded one at a time"
        self.busy = True
        await asyncio.sleep(0.001)
        self.turns.append({"prefer": prefer, **turn})
        self.busy = False
        return ["a.py"]


async def _ask(path: Path, lines: list[bytes]) -> list[dict[str, Any]]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    out = []
    for line in lines:
        writer.write(line)
        await writer.drain()
        out.append(json.loads(await reader.readline()))
    writer.close()
    return out


async def test_the_channel_records_each_turn_in_order_and_survives_a_flood(tmp_path: Path) -> None:
    ws = _Workspace()
    async with TurnChannel.open(ws, "proc-abc", tmp_path) as ch:
        sock = tmp_path / "turn-proc-abc.sock"
        assert ch.sandbox_path == "/run/loom/egress/turn-proc-abc.sock" and sock.exists()
        assert ch.env() == {"LOOM_TURN_SOCKET": ch.sandbox_path}
        first = await _ask(sock, [b'{"tool": "Edit", "summary": "a.py"}\n', b"junk\n"])
        assert first[0] == {"ok": True, "group": 1, "changed": 1} and first[1]["ok"] is False
        flood = await asyncio.gather(
            *(_ask(sock, [b'{"tool": "Bash", "summary": "n"}\n'] * 5) for _ in range(6)), return_exceptions=True
        )
        answered = [a for f in flood if isinstance(f, list) for a in f]
        assert answered and all(a["ok"] for a in answered)
        # A line over the limit drops its connection; the channel serves the next one.
        with pytest.raises((ConnectionError, json.JSONDecodeError)):
            await _ask(sock, [b"x" * (MAX_LINE * 4) + b"\n"])
        last = await _ask(sock, [b'{"tool": "Write", "summary": "b.py"}\n'])
    assert not sock.exists()
    assert [t["call_id"] for t in ws.turns] == [f"proc-abc.t{i}" for i in range(1, len(ws.turns) + 1)]
    assert ws.turns[0] == {"prefer": "proc-abc", "call_id": "proc-abc.t1", "tool": "Edit", "command": "a.py"}
    assert last[0]["group"] == len(ws.turns) and ws.turns[-1]["tool"] == "Write"


async def test_no_directory_no_channel() -> None:
    async with TurnChannel.open(_Workspace(), "proc-abc", None) as ch:
        assert ch.sandbox_path is None and ch.env() == {}
    with pytest.raises(ValueError):
        TurnChannel(_Workspace(), "../x", None)


def _entry(i: int, call: str | None, tool: str = "shell_execute", **kw: Any) -> Entry:
    return Entry(id=i, ts=float(i), call_id=call, subtask_id=None, tool=tool, op="modify", path=f"f{i}", **kw)


def test_groups_are_calls_ordered_by_their_newest_entry() -> None:
    entries = [
        _entry(1, "p.t1", "Edit", note="$ a.py"),
        _entry(2, None),
        _entry(3, "p.t2", "Bash", note="$ make"),
        _entry(4, "p.t1", "Edit"),
        _entry(5, None, origin="undo", reverts=3),
        _entry(6, "p.t3", reverted_by=7),
    ]
    got = group(entries)
    assert [(g.call_id, g.tool, g.summary, g.entries) for g in got] == [
        (None, "shell_execute", None, [2]),
        ("p.t2", "Bash", "make", [3]),
        ("p.t1", "Edit", "a.py", [1, 4]),
        ("p.t3", "shell_execute", None, [6]),
    ]
    assert [g.reverted for g in got] == [False, False, False, True]


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LOOM_ALLOW_UNSAFE_LOCAL", "1")
    return tmp_path / "data"


async def _seed_turns(data: Path, workspace: Path) -> None:
    """Three of an agent's turns (as the channel files them) and a plain write."""
    from sandbox.local import LocalProcessBackend
    from worker.changelog import Changelog

    backend = LocalProcessBackend()
    try:
        box = await backend.get(workspace)
        async with Changelog.open(data, workspace) as cl:
            await cl.write(box, "a.py", b"1\n", tool="Edit", call_id="proc-1.t1")
            await cl.write(box, "b.py", b"2\n", tool="Write", call_id="proc-1.t2")
            await cl.write(box, "a.py", b"3\n", tool="Edit", call_id="proc-1.t3")
            await cl.write(box, "b.py", b"4\n", tool="Edit", call_id="proc-1.t3")
    finally:
        await backend.aclose()


def test_cli_undo_last_and_log_groups(cli_env: Path, workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from worker.cli import main

    asyncio.run(_seed_turns(cli_env, workspace))
    assert main(["log", "-w", str(workspace), "--groups"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "turn 1 of proc-1 (Edit)" in lines[0] and "turn 3 of proc-1 (Edit)" in lines[2]
    assert "2 entries, 2 path(s)" in lines[2]
    assert main(["undo", "-w", str(workspace), "--last", "1", "--backend", "local"]) == 0
    assert (workspace / "a.py").read_text() == "1\n" and (workspace / "b.py").read_text() == "2\n"
    capsys.readouterr()
    assert main(["log", "-w", str(workspace), "--groups", "--json", "--limit", "1"]) == 0
    (last,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert last["call_id"] == "proc-1.t3" and last["tool"] == "Edit" and last["reverted"] is True
    assert main(["undo", "-w", str(workspace), "--last", "1", "--backend", "local"]) == 0
    assert (workspace / "a.py").read_text() == "1\n" and not (workspace / "b.py").exists()
    for bad in (["--last", "0"], ["--last", "x"], ["--last", "1", "--all"]):
        with pytest.raises(SystemExit) as ei:
            main(["undo", "-w", str(workspace), *bad])
        assert ei.value.code == 2


def test_http_undo_takes_last_as_one_selector() -> None:
    from pydantic import ValidationError

    from worker.http.changelog import UndoRequest

    assert UndoRequest(last=2).last == 2
    for bad in ({"last": 1, "all": True}, {"last": 0}, {"last": 1, "call_id": "c"}):
        with pytest.raises(ValidationError):
            UndoRequest(**bad)


def test_a_hooks_own_json_becomes_the_request_the_script_sends() -> None:
    from worker.agents.turns import hook_request

    def line(hook: object) -> dict[str, str]:
        out = hook_request(hook)
        assert out.endswith(b"\n") and out.count(b"\n") == 1
        return dict(json.loads(out))

    assert line({"tool_name": "Edit", "tool_input": {"file_path": "a.py", "old_string": "x"}}) == {
        "tool": "Edit",
        "summary": "a.py",
    }
    assert line({"tool_name": "Bash", "tool_input": {"command": "y" * 500}})["summary"] == "y" * 200
    patch = "*** Begin Patch\n*** Add File: n.py\n+1\n*** End Patch\n"
    assert line({"tool_name": "apply_patch", "tool_input": {"command": patch}})["summary"] == "n.py"
    assert line({"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}}) == {
        "tool": "apply_patch",
        "summary": "edits made before ls",
    }
    assert line("not an object") == {"tool": "tool", "summary": ""}
