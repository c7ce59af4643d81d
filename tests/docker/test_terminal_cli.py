"""``loom-worker shell`` and ``exec -t`` on the real engine, under runc and gVisor, driven
as a person drives them: in a tmux pane (:class:`tests.tmuxpane.Pane`), keys sent with
``send-keys``, the screen read with ``capture-pane``.

- full-screen programs: an editor edits and saves a file (the image has no vim, vi or
  nano: a small curses editor, copied to the sandbox's /tmp, stands in for one), and the
  change is in ``loom-worker log`` as the terminal's (call id ``term-...``) and undone by
  ``undo``; ``top``; a curses program; a Python REPL keeps its state;
- the terminal's discipline: Ctrl-C interrupts ``sleep 100``; ``stty size`` follows the
  pane's size; ``exit 3`` is exit code 3; our terminal is sane afterwards (``icanon``,
  ``echo``);
- a terminal outlives its client: detached with ``~.``, or its CLI killed (SIGTERM: the
  pane given back sane; SIGKILL), it runs on and ``--attach`` replays and continues;
- limits: a fork bomb in a terminal meets the pids limit and the worker stays healthy;
  ``loom-worker stop`` ends the terminal with the sandbox;
- without a terminal on standard input, as ``docker exec -i``.

Every wait polls the screen (or a file) with a deadline: never a sleep as an assertion.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE, TEST_OWNER
from tests.docker.conftest import require_runtime
from tests.tmuxpane import Pane
from tests.workers import ROOT, cli_env, run_dir, wait_for
from worker.owner import OWNER_FILE

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

CLI = [sys.executable, "-m", "worker.cli"]
PROMPT = "sandbox@sandbox:/workspace$ "

#: A small full-screen editor (the image has no vim, vi or nano): printable keys type,
#: Enter a new line, Backspace deletes, Ctrl-S saves, Ctrl-Q quits.
EDITOR = r"""
import curses, os, sys
path = sys.argv[1]
def main(scr):
    curses.raw()
    text = open(path).read() if os.path.exists(path) else ""
    status = "^S save  ^Q quit"
    while True:
        scr.erase()
        scr.addstr(0, 0, text)
        scr.addstr(curses.LINES - 1, 0, status)
        scr.refresh()
        k = scr.getch()
        if k == 19:
            with open(path, "w") as f:
                f.write(text)
            status = "SAVED %d bytes" % len(text)
        elif k == 17:
            return
        elif k in (10, 13):
            text += "\n"
        elif k in (8, 127, curses.KEY_BACKSPACE):
            text = text[:-1]
        elif 32 <= k < 127:
            text += chr(k)
curses.wrapper(main)
"""

CURSES = (
    "import curses\n"
    "def main(s):\n"
    "    s.addstr(5, 10, 'CURSES-' + 'DRAWN %dx%d' % (curses.COLS, curses.LINES))\n"
    "    s.refresh(); s.getch()\n"
    "curses.wrapper(main)\n"
)


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_ready: None) -> str:
    require_runtime(request.param)
    return str(request.param)


@pytest.fixture
def env(runtime: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    data = tmp_path / "data"
    data.mkdir()
    (data / OWNER_FILE).write_text(TEST_OWNER + "\n")  # this run's sandboxes (gc --all removes them)
    with run_dir() as run:
        yield cli_env(run, data, LOOM_IMAGE=SANDBOX_IMAGE, LOOM_RUNTIME=runtime, LOOM_CLI_DAEMON="0")


@pytest.fixture
def ws(workspace: Path, env: dict[str, str]) -> Iterator[Path]:
    os.chown(workspace, 1000, 1000)
    try:
        yield workspace
    finally:
        cli(env, "stop", "-w", str(workspace))


@pytest.fixture
def pane(env: dict[str, str]) -> Iterator[Pane]:
    with Pane(env, str(ROOT)) as p:
        yield p


def cli(env: dict[str, str], *argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, *argv], env=env, input=stdin, capture_output=True, timeout=300, cwd=str(ROOT))


def shell(ws: Path, *more: str) -> list[str]:
    return [*CLI, "shell", "-w", str(ws), *more]


def local_tty_is_sane(pane: Pane) -> None:
    """Our own terminal, after the CLI: canonical mode and echo back (``stty -a`` says
    ``icanon`` and ``echo``, not ``-icanon``, ``-echo``)."""
    pane.line(
        "clear; echo TTY=$(stty -a | tr ' ' '\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | sort | tr '\\n' ,)"
    )
    line = re.compile(r"^TTY=([a-z,-]*)$", re.M)
    found = line.search(pane.wait_for(lambda s: line.search(s) is not None, 30))
    assert found is not None and found[1] == "echo,icanon,", found


def size_becomes(pane: Pane, size: str, timeout: float = 60.0) -> None:
    """``stty size`` in the sandbox says ``size`` (asked again until it does: the resize
    travels beside the keys, and may come after the command typed next)."""
    deadline = time.monotonic() + timeout
    while True:
        pane.line("clear; stty size")
        try:
            pane.wait_for(lambda s: re.search(r"^\d+ \d+$", s, re.M) is not None, 30)
            pane.wait_for(size, 1)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def terminal_ids(env: dict[str, str], ws: Path) -> dict[str, str]:
    """The workspace's terminals (``shell --list``): id -> state."""
    p = cli(env, "shell", "-w", str(ws), "--list")
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.decode().splitlines()[1:]]
    return {r[0]: r[1] for r in rows}


# -- a session: full-screen programs, the discipline, the record ------------------------------------


def test_programs_in_a_shell_and_what_they_change(env: dict[str, str], ws: Path, pane: Pane) -> None:
    for name, source in (("ed.py", EDITOR), ("draw.py", CURSES)):  # the sandbox's /tmp: not recorded
        p = cli(env, "cp", "-w", str(ws), "-", f":/tmp/{name}", stdin=source.encode())
        assert p.returncode == 0, p.stderr
    marker = pane.run(shell(ws))
    pane.wait_for(PROMPT)
    # A Python REPL keeps its state from line to line.
    pane.line("python3 -q")
    pane.wait_for(">>> ")
    pane.line("x = 6 * 7")
    pane.line("print('value', x + 1)")
    pane.wait_for("value 43")
    pane.line("exit()")
    # The size: ours at the start, and as it changes (SIGWINCH here, a resize there).
    pane.line("clear; stty size")
    pane.wait_for("30 100")
    pane.resize(120, 40)
    size_becomes(pane, "40 120")
    pane.resize(100, 30)
    size_becomes(pane, "30 100")
    # Ctrl-C is a byte: the sandbox's line discipline interrupts the program in front. (The
    # job says it started itself: once it prints, the shell has given it the terminal.)
    pane.line("clear; sh -c 'echo started-$((3 + 4)); exec sleep 100'")
    pane.wait_for("started-7")
    pane.keys("C-c")
    pane.line("echo after-$((1 + 1))")
    pane.wait_for("after-2", 60)  # well before the 100 s sleep could have ended
    # A curses program draws where it says, at the terminal's size.
    pane.line("clear; python3 /tmp/draw.py")
    shown = pane.wait_for("CURSES-DRAWN")
    row = next(i for i, line in enumerate(shown.splitlines()) if "CURSES-DRAWN" in line)
    assert (row, shown.splitlines()[row].index("CURSES-DRAWN")) == (5, 10), shown
    assert "CURSES-DRAWN 100x30" in shown
    pane.type("q")
    pane.wait_for(PROMPT)
    # top draws its screen, and quits on q.
    pane.line("clear; top -d 1")
    pane.wait_for(lambda s: "load average" in s and "PID" in s)
    pane.type("q")
    pane.wait_for(PROMPT)
    # An editor edits and saves a file.
    pane.line("clear; python3 /tmp/ed.py notes.txt")
    pane.wait_for("^S save")
    pane.type("hello from a terminal")
    pane.keys("Enter")
    pane.type("second line")
    pane.keys("C-s")
    pane.wait_for("SAVED 33 bytes")
    pane.keys("C-q")
    pane.wait_for(PROMPT)
    assert (ws / "notes.txt").read_text() == "hello from a terminal\nsecond line"
    # exit 3: our exit code is the program's.
    pane.line("exit 3")
    assert pane.exit_code(marker) == 3
    local_tty_is_sane(pane)

    # The save is recorded as the terminal's, and undone.
    def entries() -> list[dict[str, object]]:
        p = cli(env, "log", "-w", str(ws), "--json")
        assert p.returncode == 0, p.stderr
        return [json.loads(line) for line in p.stdout.splitlines()]

    assert wait_for(lambda: any(e.get("path") == "notes.txt" for e in entries()), 60), entries()
    saved = [e for e in entries() if e.get("path") == "notes.txt"]
    call = str(saved[0]["call_id"])
    assert call.startswith("term-") and f"[terminal {call}]" in str(saved[0]["note"]), saved
    p = cli(env, "undo", "-w", str(ws), "--call", call)
    assert p.returncode == 0, p.stderr
    assert not (ws / "notes.txt").exists()


def test_exec_tty_runs_one_program_on_a_terminal(env: dict[str, str], ws: Path, pane: Pane) -> None:
    marker = pane.run([*CLI, "exec", "-t", "-w", str(ws), "-e", "GREETING=hi", "--", "python3", "-q"])
    pane.wait_for(">>> ")
    pane.line("import os, sys; print(os.environ['GREETING'], sys.stdin.isatty())")
    pane.wait_for("hi True")
    pane.line("raise SystemExit(7)")
    assert pane.exit_code(marker) == 7
    local_tty_is_sane(pane)
    # Not a terminal here: as docker exec -i (its end typed as Ctrl-D), exit codes passed on.
    p = cli(env, "exec", "-t", "-w", str(ws), "--", "sh", "-c", "exit 9")
    assert p.returncode == 9, p.stderr
    p = cli(env, "exec", "-t", "-w", str(ws), "--", "sh -c 'kill -TERM $$'")
    assert p.returncode == 143, p.stderr


# -- a terminal outlives its client ------------------------------------------------------------------


def test_detach_then_reattach(env: dict[str, str], ws: Path, pane: Pane) -> None:
    marker = pane.run(shell(ws))
    pane.wait_for(PROMPT)
    pane.line("echo first-$((1 + 1))")
    pane.wait_for("first-2")
    pane.type("~.")  # at the start of a line: the escape
    assert pane.exit_code(marker) == 0
    shown = pane.wait_for("--attach term-")
    tid = re.search(r"--attach (term-[0-9a-f]+)", shown)
    assert tid is not None, shown
    local_tty_is_sane(pane)
    assert terminal_ids(env, ws)[tid[1]] == "running"
    marker = pane.run(shell(ws, "--attach", tid[1]))
    pane.wait_for("first-2")  # replayed
    pane.line("echo second-$((2 + 2)) ~ok")  # (a ~ not after Enter is typed as it is)
    pane.wait_for("second-4 ~ok")
    pane.line("exit 5")
    assert pane.exit_code(marker) == 5


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_terminal_runs_on_when_its_client_is_killed(
    env: dict[str, str], ws: Path, pane: Pane, sig: signal.Signals
) -> None:
    marker = pane.run(shell(ws))
    pane.wait_for(PROMPT)
    pane.line("n=0; while sleep 0.2; do n=$((n + 1)); done & echo alive-$((5 * 5))")
    pane.wait_for("alive-25")
    (tid,) = terminal_ids(env, ws)
    client = _child_of(pane.pane_pid())
    os.kill(client, sig)
    code = pane.exit_code(marker)
    if sig == signal.SIGTERM:
        assert code == 143
        pane.wait_for(f"--attach {tid}")
        local_tty_is_sane(pane)
    else:
        assert code == 137
        pane.line("stty sane")  # (nothing can give a terminal back after a SIGKILL)
    assert terminal_ids(env, ws)[tid] == "running"
    marker = pane.run(shell(ws, "--attach", tid))
    pane.wait_for("alive-25")
    pane.line("kill %1; echo still-$((6 * 7))")
    pane.wait_for("still-42")
    pane.line("exit")
    assert pane.exit_code(marker) == 0


def _child_of(pid: int) -> int:
    """The one child of ``pid`` (the CLI the pane's shell runs)."""

    def children() -> list[int]:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]

    assert wait_for(lambda: len(children()) == 1, 30), children()
    return children()[0]


# -- limits ------------------------------------------------------------------------------------------


def test_a_fork_bomb_meets_the_pids_limit_and_the_worker_stays_healthy(
    env: dict[str, str], ws: Path, pane: Pane
) -> None:
    marker = pane.run(shell(ws))
    pane.wait_for(PROMPT)
    pane.line("bomb() { bomb | bomb & }; bomb")

    def limited(s: str) -> bool:
        return ("fork" in s and ("Resource temporarily unavailable" in s or "retry" in s)) or "was lost" in s

    pane.wait_for(limited, 120)
    # While the sandbox is at its limit no new client can reach it (its agent would be a
    # new process). Under runc the attached client still types: the shell leaves, and
    # everything it started is killed with it. Under gVisor, whose threads count against
    # the limit too, the agent relaying the stream may die of it: the client's stream is
    # lost (exit 125) and the worker replaces the sandbox at its next call.
    if not os.path.exists(marker):
        pane.line("exit")
    assert pane.exit_code(marker) in (0, 1, 125, 129, 130, 137)
    p = cli(env, "exec", "-w", str(ws), "--", "true")
    assert p.returncode == 0, p.stderr
    p = cli(env, "exec", "-w", str(ws), "--", "sh", "-c", "ps -e --no-headers | wc -l")
    assert p.returncode == 0 and int(p.stdout) < 20, p.stdout  # the bomb is gone


def test_stop_ends_the_terminal_with_the_sandbox(env: dict[str, str], ws: Path, pane: Pane) -> None:
    marker = pane.run(shell(ws, "--", "sh", "-c", "echo up-$((4 * 4)); exec sleep 1000"))
    pane.wait_for("up-16")
    (tid,) = terminal_ids(env, ws)
    p = cli(env, "stop", "-w", str(ws))
    assert p.returncode == 0, p.stderr
    assert pane.exit_code(marker) == 125  # the stream to it broke: said, and ours exits 125
    pane.wait_for(f"the connection to {tid} was lost", history=True)
    assert terminal_ids(env, ws) == {}
    p = cli(env, "call", "process_list", "-w", str(ws), "--args", "{}")
    assert p.returncode == 0 and tid not in p.stdout.decode(), p.stdout


# -- without a terminal ------------------------------------------------------------------------------


def test_without_a_terminal_it_works_as_docker_exec_i(env: dict[str, str], ws: Path) -> None:
    p = cli(env, "shell", "-w", str(ws), stdin=b"echo hi-$((2 * 3))\nexit 4\n")
    assert p.returncode == 4, p.stderr
    assert b"hi-6\r\n" in p.stdout  # (a terminal's line ends)
    p = cli(env, "shell", "-w", str(ws), stdin=b"")  # no input at all: the shell reads its end (once it reads)
    assert p.returncode == 0 and b"logout" in p.stdout, (p.stdout, p.stderr)
    p = cli(env, "shell", "-w", str(ws), "--size", "50x10", "--", "stty", "size", stdin=b"")
    assert (p.returncode, p.stdout) == (0, b"10 50\r\n"), p.stderr
    p = cli(env, "shell", "-w", str(ws), "--", "cat", stdin=b"typed\n")  # the end of input: Ctrl-D
    assert p.returncode == 0 and p.stdout.count(b"typed\r\n") == 2, p.stdout  # echoed, then cat's
    p = cli(env, "shell", "-w", str(ws), "--attach", "term-000000000000", stdin=b"")
    assert p.returncode == 1 and b"term-000000000000" in p.stderr
    p = cli(env, "shell", "-w", str(ws), "--", "rm", "-rf", "/", stdin=b"")
    assert p.returncode == 126 and b"Safety violation" in p.stderr
