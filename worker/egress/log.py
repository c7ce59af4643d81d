"""The record of every egress attempt of a workspace, on the host.

One JSON line per attempt (a connection, a plain-HTTP request, a name lookup) in
``$LOOM_DATA_DIR/workspaces/<hash>/egress.jsonl``, next to the changelog and settings and
as far out of the sandbox's reach: what was asked (host, port), what the gateway did
(verdict and reason, the address it resolved and connected to) and what went through
(bytes each way, duration). The file is rotated at :data:`MAX_BYTES` (one old file is
kept), so it stays bounded however much a sandbox tries.

Several worker processes may serve one workspace over time; each appends whole lines
with one ``write`` on an ``O_APPEND`` descriptor, which the kernel keeps whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..changelog.recorder import workspace_dir

LOG_FILE = "egress.jsonl"
MAX_BYTES = 8 << 20

Verdict = Literal["allowed", "denied", "limited", "error"]
Kind = Literal["connect", "http", "transparent", "dns", "secret"]


@dataclass
class EgressRecord:
    """One attempt. ``verdict``: allowed (it went through), denied (policy or address),
    limited (a per-workspace limit), error (allowed, but the destination failed).

    A ``secret`` record is one use of a secret in an intercepted request (``allowed``: its
    value was sent), or a placeholder that was not substituted (``denied``: sent where the
    secret does not go, or somewhere else than a header value); ``secret`` names it (None
    for a placeholder of no secret of this workspace), with the request's ``method``,
    ``path`` (as the sandbox sent it: placeholders, never values) and answer ``status``."""

    workspace: str
    kind: Kind
    host: str
    port: int
    verdict: Verdict = "denied"
    reason: str = ""
    rule: str | None = None
    address: str | None = None
    bytes_up: int = 0  # sandbox -> destination
    bytes_down: int = 0  # destination -> sandbox
    time: float = field(default_factory=time.time)
    duration_ms: float = 0.0
    secret: str | None = None
    method: str | None = None
    path: str | None = None
    status: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.kind != "secret":  # the log's lines stay as they were for everything else
            for key in ("secret", "method", "path", "status"):
                out.pop(key)
        return out


class EgressLog:
    """The egress log of the workspaces under one data directory."""

    def __init__(self, data_dir: Path, on_record: Callable[[EgressRecord], None] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.on_record = on_record
        self._fds: dict[str, int] = {}

    def path(self, root: Path) -> Path:
        return workspace_dir(self.data_dir, root) / LOG_FILE

    def append(self, root: Path, record: EgressRecord) -> None:
        """Write ``record`` (and tell ``on_record``). Never raises: a log that cannot be
        written must not break the sandbox's connection; the structured log still has it.

        It runs on the event loop: one ``write`` of a line to the page cache takes
        microseconds, less than handing it to a thread would."""
        if self.on_record is not None:
            self.on_record(record)
        line = (json.dumps(record.as_dict(), separators=(",", ":")) + "\n").encode()
        path = self.path(root)
        try:
            fd = self._fds.get(str(path))
            if fd is None or self._rotate(path, fd):
                fd = self._open(path)
            os.write(fd, line)
        except OSError:
            pass

    def _open(self, path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        old = self._fds.pop(str(path), None)
        if old is not None:
            with contextlib.suppress(OSError):
                os.close(old)
        self._fds[str(path)] = fd
        return fd

    def _rotate(self, path: Path, fd: int) -> bool:
        """Rotate a full file; True when ``fd`` no longer is the current file."""
        try:
            st = os.fstat(fd)
            if st.st_size >= MAX_BYTES:
                with contextlib.suppress(FileNotFoundError):
                    os.replace(path, path.with_name(LOG_FILE + ".1"))
                return True
            cur = os.stat(path)
            return (cur.st_ino, cur.st_dev) != (st.st_ino, st.st_dev)  # another process rotated it
        except FileNotFoundError:
            return True

    def read(self, root: Path, *, limit: int = 100, verdict: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` records (newest last), optionally of one verdict. Lines
        that are not JSON (a torn write after a crash) are skipped."""
        out: deque[dict[str, Any]] = deque(maxlen=max(1, limit))
        path = self.path(root)
        for p in (path.with_name(LOG_FILE + ".1"), path):
            try:
                with open(p, "rb") as f:
                    for line in f:
                        try:
                            rec = json.loads(line)
                        except ValueError:
                            continue
                        if isinstance(rec, dict) and (verdict is None or rec.get("verdict") == verdict):
                            out.append(rec)
            except FileNotFoundError:
                continue
        return list(out)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
