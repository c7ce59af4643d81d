"""Terminals through the Python API on the real engine, under runc and gVisor: a login
shell on a pseudo-terminal that draws, resizes, takes Ctrl-C and signals, passes its exit
code; reattached with its output replayed; its changes recorded as its own and undone; it
counts against the workspace's process budget and the sandbox's pids limit, and ends with
the sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.errors import AgentError
from tests.docker.conftest import own_registry
from worker.registry import ToolRegistry
from worker.terminals import Terminal, TerminalArgumentError

pytestmark = [pytest.mark.docker]

#: Generous: gVisor's ptrace platform on a loaded 2-core machine lags by seconds.
WAIT = 60.0


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def registry(runtime: str, docker_ready: None, tmp_path: Path) -> AsyncIterator[ToolRegistry]:
    async with own_registry(tmp_path, runtime) as reg:
        yield reg


def workspace(tmp_path: Path, name: str = "ws") -> Path:
    ws = tmp_path / name
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    return ws


class Screen:
    """A terminal's output, read in the background, waited on for a pattern."""

    def __init__(self, term: Terminal) -> None:
        self.term = term
        self.text = ""
        self.changed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for chunk in self.term.output():
            self.text += chunk.decode("utf-8", "replace")
            self.changed.set()
        self.changed.set()

    async def expect(self, pattern: str, *, after: int = 0) -> re.Match[str]:
        """The first match of ``pattern`` in the output past offset ``after``."""
        deadline = time.monotonic() + WAIT
        while True:
            m = re.compile(pattern).search(self.text, after)
            if m:
                return m
            left = deadline - time.monotonic()
            assert left > 0 and not self.task.done(), f"no {pattern!r} in {self.text[after:][-2000:]!r}"
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    async def run(self, line: str, marker: str) -> str:
        """Type ``line`` then an echo of ``marker``; what the line printed."""
        start = len(self.text)
        await self.term.write(f"{line}; echo {marker[:1]}''{marker[1:]}\r".encode())
        m = await self.expect(re.escape(marker) + r"\r?\n", after=start)
        return self.text[start : m.start()]


async def test_a_shell_draws_resizes_takes_ctrl_c_and_signals_and_gives_its_exit_code(
    registry: ToolRegistry, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    handle = registry.sandbox(ws)
    term = await handle.open_terminal(cols=90, rows=20)
    assert term.id.startswith("term-") and term.info.pty == (90, 20) and term.info.running
    screen = Screen(term)
    out = await screen.run("echo $TERM $LANG; stty size; tty; pwd", "DONE1")
    assert "xterm-256color C.UTF-8" in out and "20 90" in out and "/dev/pts/" in out and "/workspace" in out, out
    await term.resize(132, 43)
    assert "43 132" in await screen.run("stty size", "DONE2")
    # Ctrl-C as typed: the terminal's line discipline interrupts the foreground program
    start = len(screen.text)
    await term.write(b"sleep 100; echo NOT-''INTERRUPTED\r")
    await asyncio.sleep(0.5)
    await term.write(b"\x03")
    assert "NOT-INTERRUPTED" not in await screen.run("echo after", "DONE3")
    assert "NOT-INTERRUPTED" not in screen.text[start:]
    # a signal through the API reaches the foreground program, not the shell
    await term.write(b"sleep 100; echo NOT-''SIGNALLED\r")
    await asyncio.sleep(0.5)
    await term.signal("INT")
    assert "NOT-SIGNALLED" not in await screen.run("echo again", "DONE4")
    # a curses-style program draws (tput asks the terminfo of TERM)
    assert "132" in await screen.run("tput cols", "DONE5")
    await term.write(b"exit 3\r")
    await asyncio.wait_for(screen.task, WAIT)
    assert term.info.exit_code == 3 and not term.info.running, term.info
    with pytest.raises(AgentError) as e:
        await handle.attach_terminal("term-000000000000")
    assert e.value.code == "not_found"


async def test_a_terminal_outlives_its_client_and_replays_its_output(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    handle = registry.sandbox(ws)
    term = await handle.open_terminal(["/bin/sh"], cols=80, rows=24)
    screen = Screen(term)
    await screen.run("x=41; echo remembered-$((x+1))", "DONE1")
    await term.close()  # the client goes; the shell goes on
    [listed] = await handle.terminals()
    assert listed.id == term.id and listed.running
    again = await handle.attach_terminal(term.id)
    screen2 = Screen(again)
    await screen2.expect("remembered-42")  # replayed
    assert again.cursor >= len("remembered-42") and again.dropped == 0
    assert "41" in await screen2.run("echo $x", "DONE2")  # the same shell, its state kept
    # a client may resume after what it saw, with nothing repeated
    last = again.cursor
    await again.close()
    third = await handle.attach_terminal(term.id, since=last)
    screen3 = Screen(third)
    await screen3.run("echo fresh", "DONE3")
    assert "remembered" not in screen3.text
    info = await handle.kill_terminal(term.id)
    assert not info.running
    await asyncio.wait_for(screen3.task, WAIT)


async def test_its_changes_are_recorded_as_the_terminals_and_undone(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    (ws / "keep.txt").write_text("kept\n")
    handle = registry.sandbox(ws)
    async with await handle.open_terminal(["/bin/sh"]) as term:
        screen = Screen(term)
        await screen.run("echo one > a.txt; mkdir -p d && echo two > d/b.txt; rm -f keep.txt", "DONE1")
        opened = registry.pool.opened()[ws.resolve()]
        deadline = time.monotonic() + WAIT
        log: list = []
        while time.monotonic() < deadline:  # recorded when the terminal settles
            log = await opened.recorder.log(call_id=term.id)  # type: ignore[attr-defined]
            if {"a.txt", "d/b.txt", "keep.txt"} <= {e.path for e in log}:
                break
            await asyncio.sleep(0.2)
        assert {"a.txt", "d/b.txt", "keep.txt"} <= {e.path for e in log}, log
        assert all(e.call_id == term.id for e in log), log
        await screen.run("echo three > c.txt", "DONE2")
    # closing the client recorded the rest
    log = await opened.recorder.log(call_id=term.id)  # type: ignore[attr-defined]
    assert "c.txt" in {e.path for e in log}, log
    assert await opened.recorder.undo(opened.sandbox, call_id=term.id) is not None  # type: ignore[attr-defined]
    assert not (ws / "a.txt").exists() and not (ws / "d").exists() and not (ws / "c.txt").exists()
    assert (ws / "keep.txt").read_text() == "kept\n"
    await handle.kill_terminal(term.id)


async def test_terminals_count_against_the_process_budget_and_pids_and_end_with_the_sandbox(
    registry: ToolRegistry, runtime: str, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    handle = registry.sandbox(ws)
    terms = [await handle.open_terminal(["/bin/sh"]) for _ in range(8)]
    with pytest.raises(AgentError) as e:
        await handle.open_terminal(["/bin/sh"])
    assert e.value.code == "limit" and "at most 8" in str(e.value)
    for t in terms[1:]:
        await handle.kill_terminal(t.id)
        await t.close()
    # a fork bomb in a terminal meets the sandbox's pids limit; the worker stays healthy
    screen = Screen(terms[0])
    await terms[0].write(b"bomb() { bomb | bomb & }; bomb\r")
    if runtime == "runc":
        await screen.expect("(?i)(resource temporarily unavailable|cannot fork|retry: )")
        await handle.kill_terminal(terms[0].id)  # everything it started goes with it
    else:
        # gVisor: the bomb takes the sandbox's agent down with it (the stream ends, the
        # sandbox is lost); the next call starts a new sandbox
        await asyncio.wait_for(screen.task, WAIT)
        assert terms[0]._tunnel.error is None or "lost" in terms[0]._tunnel.error
    await asyncio.wait_for(screen.task, WAIT)
    r = await registry.execute("shell_execute", {"command": "echo alive"}, workspace=str(ws))
    assert r.success and "alive" in r.output, r.output
    # the sandbox's end ends its terminals
    last = await handle.open_terminal(["/bin/sh"])
    screen = Screen(last)
    await screen.run("echo up", "DONE1")
    await registry.stop(ws)
    await asyncio.wait_for(screen.task, WAIT)
    r = await registry.execute("shell_execute", {"command": "echo fresh"}, workspace=str(ws))
    assert r.success and "fresh" in r.output, r.output
    assert await handle.terminals() == []


async def test_bad_arguments_are_refused_before_anything_starts(registry: ToolRegistry, tmp_path: Path) -> None:
    handle = registry.sandbox(workspace(tmp_path))
    for kwargs in ({"cols": 0}, {"rows": 1001}, {"cols": True}):
        with pytest.raises(TerminalArgumentError):
            await handle.open_terminal(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(TerminalArgumentError):
        await handle.open_terminal([])
    term = await handle.open_terminal(["/bin/sh"])
    with pytest.raises(TerminalArgumentError):
        await term.signal("NOPE")
    with pytest.raises(TerminalArgumentError):
        await term.resize(5000, 10)
    assert (await term.signal(signal.SIGWINCH)).running
    await handle.kill_terminal(term.id)
    await term.close()
