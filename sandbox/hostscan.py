"""Change scans of a gVisor sandbox's workspace, run on the host.

The changelog finds what a shell command changed by a stat scan of the workspace before
and after it. Inside gVisor (ptrace platform) every system call of the agent is
intercepted and every stat goes to the gofer: a walk of a 10,000-file workspace takes
seconds, twice per command. And gVisor's inotify does not see edits made on the host side
of the bind mount, so the agent cannot keep an event-driven snapshot either.

The host can: the workspace is a host directory, and the sandbox's writes reach it
through the gofer as ordinary host writes. So for gVisor sandboxes the scan runs here,
with the agent's own code (``scan_tree``: a stat-only walk from a directory descriptor,
opening each subdirectory with O_NOFOLLOW relative to its parent, never following a link,
plus an inotify snapshot), on the host kernel. Only metadata (names, types, sizes,
mtimes, inodes, modes) is read here; file contents are still read through the agent,
never from host paths.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from . import agent


class HostScanner:
    """The scans of one workspace, on the host. Thread-safe; blocking (use a thread)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._snapshots: dict[str, Any] = {}
        self._lock = threading.Lock()

    def scan(self, req: dict[str, Any]) -> dict[str, Any]:
        """Answer a ``scan`` request (the agent's format) for the workspace root.

        ``watched`` is always False in the answer: the agent in the sandbox has no such
        snapshot, so the changelog must not send the scan along with a command.
        Raises OSError (workspace gone or unreadable) and RecursionError (a tree deeper
        than Python's recursion limit); the caller then asks the agent instead.
        """
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with self._lock:
                result = agent.scan_tree(fd, "", req, self._snapshots, True)
        finally:
            os.close(fd)
        result["watched"] = False
        return result

    def close(self) -> None:
        """Release the inotify instances."""
        with self._lock:
            for snap in self._snapshots.values():
                snap.close()
            self._snapshots.clear()
