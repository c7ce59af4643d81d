"""The guard's walk of a workspace: every directory below its root, from descriptors, never
following a link; setuid/setgid bits, device nodes and file capabilities undone on the way;
the directories git could take for a git directory found (see the package docstring)."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass

from sandbox.logs import get_logger

from .dirwatch import DirWatch

log = get_logger("worker.guard")

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SETID = stat.S_ISUID | stat.S_ISGID
_CAPABILITY = "security.capability"
#: Seconds between walks that stat every file again, also in directories that did not change
#: (a mode changed in place: something no sandboxed process can do; this is the second line).
FULL_WALK_EVERY = 60.0
#: The same with a watch of every directory, which sees a mode changed in place (an event of
#: its directory): the whole walk is then only the second line's second line, and on a big
#: tree (a checkout with its virtualenv: ~0.25 s) a command pays for it this seldom.
FULL_WALK_EVERY_WATCHED = 600.0

Identity = tuple[int, int, int, int]
_DirState = tuple[tuple[int, int, int], tuple[str, ...], bool]


class OverBudget(Exception):
    """A check run inline on the event loop (:meth:`WorkspaceGuard.check_quick`) that would
    take longer than its budget: a whole walk, a directory past the deadline, a git config
    to read with git. Nothing it did is lost (see ``check_quick``)."""


@dataclass(frozen=True)
class Action:
    """One thing the guard changed: workspace-relative ``path`` and ``what`` it did."""

    path: str
    what: str


def identity(st: os.stat_result) -> Identity:
    # ctime: a command can set a file's mtime back (utimensat), never its ctime.
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _open_rel(root_fd: int, rel: str) -> int | None:
    """Directory ``rel`` below the root, each component opened without following a link;
    None when it is not there (or is no longer a directory)."""
    fd = os.dup(root_fd)
    for name in rel.split("/") if rel else ():
        try:
            nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = nfd
    return fd


def is_git_dir(names: set[str]) -> bool:
    """Whether a directory holding ``names`` is one git may take for a repository's git
    directory: a HEAD (a repository, bare or not, a linked worktree's or a submodule's
    directory), a ``commondir`` file, or the objects and refs a common directory has."""
    return "HEAD" in names or "commondir" in names or ("objects" in names and "refs" in names)


class Walk:
    """The walks of one workspace, remembering each directory between them: a directory
    unchanged since the last walk is not listed again; a whole walk, every file stat'ed,
    at least every FULL_WALK_EVERY seconds (FULL_WALK_EVERY_WATCHED with a watch). With
    ``watch`` (an inotify watch of every directory, :mod:`worker.guard.dirwatch`), a walk
    visits only the directories that had
    an event and the way to them, and lists those whole (files too: a mode changed in
    place is an event); without one, or on any doubt the watch reports, every directory.
    Not thread-safe (the guard's lock holds it)."""

    def __init__(self, watch: bool = False) -> None:
        self._dirs: dict[str, _DirState] = {}
        self.full_at = -FULL_WALK_EVERY
        self._watch = DirWatch.open() if watch else None
        #: Every directory must be visited (and watched) again: nothing watched yet, or the
        #: watch lost track; cleared by a walk that visited them all.
        self._rewatch = True
        self._pending: set[str] = set()  # directories with events a walk has not visited yet
        self._gits: set[str] = set()  # the directories git could take for a git directory
        self._root: tuple[int, int] | None = None  # the watched root's (device, inode)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def run(self, root_fd: int, actions: list[Action], deadline: float | None = None) -> Iterator[str]:
        """Every directory below the root, without following a link: clear setuid and setgid
        bits, remove device nodes and file capabilities; yield the git directories.

        With ``deadline`` (a ``time.monotonic()``), raises OverBudget for a whole walk and
        once the deadline passes between two directories; what is known stays as it was
        (a later walk does it all again), what was fixed is in ``actions``."""
        now = time.monotonic()
        full = now - self.full_at >= (FULL_WALK_EVERY if self._watch is None else FULL_WALK_EVERY_WATCHED)
        if full and deadline is not None:
            raise OverBudget("a whole walk")
        if self._watch is not None:
            rst = os.fstat(root_fd)
            if (rst.st_dev, rst.st_ino) != self._root:
                # Another directory at the root's path (a gVisor warm sandbox's, moved into
                # place): nothing of it is watched; the old tree's watches go.
                self._root = (rst.st_dev, rst.st_ino)
                self._watch.close()
                self._watch = DirWatch.open()
                self._rewatch = True
        if self._watch is not None:
            changed, complete = self._watch.changes()
            self._pending |= changed
            if not complete:
                self._rewatch = True
        if full or self._rewatch or self._watch is None:
            if full:
                self.full_at = now
            seen: dict[str, _DirState] = {}
            self._visit(os.dup(root_fd), "", actions, deadline, full, seen)
            self._dirs = seen  # (only a whole walk replaces what is known)
            self._gits = {rel for rel, (_ident, _names, git) in seen.items() if git}
            self._rewatch = False
            self._pending.clear()
        else:
            self._visit_changed(root_fd, actions, deadline)
        return iter(sorted(self._gits))

    def _visit_changed(self, root_fd: int, actions: list[Action], deadline: float | None) -> None:
        """Visit the directories with events and the way from the root to each (sorted: a
        parent before its children). One with events is listed whole, and so is any on the
        way whose entries changed; a subdirectory of a listed one that is new or another
        inode than before (removed and made again) is walked whole. A directory's state is
        stored only once all that is done, so a walk cut short by the deadline leaves it to
        be visited again."""
        hot: set[str] = set()
        for rel in self._pending:
            while rel not in hot:
                hot.add(rel)
                rel = rel.rpartition("/")[0]
        for rel in sorted(hot):
            if deadline is not None and time.monotonic() > deadline:
                raise OverBudget("past the deadline")
            known = self._dirs.get(rel)
            if known is None:
                self._pending.discard(rel)
                continue  # below a directory that went, or a new one already walked whole
            fd = _open_rel(root_fd, rel)
            if fd is None:
                self._forget(rel)
                self._pending.discard(rel)
                continue
            try:
                if not self._watch_dir(fd, rel):
                    self._rewatch = True  # (the next walk visits all: this one is complete)
                dst = os.fstat(fd)
                ident = (dst.st_ino, dst.st_mtime_ns, dst.st_ctime_ns)
                if rel in self._pending or ident != known[0]:
                    names, git = self._scan_dir(fd, rel, actions)
                    for name in names:
                        self._check_subdir(fd, join(rel, name), name, actions, deadline)
                    for gone in set(known[1]) - set(names):
                        self._forget(join(rel, gone))
                else:
                    names, git = known[1], known[2]
                self._store(rel, (ident, names, git))
                self._pending.discard(rel)
            finally:
                os.close(fd)

    def _check_subdir(self, pfd: int, rel: str, name: str, actions: list[Action], deadline: float | None) -> None:
        """A subdirectory of a directory just listed: walked whole unless it is the very
        directory watched at that path before (not a new one, nor one removed and made
        again: the kernel tells, by giving a watched inode its watch's descriptor)."""
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
        except OSError:
            return
        if rel in self._dirs and self._watch is not None and self._watch.watch(fd, rel) is True:
            os.close(fd)  # events below it show on their own
            return
        self._forget(rel)
        try:
            self._visit(fd, rel, actions, deadline, True, self._dirs)
        except BaseException:
            # (OverBudget) a tree visited in part would pass for known and watched next
            # time: forgotten, it is visited whole again (its parent is still pending)
            self._forget(rel)
            raise

    def _store(self, rel: str, state: _DirState) -> None:
        self._dirs[rel] = state
        if state[2]:
            self._gits.add(rel)
        else:
            self._gits.discard(rel)

    def _forget(self, rel: str) -> None:
        """Drop what is known of directory ``rel`` and everything below it (it went)."""
        prefix = rel + "/"
        for key in [k for k in self._dirs if k == rel or k.startswith(prefix)]:
            del self._dirs[key]
            self._gits.discard(key)

    def _watch_dir(self, fd: int, rel: str) -> bool:
        """Watch directory ``fd`` (``rel``); False when the kernel refuses, and the watch is
        then dropped for good (every walk visits all, as without one)."""
        if self._watch is None:
            return True
        if self._watch.watch(fd, rel) is not None:
            return True
        self.close()
        return False

    def _visit(
        self, fd: int, rel: str, actions: list[Action], deadline: float | None, full: bool, seen: dict[str, _DirState]
    ) -> None:
        """Walk the tree of the open directory ``fd`` (``rel``; closed here) into ``seen``,
        listing each directory that changed since it was known (every one with ``full``)."""
        stack: list[tuple[int, str, list[str]]] = []
        try:
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise OverBudget("past the deadline")
                # Watched before it is looked at: what happens after the look is an event.
                self._watch_dir(fd, rel)
                dst = os.fstat(fd)
                ident = (dst.st_ino, dst.st_mtime_ns, dst.st_ctime_ns)
                known = None if full else self._dirs.get(rel)
                if known is not None and known[0] == ident and rel not in self._pending:
                    # Unchanged since the last walk (no entry made, removed or renamed: the
                    # ctime would show it, and no command can set a ctime back): the same
                    # names. What changes in place, a file's mode, no command can make setid.
                    _ident, subdir_names, git = known
                else:
                    subdir_names, git = self._scan_dir(fd, rel, actions)
                if seen is self._dirs:
                    self._store(rel, (ident, subdir_names, git))
                else:
                    seen[rel] = (ident, subdir_names, git)
                subdirs = list(subdir_names)
                stack.append((fd, rel, subdirs))
                fd = -1
                while stack:
                    pfd, prel, rest = stack[-1]
                    if not rest:
                        os.close(pfd)
                        stack.pop()
                        continue
                    name = rest.pop()
                    try:
                        fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
                    except OSError:
                        continue  # gone, or swapped for a link: never followed
                    rel = join(prel, name)
                    break
                if fd < 0:
                    return
        finally:
            if fd >= 0:
                os.close(fd)
            for pfd, _prel, _rest in stack:
                os.close(pfd)

    def _scan_dir(self, fd: int, rel: str, actions: list[Action]) -> tuple[tuple[str, ...], bool]:
        """One directory's entries: fix its files; its subdirectories, and whether git could
        take it for a git directory."""
        subdirs: list[str] = []
        names: set[str] = set()
        with os.scandir(fd) as it:
            for e in it:
                names.add(e.name)
                try:
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.name)
                    elif not e.is_symlink():
                        self._file(fd, rel, e.name, e.stat(follow_symlinks=False), actions)
                except OSError:
                    continue  # gone meanwhile
        return tuple(subdirs), is_git_dir(names)

    def _file(self, dir_fd: int, rel: str, name: str, st: os.stat_result, actions: list[Action]) -> None:
        path = join(rel, name)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
                actions.append(Action(path, "device node removed"))
            return
        if not stat.S_ISREG(st.st_mode):
            return
        if st.st_mode & _SETID:
            with pinned(dir_fd, name, st) as proc:
                if proc is not None:
                    chmod_logged(proc, stat.S_IMODE(st.st_mode) & ~_SETID, path, "setuid/setgid bits cleared", actions)
        if st.st_mode & 0o111:
            with pinned(dir_fd, name, st) as proc:
                if proc is not None and _CAPABILITY in _xattrs(proc):
                    with contextlib.suppress(OSError):
                        os.removexattr(proc, _CAPABILITY)
                        actions.append(Action(path, "file capability removed"))


@contextlib.contextmanager
def pinned(dir_fd: int, name: str, st: os.stat_result) -> Iterator[str | None]:
    """A /proc path to the very inode ``st`` describes (no link followed), or None."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        yield None
        return
    try:
        now = os.fstat(fd)
        ok = stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
        yield f"/proc/self/fd/{fd}" if ok else None
    finally:
        os.close(fd)


def chmod_logged(proc: str, mode: int, path: str, what: str, actions: list[Action]) -> None:
    try:
        os.chmod(proc, mode)
    except OSError as e:
        log.error("workspace.guard_failed", path=path, what=what, error=str(e))
        return
    actions.append(Action(path, what))


def _xattrs(path: str) -> list[str]:
    try:
        return os.listxattr(path)
    except OSError:
        return []
