"""``loom-worker shell`` and ``exec -t`` without an engine: the pieces of the local side
(the size, the detach escape, raw mode given back, whole writes, the listing) and the
usage and infrastructure exit codes. tests/docker/test_terminal_cli.py drives the real
thing in tmux."""

from __future__ import annotations

import os
import subprocess
import sys
import termios
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.workers import ROOT
from worker.cli.localterm import EscapeFilter, RawMode, parse_size, size_of, write_all
from worker.cli.shell import command_argv, listing_lines, parse_env

CLI = [sys.executable, "-m", "worker.cli"]


def test_sizes() -> None:
    assert parse_size("100x30") == (100, 30)
    assert parse_size(" 80X24 ") == (80, 24)
    assert parse_size("1x1000") == (1, 1000)
    for bad in ("100", "x30", "100x", "axb", "0x10", "10x1001", "-5x10", "100x30x2"):
        with pytest.raises(ValueError, match=r"COLSxROWS|1-1000"):
            parse_size(bad)


def test_the_size_of_a_terminal_and_of_what_is_not_one(tmp_path: Path) -> None:
    import fcntl
    import struct

    master, slave = os.openpty()
    try:
        assert size_of(slave) is None  # a pty nobody sized says 0x0
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        assert size_of(slave) == (100, 30)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 2000, 3000, 0, 0))
        assert size_of(slave) == (1000, 1000)  # clamped to what a terminal may be
    finally:
        os.close(master)
        os.close(slave)
    with open(tmp_path / "f", "w") as f:
        assert size_of(f.fileno()) is None


def feed_all(pieces: list[bytes]) -> tuple[bytes, bool]:
    esc = EscapeFilter()
    out = b""
    for piece in pieces:
        got, detach = esc.feed(piece)
        out += got
        if detach:
            return out, True
    return out, False


@pytest.mark.parametrize(
    ("pieces", "typed", "detached"),
    [
        ([b"~."], b"", True),  # first thing: the start of a line
        ([b"ls\r", b"~", b"."], b"ls\r", True),  # after Enter, in two reads
        ([b"ls\r~.rest"], b"ls\r", True),  # what follows the escape is dropped
        ([b"echo\n~."], b"echo\n", True),
        ([b"a~.b"], b"a~.b", False),  # not at the start of a line: typed as it is
        ([b"\r~~."], b"\r~.", False),  # ~~ is one ~ (and the line goes on: no escape)
        ([b"\r~x"], b"\r~x", False),  # ~ then anything else: both typed
        ([b"\r~", b"\r~."], b"\r~\r", True),  # a held ~ then Enter: both typed, then the escape
        ([b"\x03", b"~."], b"\x03~.", False),  # Ctrl-C does not start a line
        ([b"plain text"], b"plain text", False),
    ],
)
def test_the_detach_escape(pieces: list[bytes], typed: bytes, detached: bool) -> None:
    assert feed_all(pieces) == (typed, detached)


def test_a_tilde_at_the_start_of_a_line_waits_for_the_next_key() -> None:
    esc = EscapeFilter()
    assert esc.feed(b"~") == (b"", False)
    assert esc.feed(b"a") == (b"~a", False)


def test_raw_mode_is_given_back_exactly() -> None:
    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        raw = RawMode(slave)
        raw.enter()
        now = termios.tcgetattr(slave)
        assert not now[3] & (termios.ICANON | termios.ECHO | termios.ISIG)  # lflag
        raw.restore()
        assert termios.tcgetattr(slave) == before
        raw.restore()  # (idempotent: every way out calls it)
        assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)


def test_raw_mode_refuses_what_is_not_a_terminal(tmp_path: Path) -> None:
    with open(tmp_path / "f", "w") as f, pytest.raises(termios.error):
        RawMode(f.fileno()).enter()


def test_write_all_writes_everything_to_a_non_blocking_pipe() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)
    data = os.urandom(1 << 20)  # more than a pipe holds: it waits for the reader
    got = bytearray()
    import threading

    def read() -> None:
        while len(got) < len(data):
            got.extend(os.read(r, 1 << 16))

    t = threading.Thread(target=read)
    t.start()
    write_all(w, data)
    t.join(60)
    os.close(r)
    os.close(w)
    assert bytes(got) == data


def test_command_words_and_env() -> None:
    assert command_argv(["make test && make lint"]) == ["/bin/sh", "-c", "make test && make lint"]
    assert command_argv(["vim", "a b.txt"]) == ["vim", "a b.txt"]
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in (["A"], ["=1"]):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_env(bad)


def test_the_listing() -> None:
    now = 10_000.0
    t = [
        SimpleNamespace(
            id="term-aaaaaaaaaaaa",
            running=True,
            outcome=None,
            exit_code=None,
            pty=(100, 30),
            started=now - 125,
            command="",
        ),
        SimpleNamespace(
            id="term-bbbbbbbbbbbb",
            running=False,
            outcome="exit",
            exit_code=3,
            pty=(80, 24),
            started=now - 7200,
            command="python3",
        ),
    ]
    lines = listing_lines(t, now)
    assert lines[0].split() == ["ID", "STATE", "SIZE", "AGE", "COMMAND"]
    assert lines[1].split() == ["term-aaaaaaaaaaaa", "running", "100x30", "2m", "login", "shell"]
    assert lines[2].split() == ["term-bbbbbbbbbbbb", "ended", "3", "80x24", "2h", "python3"]


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "LOOM_CLI_DAEMON": "0", **(env or {})}
    return subprocess.run(
        [*CLI, *argv], env=e, capture_output=True, timeout=120, cwd=str(ROOT), stdin=subprocess.DEVNULL
    )


def test_usage_errors_exit_2(workspace: Path, tmp_path: Path) -> None:
    ws = str(workspace)
    for argv, needle in [
        (("shell", "-w", str(tmp_path / "missing")), b"not a directory"),
        (("shell", "-w", ws, "--size", "0x10"), b"1-1000"),
        (("shell", "-w", ws, "-e", "NOEQUALS"), b"KEY=VALUE"),
        (("shell", "-w", ws, "--cwd", "/etc"), b"relative"),
        (("shell", "-w", ws, "--list", "--attach", "term-x"), b"do not go together"),
        (("shell", "-w", ws, "--attach", "term-x", "--", "ls"), b"takes no command"),
        (("exec", "-w", ws, "-t", "--stdin", "--", "true"), b"--stdin"),
        (("exec", "-w", ws, "-t", "30", "--", "true"), b"-t is --tty"),
        (("exec", "-w", ws, "-t", "--timeout", "0", "--", "true"), b"--timeout"),
    ]:
        p = run(*argv)
        assert p.returncode == 2 and needle in p.stderr, (argv, p.stderr)


def test_no_engine_exits_125(workspace: Path, tmp_path: Path) -> None:
    no_engine = {"LOOM_DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock", "LOOM_DATA_DIR": str(tmp_path / "d")}
    for argv in (("shell", "-w", str(workspace)), ("exec", "-t", "-w", str(workspace), "--", "true")):
        p = run(*argv, env=no_engine)
        assert p.returncode == 125 and b"unavailable" in p.stderr, p.stderr
    p = run("shell", "-w", str(workspace), "--list", env=no_engine)
    assert p.returncode == 125, p.stderr
