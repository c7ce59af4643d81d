"""An inotify watch of a workspace's directories for the guard's walk: which directories
had an entry made, removed or renamed, or a file's mode, owner or extended attributes
changed, since the last look, so that the walk lists those and skips what did not change.

It only ever narrows what a walk visits. On any doubt it answers "unknown" and the walk
visits every directory, as it does without a watch: an event queue that overflowed, a
directory renamed (its watch's path is stale), an inotify instance or watch the kernel
refuses (``fs.inotify.max_user_instances`` and ``max_user_watches`` are per user; the
watch is then dropped for good and the walk is as before).

Every guard of the process shares one inotify instance (:class:`_Instance`): the kernel
gives a user 128 instances by default, counted with the sandboxes' own (their agents'
watches, the commands' file watchers, under the same uid), and an instance per workspace
had 32 workspaces watched at most (a quarter of them), every other one walked whole after
each command. Whichever guard looks first reads the queue for all and files each event
with the watches of its directory; a queue that overflowed is every guard's doubt.

inotify sees what a sandbox does to the workspace: under runc its processes change the
host's own inodes, and under gVisor its gofer makes the changes on the host. (Our own
binding through ctypes: the standard library has none, and a watch library would bring
threads and callbacks where three system calls and a read do.)
"""

from __future__ import annotations

import contextlib
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
#: The share of the user's inotify watches (``fs.inotify.max_user_watches``, counted per
#: user across the host: the sandboxes' agents of the same uid and every other program draw
#: on them too) this process's guards may take; a guard that finds none left walks.
SHARE = 0.25


class _Budget:
    """What this process's guards may still take of the user's inotify watches (read from
    /proc/sys once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watches = int(_limit("max_user_watches", 8192) * SHARE)

    def take(self) -> bool:
        with self.lock:
            if self.watches <= 0:
                return False
            self.watches -= 1
            return True

    def give(self, n: int = 1) -> None:
        with self.lock:
            self.watches += n


def _limit(name: str, default: int) -> int:
    try:
        with open(f"/proc/sys/fs/inotify/{name}") as f:
            return int(f.read())
    except (OSError, ValueError):
        return default


_budget = _Budget()


class _Owner:
    """One :class:`DirWatch`'s share of the instance: its watch descriptors and the
    directories they were added for, and what the queue said of them since its last look."""

    __slots__ = ("complete", "dirty", "rel")

    def __init__(self) -> None:
        self.rel: dict[int, str] = {}  # watch descriptor -> the directory it was added for
        self.dirty: set[str] = set()
        self.complete = True


class _Instance:
    """The process's inotify instance: its descriptor and, per watch descriptor, the
    owners that watch that directory (two workspaces, one inside the other, watch the
    same inodes: the kernel gives an inode one descriptor per instance)."""

    def __init__(self, fd: int, lib: ctypes.CDLL) -> None:
        self.fd = fd
        self.lib = lib
        self.owners: dict[int, list[_Owner]] = {}
        self.live: set[_Owner] = set()
        #: In a forked child: the descriptor was the parent's queue (closed here), so its
        #: watches doubt everything and are never read or removed from the child.
        self.forked = False


#: Guards its state (the instance's and every owner's): guards look from several threads.
_lock = threading.Lock()
_shared: list[_Instance] = []
#: Owners of watches dropped without close (their DirWatch collected), released under the
#: lock by the next caller (``__del__`` may run anywhere, also while this thread holds it).
_dropped: list[_Owner] = []


def _after_fork_in_child() -> None:
    """A forked child holds its parent's queue (the same open instance: a watch it removed
    would be the parent's): it never reads it or removes a watch from it. The guards it
    inherited doubt everything from now on (the walk visits every directory and drops its
    watch) and its next watch gets an instance of its own. The lock is made anew: another
    thread of the parent may have held it at the fork."""
    global _lock
    _lock = threading.Lock()
    for inst in _shared:
        inst.forked = True
        with contextlib.suppress(OSError):
            os.close(inst.fd)
    _shared.clear()
    _dropped.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _instance() -> _Instance | None:
    """The process's instance, made at first use; None when inotify is not there or the
    kernel refuses one. Called with the lock held."""
    if _shared:
        return _shared[0]
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        fd = lib.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, AttributeError):
        fd = -1
    if fd < 0:
        log.info("workspace.guard_unwatched", reason="no inotify instance")
        return None
    _shared[:] = [_Instance(fd, lib)]
    return _shared[0]


def _release(inst: _Instance, owner: _Owner) -> None:
    """Take ``owner``'s watches off the instance (a directory no other owner watches is
    no longer watched) and give them back to the budget. Called with the lock held."""
    for wd in () if inst.forked else owner.rel:
        owners = inst.owners.get(wd)
        if owners is None:
            continue
        if owner in owners:
            owners.remove(owner)
        if not owners:
            del inst.owners[wd]
            # (EINVAL when the directory is gone and its IN_IGNORED not read yet: nothing to do)
            inst.lib.inotify_rm_watch(inst.fd, wd)
    _budget.give(len(owner.rel))
    owner.rel.clear()
    inst.live.discard(owner)


def _drain(inst: _Instance) -> None:
    """Read what the queue holds and file each event with the owners of its directory.
    Called with the lock held."""
    while _dropped:
        _release(inst, _dropped.pop())
    while True:
        try:
            data = os.read(inst.fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            for o in inst.live:
                o.complete = False
            return
        if not data:
            return
        at = 0
        while at + _EVENT.size <= len(data):
            wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
            at += _EVENT.size + size
            if mask & IN_Q_OVERFLOW:
                for o in inst.live:
                    o.complete = False
                continue
            owners = inst.owners.get(wd)
            if owners is None:
                continue
            if mask & IN_IGNORED:
                del inst.owners[wd]
            moved = bool(mask & IN_MOVE_SELF or (mask & IN_ISDIR and mask & (IN_MOVED_FROM | IN_MOVED_TO)))
            for o in owners:
                rel = o.rel.pop(wd, None) if mask & IN_IGNORED else o.rel.get(wd)
                if rel is None:
                    continue
                if mask & IN_IGNORED:
                    _budget.give()
                if moved:
                    o.complete = False  # the watches below it now have other paths
                o.dirty.add(rel)


class DirWatch:
    """One workspace's watches on the process's inotify instance: :meth:`watch` each
    directory as the walk opens it, :meth:`changes` at the next walk. Safe from any
    thread (one workspace's guard holds its own lock around a walk anyway)."""

    def __init__(self, inst: _Instance) -> None:
        self._inst = inst
        self._owner: _Owner | None = _Owner()
        inst.live.add(self._owner)

    @classmethod
    def open(cls) -> DirWatch | None:
        """A new watch, or None when inotify is not there or the kernel refuses the
        process its instance."""
        with _lock:
            inst = _instance()
            return None if inst is None else cls(inst)

    def watch(self, dir_fd: int, rel: str) -> bool | None:
        """Watch the open directory ``dir_fd`` (workspace-relative ``rel``) from now on.
        True when it was watched at that path already (the kernel gives an inode it watches
        its descriptor again: the very directory, not one made anew at the path), False when
        it is watched now, None when the kernel refuses (no watch left)."""
        if not _budget.take():
            log.info("workspace.guard_unwatched", reason="the process's share of inotify watches is taken", path=rel)
            return None
        inst = self._inst
        with _lock:
            owner = self._owner
            if owner is None or inst.forked:
                _budget.give()
                return None
            # Through the descriptor's /proc link: the very directory the walk opened,
            # whatever its path has become (inotify_add_watch takes only a path).
            wd = inst.lib.inotify_add_watch(inst.fd, f"/proc/self/fd/{dir_fd}".encode(), MASK)
            if wd < 0:
                _budget.give()
                log.info("workspace.guard_unwatched", reason=os.strerror(ctypes.get_errno()), path=rel)
                return None
            known = owner.rel.get(wd)
            if known is not None:
                _budget.give()  # (this owner's watch of this inode, taken once)
            else:
                owners = inst.owners.setdefault(wd, [])
                if owner not in owners:
                    owners.append(owner)
            owner.rel[wd] = rel
            return known == rel

    def changes(self) -> tuple[set[str], bool]:
        """The directories that had an event since the last call (workspace-relative), and
        whether that is all (False after an overflow or a directory renamed: every
        directory must then be visited, and watched again; the directories named still had
        events, which a walk comparing directories alone would miss: a mode set in place)."""
        with _lock:
            owner = self._owner
            if owner is None or self._inst.forked:
                return set(), False
            _drain(self._inst)
            dirty, complete = owner.dirty, owner.complete
            owner.dirty = set()
            owner.complete = True
            return dirty, complete

    def close(self) -> None:
        """Give this workspace's watches back (idempotent)."""
        with _lock:
            owner, self._owner = self._owner, None
            if owner is not None:
                _release(self._inst, owner)

    def __del__(self) -> None:
        # (a guard dropped without close: its watches go back at the next look of any guard)
        owner = getattr(self, "_owner", None)
        if owner is not None:
            _dropped.append(owner)
