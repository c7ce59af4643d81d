"""Reading a call journal (:mod:`worker.calls.journal`): pages, newest first, and a tail.

Both only ever return *complete* lines (a line is written with one ``write``, but a
reader may look in the middle of it), skip a line that is not a record (a torn write on
a full disk), and give each record its ``cursor``: the journal-wide offset of its line.

These are reads of a local file that take microseconds (a page maps the segment instead
of reading it); the HTTP routes call them on the event loop for that reason.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from pathlib import Path
from typing import Any

from .journal import is_sealed, segment_name, segments

#: Most bytes a tail reads at once (the rest is read at its next poll).
TAIL_READ = 1 << 20


def _parse(line: bytes, cursor: int) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict) or "tool" not in rec:
        return None
    rec["cursor"] = cursor
    return rec


def page(directory: Path, *, before: int | None = None, limit: int = 50) -> tuple[list[dict[str, Any]], int | None]:
    """Up to ``limit`` calls whose cursor is below ``before`` (all when None), newest
    first, and the ``before`` of the next page (None when nothing older is left).
    Raises OSError when the journal cannot be read (not for a missing one)."""
    out: list[dict[str, Any]] = []
    bases = segments(directory)
    for i in range(len(bases) - 1, -1, -1):
        base = bases[i]
        if before is not None and base >= before:
            continue
        try:
            fd = os.open(directory / segment_name(base), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # dropped by a rotation just now: older still are gone too
        try:
            size = os.fstat(fd).st_size
            end = size if before is None else min(size, before - base)
            if end <= 0:
                continue
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
                hi = data.rfind(b"\n", 0, end) + 1  # the end of the last complete line
                while hi > 0:
                    lo = data.rfind(b"\n", 0, hi - 1) + 1
                    rec = _parse(data[lo : hi - 1], base + lo)
                    hi = lo
                    if rec is not None:
                        out.append(rec)
                        if len(out) == limit:
                            more = hi > 0 or i > 0
                            return out, rec["cursor"] if more else None
        finally:
            os.close(fd)
    return out, None


def end_cursor(directory: Path) -> int:
    """The offset the next call's line will start at (at least; 0 for an empty journal)."""
    bases = segments(directory)
    if not bases:
        return 0
    try:
        return bases[-1] + os.stat(directory / segment_name(bases[-1])).st_size
    except FileNotFoundError:
        return bases[-1]


def _last_line_end(directory: Path) -> int:
    """The offset just after the journal's last complete line."""
    bases = segments(directory)
    if not bases:
        return 0
    try:
        fd = os.open(directory / segment_name(bases[-1]), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return bases[-1]
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - 65536)
        chunk = os.pread(fd, size - start, start)
    finally:
        os.close(fd)
    return bases[-1] + start + chunk.rfind(b"\n") + 1 if b"\n" in chunk else bases[-1] + start


class Tail:
    """New calls of a journal as they are appended, in order, from any process.

    ``after``: the cursor of the last call the reader has (it gets the ones after it);
    -1 for the whole journal, None for only calls appended from now on. A cursor older
    than the journal's oldest segment starts at the oldest call still kept.
    """

    def __init__(self, directory: Path, after: int | None = None) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._base = -1  # the segment self._fd is open on
        if after is None:
            self.pos = _last_line_end(directory)
            self._align = False
        else:
            self.pos = max(0, after)
            self._align = after >= 0  # skip the line at ``after`` itself

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _segment(self) -> bool:
        """Open the segment holding ``pos``. False when there is none yet."""
        bases = segments(self.directory)
        if not bases:
            return False
        if self.pos < bases[0]:
            self.pos, self._align = bases[0], False  # rotated away: from the oldest kept
        base = max(b for b in bases if b <= self.pos)
        if base == self._base and self._fd is not None:
            return True
        self.close()
        try:
            self._fd = os.open(self.directory / segment_name(base), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        self._base = base
        return True

    def read(self) -> list[dict[str, Any]]:
        """The complete calls appended since the last read (at most about 1 MiB of them).
        Raises OSError when the journal cannot be read (not for a missing one)."""
        out: list[dict[str, Any]] = []
        for _ in range(4):  # at most a few segment boundaries per read
            if not self._segment():
                return out
            assert self._fd is not None
            st = os.fstat(self._fd)
            offset = self.pos - self._base
            if offset > st.st_size:  # the journal was removed and started again
                self.pos, self._align = self._base + st.st_size, False
                offset = st.st_size
            data = os.pread(self._fd, TAIL_READ, offset) if st.st_size > offset else b""
            if self._align:
                nl = data.find(b"\n")
                if nl < 0:
                    return out
                self.pos += nl + 1
                offset += nl + 1
                data = data[nl + 1 :]
                self._align = False
            hi = data.rfind(b"\n") + 1
            lo = 0
            while lo < hi:
                nl = data.index(b"\n", lo)
                rec = _parse(data[lo:nl], self.pos + lo)
                if rec is not None:
                    out.append(rec)
                lo = nl + 1
            self.pos += hi
            if hi < len(data) or not is_sealed(st.st_mode) or self.pos - self._base < st.st_size:
                return out  # more of this segment to come (or being written)
            # A sealed segment read to its end: the next one starts where it ended.
            if not any(b > self._base for b in segments(self.directory)):
                return out
        return out
