"""A terminal emulator for the tests: a tmux pane of its own server (a private socket, so
nothing of anyone else's tmux is touched), driven with ``send-keys`` and read with
``capture-pane``. Waits poll the screen until the text is there, with a deadline: a
synchronisation, never a timing assertion."""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping

TMUX = shutil.which("tmux") or "/usr/bin/tmux"


class Pane:
    """One tmux session (one window, one pane) of ``cols`` x ``rows`` running ``bash
    --norc`` with ``env``, in directory ``cwd``. Use as a context manager: the tmux
    server is killed at the end."""

    def __init__(self, env: Mapping[str, str], cwd: str, *, cols: int = 100, rows: int = 30) -> None:
        self.socket = "loomtest-" + secrets.token_hex(4)
        self.env = {**env, "TERM": "xterm-256color"}
        self.env.pop("TMUX", None)
        self._tmux("-f", "/dev/null", "new-session", "-d", "-x", str(cols), "-y", str(rows), "-c", cwd,
                   "bash --norc --noprofile")  # fmt: skip
        try:
            self._tmux("set-option", "-g", "history-limit", "5000")
            self.line("PS1='pane''$ '")  # (as typed it is not the prompt it sets)
            self.wait_for("pane$ ")
        except BaseException:
            self.close()  # (no `with` block will)
            raise

    def _tmux(self, *args: str) -> str:
        p = subprocess.run(
            [TMUX, "-L", self.socket, *args], env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        if p.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {p.stderr.strip()}")
        return p.stdout

    def __enter__(self) -> Pane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True, timeout=30, check=False)

    # -- input --------------------------------------------------------------------------

    def type(self, text: str) -> None:
        """``text`` typed as it is (no key names)."""
        self._tmux("send-keys", "-l", text)

    def keys(self, *names: str) -> None:
        """Keys by tmux's names: ``Enter``, ``C-c``, ``C-s``..."""
        self._tmux("send-keys", *names)

    def line(self, text: str) -> None:
        """``text`` then Enter."""
        self.type(text)
        self.keys("Enter")

    def run(self, argv: list[str], *, then: str = "") -> str:
        """Start ``argv`` at the pane's shell, its exit code then written where
        :meth:`exit_code` finds it; returns the marker file."""
        marker = f"/tmp/loomtest-exit-{secrets.token_hex(4)}"
        self.line(f"clear; {shlex.join(argv)}; echo $? > {marker}.new; mv {marker}.new {marker}{then}")
        return marker

    def resize(self, cols: int, rows: int) -> None:
        self._tmux("resize-window", "-x", str(cols), "-y", str(rows))

    # -- output -------------------------------------------------------------------------

    def screen(self) -> str:
        """What the pane shows now (lines joined where they wrapped)."""
        return self._tmux("capture-pane", "-p", "-J")

    def history(self) -> str:
        """The screen and what scrolled off it."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-")

    def wait_for(self, what: str | Callable[[str], bool], timeout: float = 120.0, *, history: bool = False) -> str:
        """Poll until ``what`` (text, or a test of the screen) is on the screen; the
        screen. Raises AssertionError with the screen at the deadline."""
        test = what if callable(what) else (lambda s: what in s)
        deadline = time.monotonic() + timeout
        while True:
            shown = self.history() if history else self.screen()
            if test(shown):
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(f"not on the screen after {timeout:g}s: {what!r}\n--- screen ---\n{shown}")
            time.sleep(0.05)

    def exit_code(self, marker: str, timeout: float = 120.0) -> int:
        """The exit code :meth:`run` wrote to ``marker``, once there (polled with a
        deadline). Raises AssertionError with the screen."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(marker):
            if time.monotonic() > deadline:
                raise AssertionError(f"the command did not end within {timeout:g}s\n--- screen ---\n{self.screen()}")
            time.sleep(0.05)
        with open(marker) as f:
            code = int(f.read().strip())
        os.unlink(marker)
        return code

    def pane_pid(self) -> int:
        """The pid of the pane's shell."""
        return int(self._tmux("display-message", "-p", "#{pane_pid}").strip())
