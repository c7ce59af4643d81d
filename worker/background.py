"""The worker's record of a workspace's background processes, on the host.

The sandbox (each process's supervisor) knows whether a process runs; the changelog needs
more: which processes were started, by which call, and whether the changes a process made
until it ended have been recorded yet. That is kept here, in
``$LOOM_DATA_DIR/workspaces/<hash>/background.json`` next to the changelog, so every worker
process using the workspace (the service, the CLI's local worker, a CLI call) sees the
processes the others started. Reads cost one ``stat`` when nothing changed; writes are
atomic (temp file and rename) under an exclusive ``flock``.

How changes are attributed (the changelog's "before" for a background process): changes
the worker finds between calls, while background processes ran or after one ended, are
recorded for the process, with its id as the call id (``undo --call <process id>``); when
several ran, for the one started last, the others named in the entry's command. A change
made while a foreground command runs is that command's. A ``write_file``/``edit_file``
racing a background process records what the file held when the write began.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sandbox.capabilities import background

from .storage.atomic import write_atomic

FILE = "background.json"
#: Ended processes whose changes are recorded are forgotten after this long.
KEEP_ENDED = 24 * 3600.0


def new_process_id() -> str:
    return "proc-" + secrets.token_hex(6)


@dataclass(frozen=True)
class BackgroundLimits:
    """Per process: the default and largest timeout, how long an ended one can be read;
    per workspace: how many may run at once."""

    max_processes: int = 8
    timeout: float = 3600.0
    max_timeout: float = 86_400.0
    linger: float = 600.0


@dataclass
class Started:
    id: str
    command: str
    started: float
    call_id: str | None = None
    subtask_id: str | None = None
    ended: float | None = None
    accounted: bool = False  # its changes up to its end are recorded


class BackgroundIndex:
    """``background.json`` of one workspace (``state_dir`` is its host-side directory)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILE
        self._stamp: tuple[int, int, int] | None = None
        self._items: dict[str, Started] = {}

    def _read(self) -> dict[str, Started]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._items = None, {}
            return self._items
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            try:
                raw = json.loads(self.path.read_text())
                items = {k: Started(**v) for k, v in raw.items()} if isinstance(raw, dict) else {}
            except (ValueError, TypeError, OSError):
                items = {}  # a broken file loses the attribution, nothing else
            self._stamp, self._items = stamp, items
        return self._items

    def items(self) -> list[Started]:
        return list(self._read().values())

    def get(self, process_id: str) -> Started | None:
        return self._read().get(process_id)

    def pending(self) -> list[Started]:
        """Processes whose changes may still be unrecorded (running, or ended and not
        accounted for). Cheap: one stat when the file did not change."""
        return [s for s in self._read().values() if not s.accounted]

    def update(self, fn: Any) -> None:
        """Apply ``fn(items)`` under the lock and store the result. Raises OSError."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._stamp = None
            items = dict(self._read())
            fn(items)
            now = time.time()
            items = {k: v for k, v in items.items() if not (v.accounted and v.ended and now - v.ended > KEEP_ENDED)}
            write_atomic(self.path, json.dumps({k: asdict(v) for k, v in items.items()}), fsync=False)
        finally:
            os.close(lock)

    def add(self, item: Started) -> None:
        self.update(lambda items: items.__setitem__(item.id, item))

    def mark(self, process_id: str, *, ended: float | None = None, accounted: bool | None = None) -> None:
        def change(items: dict[str, Started]) -> None:
            it = items.get(process_id)
            if it is None:
                return
            if ended is not None and it.ended is None:
                it.ended = ended
            if accounted is not None:
                it.accounted = accounted

        self.update(change)


@dataclass
class Attribution:
    """Whom changes found between calls are recorded for, and which processes that
    settles (ended ones: their changes are then all recorded)."""

    record: dict[str, Any]
    settles: list[str]


class Background:
    """A workspace's background processes as the changelog sees them."""

    def __init__(self, index: BackgroundIndex, limits: BackgroundLimits) -> None:
        self.index = index
        self.limits = limits

    async def attribution(
        self, sandbox: Any, *, prefer: str | None = None, turn: dict[str, str] | None = None
    ) -> Attribution | None:
        """None when no background process may have changed anything since the last
        scan (one ``stat``); else the record to file those changes under: ``prefer``'s
        when it is one that may have, else the one started last's. Asks the sandbox
        which processes still run (one round trip) only then. ``turn`` (``call_id``,
        ``tool``, ``command``) replaces those of ``prefer``'s record: one of an agent's
        tool calls, :mod:`worker.agents.turns`."""
        pending = self.index.pending()
        if not pending:
            return None
        try:
            live = {p.id: p for p in await background(sandbox).processes()}
        except NotImplementedError:
            live = {}
        settles = []
        for s in pending:
            p = live.get(s.id)
            if p is None or not p.running:
                settles.append(s.id)
        preferred = [s for s in pending if s.id == prefer]
        latest = preferred[0] if preferred else max(pending, key=lambda s: s.started)
        others = [s.id for s in pending if s is not latest]
        kind = "terminal" if latest.id.startswith("term-") else "background process"
        command = f"{latest.command}  [{kind} {latest.id}"
        command += f"; {', '.join(others)} ran too]" if others else "]"
        record = {"tool": "shell_execute", "command": command, "call_id": latest.id, "subtask_id": latest.subtask_id}
        if turn and preferred:
            record.update({k: turn[k] for k in ("call_id", "tool", "command") if k in turn})
        return Attribution(record, settles)

    def settled(self, attribution: Attribution) -> None:
        """The changes up to now are recorded: the ended processes are accounted for."""
        now = time.time()
        for pid in attribution.settles:
            with contextlib.suppress(OSError):
                self.index.mark(pid, ended=now, accounted=True)
