"""What may be changing the workspace right now: the intent journal of one changelog.

Before a command, a background process or a tool's staged write may change the
workspace, a line saying so is appended here (``start``); when its changes are recorded
in the database, a line closes it (``end``). A process that dies in between (the worker,
``serve``, the engine taking the sandbox with it) leaves the intent open, and the next
user of the changelog, in this process or another, *reconciles* it before anything else
(:meth:`worker.changelog.api.Changelog.reconcile`): what changed since the baseline is
recorded as that command's, marked interrupted, and a staged temporary is removed.

Why a file of lines beside the database and not a row in it: appending a line is one
``write`` (about a microsecond), a database transaction a hop to the store's thread and
a commit, on the path of every command. The line is written with ``O_APPEND`` in one
``write`` call, so it is whole or (torn by a crash mid-write, or a full disk) unparsable
and skipped; only a start line can matter, and a start that was never written belongs to
a command that never started. The append is not fsync'd: it survives the death of any
process, which is what the faults above are; what a power cut does is in
docs/changelog.md. Writers of one workspace take turns (the changelog's mutation lock),
so lines of different processes never interleave within a record.

Blocking, but tiny (an append; the read happens once per process and after another
process wrote): called on the event loop, like the pending-entry peek.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from .errors import ChangelogStorageError

#: One line's JSON (compact, ASCII): one encoder for every line, not one per ``json.dumps``.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode
#: Once every intent is closed, a journal longer than this is emptied.
COMPACT_BYTES = 256 * 1024
#: Intents opened by this process and not closed, across every journal object (a
#: workspace may have several changelog objects in one process: the service's and the
#: registry's): live work, never a crash's leftovers.
_LIVE: set[str] = set()


@cache
def _me() -> tuple[int, str]:
    return os.getpid(), _started(os.getpid()) or ""


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), or None when it is gone:
    with its pid, a process's identity (a pid alone is reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # dead, not yet reaped by its parent
        return None
    return fields[19].decode()


def staged_temp(path: str, token: str) -> str:
    """The workspace-relative name of the temporary a staged write of ``path`` with
    ``token`` uses (the agent's naming, :mod:`sandbox.agent.write`)."""
    head, name = posixpath.split(path)
    return posixpath.join(head, f".{name[:100]}.loom-{token}.tmp")


def release(intent_id: str | None) -> None:
    """The work of ``intent_id`` ended without its changes being recorded (its command
    raised: the sandbox lost, the call's deadline): the intent becomes an orphan, which
    the next use of the changelog reconciles. No-op for None."""
    if intent_id is not None:
        _LIVE.discard(intent_id)


@dataclass
class Intent:
    """One open intent: ``kind`` is "command", "process" (a background process) or
    "stage" (a staged write: ``temp`` is its temporary's workspace-relative path)."""

    id: str
    kind: str
    record: dict[str, Any] = field(default_factory=dict)
    temp: str | None = None
    ts: float = 0.0
    #: The process that opened it: (pid, start time).
    owner: tuple[int, str] = (0, "")

    def orphaned(self) -> bool:
        """No live work owns it: its process is gone, or it is this process and the work
        ended without closing it."""
        if self.id in _LIVE:
            return False
        pid, started = self.owner
        return (pid, started) == _me() or _started(pid) != started


class IntentJournal:
    """The journal file ``path`` (created on first use, mode 0600)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = -1  # the size after our last write or read (-1: never read)
        self._open: dict[str, Intent] = {}
        #: Our own lines not read back yet: :meth:`start` and :meth:`end` applied them when
        #: written, so reading them back only skips them (no JSON decode, two a command).
        self._mine: set[bytes] = set()

    def _file(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as e:
                raise ChangelogStorageError(f"cannot open the changelog's intent journal {self.path}: {e}") from e
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, line: dict[str, Any]) -> None:
        data = (_encode(line) + "\n").encode()
        fd = self._file()
        self.refresh()  # another process's lines first, so our view stays whole
        try:
            n = os.write(fd, data)
            after = os.fstat(fd).st_size
        except OSError as e:
            raise ChangelogStorageError(f"cannot write the changelog's intent journal {self.path}: {e}") from e
        if n != len(data):  # a full disk cut it: that start never counts
            raise ChangelogStorageError(f"cannot write the changelog's intent journal {self.path}: disk full")
        if after == self._size + n:
            # The file grew by our line alone: nothing of another process's came between
            # our read and our write, so there is nothing to read back (a pread less).
            self._size = after
        else:
            # Our own line is read back by the next refresh (with O_APPEND another's may
            # have landed before it, and that one is read as any), and only skipped there.
            self._mine.add(data[:-1])

    def refresh(self) -> None:
        """Read what other processes appended since we last looked. Raises
        ChangelogStorageError."""
        fd = self._file()
        try:
            size = os.fstat(fd).st_size
            if size == self._size:
                return
            whole = size < self._size or self._size < 0  # first look, or emptied by another process
            if whole:
                self._open.clear()
                start = 0
            else:
                start = self._size
            raw = os.pread(fd, size - start, start)
        except OSError as e:
            raise ChangelogStorageError(f"cannot read the changelog's intent journal {self.path}: {e}") from e
        self._size = start + len(raw)
        mine = self._mine
        for text in raw.split(b"\n"):
            if not text:
                continue
            if text in mine:
                mine.discard(text)
                if not whole:  # (read whole, the view is rebuilt: ours count as anyone's)
                    continue
            try:
                line = json.loads(text)
            except ValueError:
                continue  # torn by a crash, or empty
            if not isinstance(line, dict) or not isinstance(line.get("id"), str):
                continue
            if line.get("op") == "start":
                owner = line.get("owner")
                self._open[line["id"]] = Intent(
                    line["id"],
                    str(line.get("kind") or "command"),
                    dict(line.get("record") or {}),
                    line.get("temp") if isinstance(line.get("temp"), str) else None,
                    float(line.get("ts") or 0.0),
                    (int(owner[0]), str(owner[1])) if isinstance(owner, list) and len(owner) == 2 else (0, ""),
                )
            elif line.get("op") == "end":
                self._open.pop(line["id"], None)
        if whole:
            mine.clear()  # (what of ours is not in the file is gone from it)

    def start(self, kind: str, record: dict[str, Any] | None = None, *, temp: str | None = None, ts: float) -> str:
        """Append an open intent; returns its id. Raises ChangelogStorageError (then the
        work must not start)."""
        intent_id = secrets.token_hex(8)
        line: dict[str, Any] = {"op": "start", "id": intent_id, "kind": kind, "ts": ts, "owner": list(_me())}
        if record:
            line["record"] = {k: v for k, v in record.items() if v is not None}
        if temp is not None:
            line["temp"] = temp
        self._append(line)
        self._open[intent_id] = Intent(intent_id, kind, dict(line.get("record") or {}), temp, ts, _me())
        _LIVE.add(intent_id)
        return intent_id

    def end(self, intent_id: str) -> bool:
        """Close an intent (its changes are recorded, or it changed nothing). Never
        raises: when the line cannot be written (a full disk) the intent stays open and is
        reconciled at the next use, which then finds nothing more to record. Returns
        whether it was closed."""
        _LIVE.discard(intent_id)
        try:
            self.refresh()
            if intent_id not in self._open:
                return True
            self._append({"op": "end", "id": intent_id})
        except ChangelogStorageError:
            return False
        self._open.pop(intent_id, None)
        if not self._open and self._size > COMPACT_BYTES:
            try:
                os.ftruncate(self._file(), 0)
                self._size = 0
                self._open.clear()
                self._mine.clear()
            except (OSError, ChangelogStorageError):
                pass  # only its length: a longer file is read once per process
        return True

    def orphans(self) -> list[Intent]:
        """Open intents no live work owns (a crash's), oldest first. Raises
        ChangelogStorageError."""
        self.refresh()
        if not self._open:
            return []
        return sorted((i for i in self._open.values() if i.orphaned()), key=lambda i: i.ts)

    def abandon(self, intent_id: str) -> None:
        """This process gives up an intent of its own without closing it (its work's
        changes could not be recorded): it becomes an orphan, reconciled next."""
        _LIVE.discard(intent_id)
