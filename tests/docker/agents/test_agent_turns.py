"""Turn by turn undo on the real engine, runc and gVisor: a background process of the
sandbox (standing in for an agent) changes files and calls the hook script
(``$HOME/.loom/loom-turn.py``, with loom's own runtime Python) between its changes; each call is
its own changelog group with the agent's tool name, ``undo --last 1`` takes back only the
newest, ``undo --all`` restores the tree, and a flood of requests breaks nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.capabilities import background
from tests.docker.conftest import own_registry
from worker.agents.hooks import _command
from worker.agents.turns import TurnChannel, hook_files
from worker.background import new_process_id

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

HOOK = _command("$HOME")  # exactly what the agents' settings run
FLOOD = r"""
import json, os, socket, threading
path = os.environ["LOOM_TURN_SOCKET"]
answers = []
def one(n):
    s = socket.socket(socket.AF_UNIX); s.connect(path); f = s.makefile("rwb")
    for i in range(n):
        f.write(json.dumps({"tool": "Flood\x07" + "x" * 500, "summary": "\n" * 300}).encode() + b"\n"); f.flush()
        answers.append(json.loads(f.readline()))
    s.close()
threads = [threading.Thread(target=one, args=(4,)) for _ in range(6)]
[t.start() for t in threads]; [t.join() for t in threads]
s = socket.socket(socket.AF_UNIX); s.connect(path); s.sendall(b"y" * 100000 + b"\n")  # over the limit: dropped
s.close()
print("flood", len(answers), all(a["ok"] for a in answers))
"""


@pytest.fixture(params=["runc", "runsc"])
async def registry(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[Any]:
    async with own_registry(tmp_path, request.param) as reg:
        yield reg


async def sh(registry: Any, ws: Path, command: str) -> str:
    r = await registry.execute("shell_execute", {"command": command, "timeout": 120}, workspace=str(ws))
    assert r.success, r.output
    return str(r.output)


def turn(tool: str, **tool_input: str) -> str:
    """A hook call as Claude Code makes it after tool ``tool``."""
    return f"echo {shlex.quote(json.dumps({'tool_name': tool, 'tool_input': tool_input}))} | {HOOK}"


async def test_each_tool_call_is_its_own_group(registry: Any, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    (ws / "keep.txt").write_text("kept\n")
    os.chown(ws / "keep.txt", 1000, 1000)
    # An agent's workspace reaches its provider: its sandbox has the gateway's directory.
    await registry.configure_workspace(ws, {"egress": ["pypi"]})
    w = await registry.pool.workspace(ws)
    for rel, text in hook_files("claude").items():
        data = base64.b64encode(text.encode()).decode()
        await sh(registry, ws, f'mkdir -p "$HOME/.loom" && echo {data} | base64 -d > "$HOME/{rel}"')
    host_dir = registry.pool.turn_dir(w.root)
    assert host_dir is not None
    pid = new_process_id()
    script = "; ".join(
        [
            "set -e",
            "echo one > a.py",
            turn("Edit", file_path="a.py"),
            "echo two > b.py",
            turn("Write", file_path="b.py"),
            "echo three >> a.py; mkdir -p d; echo c > d/c.txt; rm keep.txt",
            turn("Bash", command="make all"),
            f"python3 -c {shlex.quote(FLOOD)}",
            turn("Read", file_path="a.py"),
            "echo done > done.txt",
        ]
    )
    async with TurnChannel.open(w, pid, host_dir) as ch:
        assert (host_dir / f"turn-{pid}.sock").exists()
        await w.start_background(script, timeout=300, process_id=pid, env=ch.env())
        for _ in range(1200):
            (info,) = [p for p in await background(w.sandbox).processes() if p.id == pid]
            if not info.running:
                break
            await asyncio.sleep(0.1)
        out = await background(w.sandbox).process_output(pid)
        assert info.exit_code == 0, (out.stdout, out.stderr)
        assert ch.turns == 3 + 24 + 1
    assert not (host_dir / f"turn-{pid}.sock").exists()
    assert "flood 24 True" in out.stdout.decode(errors="replace")
    await w.settle_background(prefer=pid)  # what it did after its last turn: its own

    cl = w.recorder
    groups = await cl.groups()
    assert [(g.call_id, g.tool) for g in groups] == [
        (f"{pid}.t1", "Edit"),
        (f"{pid}.t2", "Write"),
        (f"{pid}.t3", "Bash"),
        (pid, "shell_execute"),
    ], groups
    assert groups[0].summary == "a.py" and groups[0].paths == ["a.py"]
    assert groups[2].summary == "make all" and {"a.py", "keep.txt"} <= set(groups[2].paths)

    async def undo(**kw: Any) -> Any:
        async with w.mutating():
            return await cl.undo(w.sandbox, **kw)

    await undo(last=1)  # the changes after the last turn
    assert not (ws / "done.txt").exists() and (ws / "d" / "c.txt").exists()
    await undo(last=1)  # turn 3 only
    assert (ws / "a.py").read_text() == "one\n" and (ws / "b.py").read_text() == "two\n"
    assert not (ws / "d").exists() and (ws / "keep.txt").read_text() == "kept\n"
    assert [g.reverted for g in await cl.groups()] == [False, False, True, True]
    await undo(all=True)
    assert sorted(p.name for p in ws.iterdir()) == ["keep.txt"]
