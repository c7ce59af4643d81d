"""The call journal: every tool call of a workspace, one JSON line each, on the host.

Calls reach a workspace from several processes (the service, the CLI, the Python API, an
MCP server), so the history lives where all of them can write it: next to the changelog,
``$LOOM_DATA_DIR/workspaces/<hash>/calls/``, out of every sandbox's reach. It is written
by :meth:`worker.registry.ToolRegistry.execute` after each call and read by
``GET /v1/workspaces/{id}/calls`` (and its live stream, :mod:`worker.calls.reader`).

Layout and cursors. The journal is a few *segments*, ``<base>.jsonl``, where ``base`` is
the journal-wide byte offset of the segment's first byte (16 digits). A call's *cursor*
is the offset of its line's first byte: it grows with every call, stays valid across
rotation, and lets a reader seek straight to a page (``before``) or resume a stream
(``after``) without counting lines. When the newest segment is full a writer starts the
next one at ``base + size`` and removes the oldest beyond the journal's budget, so the
journal is bounded (:data:`DEFAULT_BYTES` per workspace).

Writing. A record is built and appended just *after* the call, not in it: ``record``
only queues the call's values (a few hundred nanoseconds) and the event loop's next turn
writes what is queued (``flush``), after the caller had its result (the HTTP service has
sent its answer by then). Measured inside a call on this machine, building and writing a
record costs about 40 µs (a fifth of a ``read_file``), so it is kept off the call's
latency; ``flush`` also runs at :meth:`close`, and at once where no loop runs. A write is
one ``write`` of whole lines on an ``O_APPEND`` descriptor (the kernel keeps concurrent
appends whole), bracketed by a shared ``flock`` and an ``fstat``; no fsync (the journal is
a history to look at, not a record to recover from). Rotation takes the lock exclusively
and *seals* the full segment (mode 0400), so a writer of another process that still holds
it sees the seal in its ``fstat`` and moves on, and a line can never land in a segment
after the next one began. These few syscalls on a local file run on the event loop:
handing them to a thread would cost more than they do.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sandbox.logs import get_logger

from ..changelog.recorder import workspace_dir
from ..result import ToolResult, json_line
from .brief import call_record
from .outputs import brief_outputs

log = get_logger("worker.calls")

#: Directory of the journal inside a workspace's data directory.
DIRNAME = "calls"
SUFFIX = ".jsonl"
#: The journal's budget per workspace (about 40,000 calls).
DEFAULT_BYTES = 16 << 20
#: Segments the budget is split into (the oldest is dropped whole).
SEGMENTS = 8
#: Workspaces whose descriptors stay open in one process (the least recent are closed).
MAX_OPEN = 128
_SEALED = 0o400
_OPEN_MODE = 0o600


def journal_dir(data_dir: Path, root: Path) -> Path:
    """Where ``root``'s journal lives (``root`` is made a real path first)."""
    return workspace_dir(data_dir, root) / DIRNAME


def segment_name(base: int) -> str:
    return f"{base:016d}{SUFFIX}"


def segments(directory: Path) -> list[int]:
    """The bases of the journal's segments, oldest first ([] when there is none)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        stem = name[: -len(SUFFIX)]
        if name.endswith(SUFFIX) and len(stem) == 16 and stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def is_sealed(mode: int) -> bool:
    """A full segment (no writer may append to it any more)."""
    return not mode & 0o200


class _Open:
    """One workspace's journal as this process writes it."""

    __slots__ = ("base", "directory", "fd", "lock")

    def __init__(self, directory: Path, lock: int, fd: int, base: int) -> None:
        self.directory = directory
        self.lock = lock
        self.fd = fd
        self.base = base

    def close(self) -> None:
        for fd in (self.fd, self.lock):
            with contextlib.suppress(OSError):
                os.close(fd)


class CallJournal:
    """The call journals of the workspaces under one data directory (this process's
    writer, shared by every workspace). ``max_bytes=0`` records nothing."""

    def __init__(self, data_dir: Path, *, max_bytes: int = DEFAULT_BYTES, segments: int = SEGMENTS) -> None:
        self.data_dir = Path(data_dir)
        self.max_bytes = max_bytes
        self.keep = max(2, segments)
        self.segment_bytes = max(4096, max_bytes // self.keep)
        self._open: dict[Path, _Open] = {}
        self._mutex = threading.Lock()  # one registry per loop, but a journal may be shared
        self._listeners: dict[Path, list[Callable[[], None]]] = {}
        self._failed_once = False
        self._pending: list[tuple[Any, ...]] = []  # calls queued by record(), written by flush()
        self._queue_lock = threading.Lock()
        self._scheduled = False

    def directory(self, root: Path) -> Path:
        return journal_dir(self.data_dir, root)

    # -- writing ---------------------------------------------------------------------------

    def record(
        self,
        workspace: Path | str,
        tool: str,
        arguments: Mapping[str, Any] | str | None,
        result: ToolResult,
        duration_ms: float,
        *,
        call_id: str | None,
        subtask_id: str | None,
        root: Path | None = None,
    ) -> None:
        """Queue one finished call for ``workspace``'s journal (``root``: its real path,
        when the caller knows it); it is written at the event loop's next turn (at once
        without a running loop). Never raises: a history that cannot be written must not
        fail the call (the structured log still has it)."""
        if self.max_bytes <= 0:
            return
        # A shallow copy: the caller may reuse its dict; only top-level values are shown.
        args = dict(arguments) if isinstance(arguments, Mapping) else arguments
        item = (workspace, root, tool, args, result, duration_ms, call_id, subtask_id, time.time())
        with self._queue_lock:
            self._pending.append(item)
            if self._scheduled:
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            self._scheduled = loop is not None
        if loop is None:
            self.flush()
        else:
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every queued call (one ``write`` per workspace). Never raises."""
        with self._queue_lock:
            pending, self._pending = self._pending, []
            self._scheduled = False
        lines: dict[Path, list[bytes]] = {}
        for workspace, root, tool, args, result, duration_ms, call_id, subtask_id, finished in pending:
            try:
                if root is None:
                    root = Path(workspace).expanduser().resolve()
                    if not root.is_dir():
                        continue  # no such workspace: nothing to attach a history to
                rec = call_record(
                    tool, args, result, duration_ms, call_id=call_id, subtask_id=subtask_id, finished=finished
                )
                outputs = brief_outputs(result)
                if outputs is not None:  # an execution of code: what it showed, bounded
                    rec["outputs"] = outputs
                lines.setdefault(root, []).append((json_line(rec) + "\n").encode())
            except Exception as e:  # a bug: logged once per process, never raised
                self._failed(e)
        for root, batch in lines.items():
            try:
                self.append(root, b"".join(batch))
            except Exception as e:  # a full disk, a directory that cannot be made
                self._failed(e)

    def _failed(self, e: Exception) -> None:
        if not self._failed_once:
            self._failed_once = True
            log.warning("calls.journal_failed", error=f"{type(e).__name__}: {e}"[:300])

    def append(self, root: Path, line: bytes) -> None:
        """Append complete lines (each ending in a newline) to ``root``'s journal and tell
        its listeners. Raises OSError."""
        with self._mutex:
            cur = self._open.get(root)
            if cur is None:
                cur = self._open_current(root)
            for _ in range(8):
                fcntl.flock(cur.lock, fcntl.LOCK_SH)
                try:
                    st = os.fstat(cur.fd)
                    if not is_sealed(st.st_mode) and (st.st_size == 0 or st.st_size + len(line) <= self.segment_bytes):
                        os.write(cur.fd, line)
                        break
                finally:
                    fcntl.flock(cur.lock, fcntl.LOCK_UN)
                cur = self._rotate(cur, len(line))
            else:  # pragma: no cover - eight rotations racing past one line
                raise OSError("the call journal kept rotating under this writer")
        for listener in self._listeners.get(root, ()):
            listener()

    def _open_current(self, root: Path) -> _Open:
        directory = self.directory(root)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _OPEN_MODE)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                fd, base = self._newest(directory, 0)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        except BaseException:
            os.close(lock)
            raise
        cur = _Open(directory, lock, fd, base)
        self._open[root] = cur
        if len(self._open) > MAX_OPEN:
            oldest = next(iter(self._open))
            self._open.pop(oldest).close()
        return cur

    def _newest(self, directory: Path, need: int) -> tuple[int, int]:
        """The newest segment open for appending, made when there is none or it has no
        room for ``need`` more bytes (the caller holds the lock exclusively)."""
        bases = segments(directory)
        if bases:
            base = bases[-1]
            path = directory / segment_name(base)
            st = os.stat(path)
            if is_sealed(st.st_mode) or (st.st_size > 0 and st.st_size + need > self.segment_bytes):
                os.chmod(path, _SEALED)
                base += st.st_size
            else:
                return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC), base
        else:
            base = 0
        fd = os.open(directory / segment_name(base), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, _OPEN_MODE)
        for old in bases[: max(0, len(bases) + 1 - self.keep)]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / segment_name(old))
        return fd, base

    def _rotate(self, cur: _Open, need: int) -> _Open:
        """Move ``cur`` to the newest segment, starting one when it has no room."""
        fcntl.flock(cur.lock, fcntl.LOCK_EX)
        try:
            fd, base = self._newest(cur.directory, need)
        finally:
            fcntl.flock(cur.lock, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(cur.fd)
        cur.fd, cur.base = fd, base
        return cur

    # -- listeners -------------------------------------------------------------------------

    def subscribe(self, root: Path, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` (on the writer's thread, right after the write) whenever
        this process appends to ``root``'s journal; returns the function that stops it.
        Calls made by other processes are seen by polling (:class:`~.reader.Tail`)."""
        root = Path(os.path.realpath(root))
        self._listeners.setdefault(root, []).append(listener)

        def unsubscribe() -> None:
            found = self._listeners.get(root, [])
            with contextlib.suppress(ValueError):
                found.remove(listener)
            if not found:
                self._listeners.pop(root, None)

        return unsubscribe

    def close(self) -> None:
        """Write what is queued, then close the open descriptors."""
        self.flush()
        with self._mutex:
            for cur in self._open.values():
                cur.close()
            self._open.clear()
