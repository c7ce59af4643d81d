"""An inotify watch of a workspace's directories for the guard's walk: which directories
had an entry made, removed or renamed, or a file's mode, owner or extended attributes
changed, since the last look, so that the walk lists those and skips what did not change.

It only ever narrows what a walk visits. On any doubt it answers "unknown" and the walk
visits every directory, as it does without a watch: an event queue that overflowed, a
directory renamed (its watch's path is stale), an inotify instance or watch the kernel
refuses (``fs.inotify.max_user_instances`` and ``max_user_watches`` are per user; the
watch is then dropped for good and the walk is as before).

inotify sees what a sandbox does to the workspace: under runc its processes change the
host's own inodes, and under gVisor its gofer makes the changes on the host. (Our own
binding through ctypes: the standard library has none, and a watch library would bring
threads and callbacks where three system calls and a read do.)
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

from sandbox.agent.fswatch import (  # (the kernel's inotify flags, as the agent's watch names them)
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
)
from sandbox.logs import get_logger

log = get_logger("worker.guard")

#: A file's content changing is nothing to the guard (it looks at modes, device nodes,
#: capabilities and which directories git could take for its own; git's configs and hooks
#: are looked at on every check anyway), so writes make no events here.
MASK = IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_EVENT = struct.Struct("iIII")
#: The share of the user's inotify instances and watches (``fs.inotify.max_user_*``, counted
#: per user across the host: the sandboxes' agents of the same uid and every other program
#: draw on them too) this process's guards may take; a guard that finds none left walks.
SHARE = 0.25


class _Budget:
    """What this process's guards may still take of the user's inotify instances and
    watches (read from /proc/sys once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instances = int(_limit("max_user_instances", 128) * SHARE)
        self.watches = int(_limit("max_user_watches", 8192) * SHARE)

    def take(self, what: str) -> bool:
        with self.lock:
            if getattr(self, what) <= 0:
                return False
            setattr(self, what, getattr(self, what) - 1)
            return True

    def give(self, what: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + n)


def _limit(name: str, default: int) -> int:
    try:
        with open(f"/proc/sys/fs/inotify/{name}") as f:
            return int(f.read())
    except (OSError, ValueError):
        return default


_budget = _Budget()


class DirWatch:
    """One workspace's inotify instance: :meth:`watch` each directory as the walk opens
    it, :meth:`changes` at the next walk. Not thread-safe (the guard's lock holds it)."""

    def __init__(self, fd: int, lib: ctypes.CDLL) -> None:
        self._fd = fd
        self._lib = lib
        self._rel: dict[int, str] = {}  # watch descriptor -> the directory it was added for

    @classmethod
    def open(cls) -> DirWatch | None:
        """A new watch, or None when inotify is not there or no instance is left (of the
        process's :data:`SHARE` or the kernel's)."""
        if not _budget.take("instances"):
            return None
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            fd = lib.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            fd = -1
        if fd < 0:
            _budget.give("instances")
            log.info("workspace.guard_unwatched", reason="no inotify instance")
            return None
        return cls(fd, lib)

    def watch(self, dir_fd: int, rel: str) -> bool | None:
        """Watch the open directory ``dir_fd`` (workspace-relative ``rel``) from now on.
        True when it was watched at that path already (the kernel gives an inode it watches
        its descriptor again: the very directory, not one made anew at the path), False when
        it is watched now, None when the kernel refuses (no watch left)."""
        # Through the descriptor's /proc link: the very directory the walk opened, whatever
        # its path has become (inotify_add_watch takes only a path).
        if not _budget.take("watches"):
            log.info("workspace.guard_unwatched", reason="the process's share of inotify watches is taken", path=rel)
            return None
        wd = self._lib.inotify_add_watch(self._fd, f"/proc/self/fd/{dir_fd}".encode(), MASK)
        if wd < 0:
            _budget.give("watches")
            log.info("workspace.guard_unwatched", reason=os.strerror(ctypes.get_errno()), path=rel)
            return None
        known = self._rel.get(wd)
        if known is not None:
            _budget.give("watches")  # (the kernel's watch of this inode, taken once)
        self._rel[wd] = rel
        return known == rel

    def changes(self) -> tuple[set[str], bool]:
        """The directories that had an event since the last call (workspace-relative), and
        whether that is all (False after an overflow or a directory renamed: every
        directory must then be visited, and watched again; the directories named still had
        events, which a walk comparing directories alone would miss: a mode set in place)."""
        dirty: set[str] = set()
        unknown = False
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                return dirty, False
            if not data:
                break
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                at += _EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    unknown = True
                    continue
                if mask & IN_IGNORED:
                    rel = self._rel.pop(wd, None)
                    if rel is not None:
                        _budget.give("watches")
                else:
                    rel = self._rel.get(wd)
                if rel is None:
                    continue
                if mask & IN_MOVE_SELF or (mask & IN_ISDIR and mask & (IN_MOVED_FROM | IN_MOVED_TO)):
                    unknown = True  # the watches below it now have other paths
                dirty.add(rel)
        return dirty, not unknown

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            _budget.give("watches", len(self._rel))
            _budget.give("instances")
            self._rel.clear()

    def __del__(self) -> None:
        self.close()  # (a guard dropped without close: its instance goes back)
