"""Change scans of a gVisor sandbox's workspace, run on the host.

The changelog finds what a shell command changed by a stat scan of the workspace before
and after it. Inside gVisor (ptrace platform) every system call of the agent is
intercepted and every stat goes to the gofer: a walk of a 10,000-file workspace takes
seconds, twice per command. And gVisor's inotify does not see edits made on the host side
of the bind mount, so the agent cannot keep an event-driven snapshot either.

The host can: the workspace is a host directory, and the sandbox's writes reach it
through the gofer as ordinary host writes. So for gVisor sandboxes the scan runs here,
with the agent's own code (``sandbox.agent.scan.scan_tree``: a stat-only walk from a
directory descriptor, opening each subdirectory with O_NOFOLLOW relative to its parent,
never following a link, plus an inotify snapshot), on the host kernel. Only metadata
(names, types, sizes, mtimes, inodes, modes) is read here; file contents are still read
through the agent, never from host paths.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path
from typing import Any

from .agent import paths, scan, tree

#: Hard-linked files (re-stat'ed at every scan) beyond which a quiet scan still goes to a
#: thread (:meth:`HostScanner.scan_if_quiet`): a stat each, on the event loop.
QUIET_MULTI_MAX = 64


class HostScanner:
    """The scans of one workspace, on the host. Thread-safe; blocking (use a thread).

    ``mounted``: the workspace is a mount the engine makes while the sandbox runs (a fork's
    overlay volume, ``sandbox.docker.overlays``). Its path is then a bare directory while
    the sandbox is stopped: a scan of it would see an empty tree, and its inotify watches
    would sit on the bare directory under the overlay, silent whatever the sandbox does
    (the changelog would miss every command's changes). So such a root is scanned only
    while it is a mount point, and snapshots of another mount than the current one are
    dropped (the engine mounts it afresh at each start)."""

    def __init__(self, root: Path, *, mounted: bool = False) -> None:
        self.root = root
        self.mounted = mounted
        self._snapshots: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._root_ident: tuple[int, int] | None = None  # the root's (device, inode) when the snapshots were made

    def _open_root(self) -> int:
        """A descriptor of the root (not following a link). Raises OSError, and for a
        ``mounted`` root that is not mounted now, OSError(ENOTCONN): the agent answers
        instead, which starts the sandbox and so has the engine mount it."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        if not self.mounted:
            return fd
        try:
            dev = os.fstat(fd).st_dev
            if dev == os.stat(self.root.parent).st_dev:
                raise OSError(errno.ENOTCONN, "the workspace's overlay is not mounted (its sandbox is stopped)")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def scan(self, req: dict[str, Any]) -> dict[str, Any]:
        """Answer a ``scan`` request (the agent's format) for the workspace root.

        ``watched`` is always False in the answer: the agent in the sandbox has no such
        snapshot, so the changelog must not send the scan along with a command.
        Raises OSError (workspace gone or unreadable, or a ``mounted`` root not mounted);
        the caller then asks the agent instead. Any depth is walked (``sandbox.agent.dirstack``).
        """
        fd = self._open_root()
        try:
            with self._lock:
                st = os.fstat(fd)
                ident = (st.st_dev, st.st_ino)
                # Another mount, or another directory at the root's path (a gVisor warm
                # sandbox's moved into place, sandbox.docker.slots): the watches see
                # nothing of this one.
                if ident != self._root_ident:
                    for snap in self._snapshots.values():
                        snap.close()
                    self._snapshots.clear()
                    self._root_ident = ident
                result = scan.scan_tree(fd, "", req, self._snapshots, True)
        finally:
            os.close(fd)
        result["watched"] = False
        return result

    def scan_if_quiet(self, req: dict[str, Any]) -> dict[str, Any] | None:
        """:meth:`scan`'s answer when it is a handful of system calls, else None (then
        :meth:`scan` in a thread). It is when the request's snapshot is current and inotify
        has queued nothing since: the answer is "nothing changed", the commonest one (most
        commands change nothing), and a thread's hand-off (~0.3-0.4 ms on a busy gVisor
        host, twice per command) cost far more than it. Never blocks on another scan (its
        lock is only tried); raises nothing (None instead)."""
        key = req.get("snapshot")
        if not key or req.get("walk") or not self._lock.acquire(blocking=False):
            return None
        try:
            snap = self._snapshots.get(key)
            if snap is None or not snap.quiet(scan.params_of(req), req.get("since"), QUIET_MULTI_MAX):
                return None
            fd = self._open_root()
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != self._root_ident:
                    return None  # another directory at the path: scan() starts over
                result = scan.scan_tree(fd, "", req, self._snapshots, True)
            finally:
                os.close(fd)
        except OSError:
            return None
        finally:
            self._lock.release()
        result["watched"] = False
        return result

    def remove_tree(self, path: str) -> tuple[bool, list[int]]:
        """Remove workspace-relative ``path`` with everything in it (the changelog's undo of
        a tree a command made), on the host: in the sandbox every unlink of a 20,000-file
        ``node_modules`` pays gVisor's system-call interception (~4 s), here ~0.5 s. The
        agent's own code does it (``sandbox.agent.tree.rmtree_at``: each level opened
        O_NOFOLLOW from its parent's descriptor, a link unlinked as a link, never entered),
        starting from a descriptor of the workspace reached without following any link.

        Returns (removed, [files, dirs, bytes]). Raises ValueError for a path that is not a
        plain relative one or goes through a link (the agent, which resolves in-workspace
        links, answers then), OSError (the caller then asks the agent).
        """
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"not a plain workspace-relative path: {path!r}")
        root = self._open_root()
        try:
            parent = paths.open_below(root, "/".join(parts[:-1]))
        finally:
            os.close(root)
        if parent is None:
            raise ValueError(f"{path!r} goes through a link or a missing directory")
        counts = [0, 0, 0]
        try:
            try:
                st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return False, counts
            if stat.S_ISDIR(st.st_mode):
                tree.rmtree_at(parent, parts[-1], counts)
            else:
                os.unlink(parts[-1], dir_fd=parent)
                counts[0] += 1
                counts[2] += st.st_size if stat.S_ISREG(st.st_mode) else 0
        finally:
            os.close(parent)
        return True, counts

    def close(self) -> None:
        """Release the inotify instances."""
        with self._lock:
            for snap in self._snapshots.values():
                snap.close()
            self._snapshots.clear()
