"""The local side of ``loom-worker shell`` and ``exec -t``: our own terminal put in raw
mode and given back, its size, the detach escape (``~.`` after Enter), and writing
output whole. No asyncio and no worker import here: the pieces are small and tested on
their own (``tests/unit/test_cli_shell.py``).

Why raw mode: every byte typed must reach the terminal in the sandbox as it is typed
(Ctrl-C is byte 0x03: the sandbox's line discipline makes it a SIGINT for the program in
its foreground; Ctrl-Z, Ctrl-D and the arrows likewise), and what the sandbox's terminal
echoes is what is shown, so ours must neither buffer lines, echo, nor turn keys into
signals. ``docker exec -it`` and ``ssh`` do the same (``cfmakeraw``).
"""

from __future__ import annotations

import os
import select
import termios
import tty
from typing import Any

#: A terminal size is 1-1000 columns and rows (``worker.terminals.check_size``).
MIN_SIZE, MAX_SIZE = 1, 1000
#: The size of a terminal when ours has none (standard input not a terminal) and
#: ``--size`` does not say: the classic 80x24.
DEFAULT_SIZE = (80, 24)

ESCAPE = 0x7E  # "~"
DETACH = 0x2E  # "."
_LINE_ENDS = (0x0D, 0x0A)


def parse_size(text: str) -> tuple[int, int]:
    """``COLSxROWS`` (``100x30``) as (cols, rows). Raises ValueError naming the problem."""
    cols, sep, rows = text.strip().lower().partition("x")
    try:
        if not sep:
            raise ValueError
        size = int(cols), int(rows)
    except ValueError:
        raise ValueError(f"{text!r} is not COLSxROWS (for example 100x30)") from None
    if not all(MIN_SIZE <= v <= MAX_SIZE for v in size):
        raise ValueError(f"{text!r}: columns and rows are {MIN_SIZE}-{MAX_SIZE}")
    return size


def size_of(fd: int) -> tuple[int, int] | None:
    """The (cols, rows) of the terminal on ``fd``, clamped to 1-1000; None when it is not a
    terminal or says 0x0 (a pty nobody sized)."""
    try:
        got = os.get_terminal_size(fd)
    except OSError:
        return None
    if got.columns <= 0 or got.lines <= 0:
        return None
    return min(got.columns, MAX_SIZE), min(got.lines, MAX_SIZE)


class EscapeFilter:
    """The detach escape of ssh: ``~.`` at the start of a line (after Enter, or first
    thing) detaches; ``~~`` there types one ``~``; a ``~`` followed by anything else is
    typed with it. So a ``~`` at the start of a line is held back until the next key, as
    in ssh; every other byte passes at once.

    :meth:`feed` returns the bytes to type and whether the escape was typed (the bytes
    after it are dropped)."""

    def __init__(self) -> None:
        self.at_line_start = True
        self.pending = False  # a "~" at the start of a line, held back

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        if not self.pending and ESCAPE not in data:  # the common case: nothing to look at
            if data:
                self.at_line_start = data[-1] in _LINE_ENDS
            return data, False
        out = bytearray()
        for b in data:
            if self.pending:
                self.pending = False
                if b == DETACH:
                    return bytes(out), True
                out.append(ESCAPE)
                if b == ESCAPE:
                    self.at_line_start = False
                    continue
            elif self.at_line_start and b == ESCAPE:
                self.pending = True
                continue
            out.append(b)
            self.at_line_start = b in _LINE_ENDS
        return bytes(out), False


class RawMode:
    """Our terminal (``fd``) in raw mode until :meth:`restore`, which gives back exactly
    the settings it had (idempotent: call it on every way out)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._saved: list[Any] | None = None

    def enter(self) -> None:
        """Raises termios.error when ``fd`` is not a terminal."""
        self._saved = termios.tcgetattr(self.fd)
        # TCSANOW, not TCSAFLUSH: keys typed while the terminal was starting are kept.
        tty.setraw(self.fd, termios.TCSANOW)

    def restore(self) -> None:
        saved, self._saved = self._saved, None
        if saved is not None:
            try:
                termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
            except termios.error:
                pass  # the terminal went away (a closed window): nothing to give back


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd``, waiting when it is non-blocking and full. Raises OSError
    (EIO: our terminal hung up; EPIPE: the reader went away)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])
