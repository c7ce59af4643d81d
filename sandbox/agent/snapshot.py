"""Scan snapshots kept between scans, made incremental by inotify.

inotify reports which directories had an entry created, deleted, renamed, written or
re-stat'ed, so a scan after a command re-reads only those instead of the whole tree (a
10,000-file workspace: ~0.1 ms instead of ~25 ms). It is an accelerator, never the
authority: anything it cannot vouch for falls back to the stat walk (see :class:`Snapshot`)."""

import ctypes
import os
import select
import struct
import time

from . import paths, scanwalk

# The events that mark a directory for re-reading (linux/inotify.h).
_IN_MASK = (
    0x2  # IN_MODIFY
    | 0x4  # IN_ATTRIB
    | 0x8  # IN_CLOSE_WRITE
    | 0x40  # IN_MOVED_FROM
    | 0x80  # IN_MOVED_TO
    | 0x100  # IN_CREATE
    | 0x200  # IN_DELETE
    | 0x400  # IN_DELETE_SELF
    | 0x800  # IN_MOVE_SELF
    | 0x1000000  # IN_ONLYDIR
)
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_HEADER = struct.Struct("iIII")
#: Most directories one snapshot watches; beyond it the scan is a full stat walk. The
#: kernel's budget (fs.inotify.max_user_watches) is per uid and shared with the host
#: user's other programs (an IDE, a file syncer), so we never take more than a quarter.
MAX_WATCHES = 20000


def _watch_budget():
    try:
        with open("/proc/sys/fs/inotify/max_user_watches") as fh:
            return min(MAX_WATCHES, int(fh.read().strip()) // 4)
    except (OSError, ValueError):
        return min(MAX_WATCHES, 2048)


#: A full stat walk at least this often, even when inotify saw nothing: writes through a
#: shared mmap and changes through a hard link outside the workspace raise no event.
FULL_SCAN_EVERY = 300.0
_libc = [None]  # type: list


def _inotify():
    """The libc handle for inotify, or None where it is unavailable."""
    if _libc[0] is None:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
            _libc[0] = lib
        except Exception:
            _libc[0] = False
    return _libc[0] or None


class Snapshot(object):
    """One scan snapshot: the files by path, the directory layout, and (where the kernel
    is Linux itself: under gVisor, edits made on the host side of the bind mount raise no
    event inside the sandbox) an inotify instance watching every scanned directory.

    An incremental scan is used only when every one of these holds: the caller names the
    previous generation, the same path/exclude/limit, inotify is on, no directory went
    unwatched, the event queue did not overflow, and the last full walk is younger than
    FULL_SCAN_EVERY. Files with several hard links are re-stat'ed on every scan, since a
    write through another link raises no event in their directory.
    """

    def __init__(self, params, watch):
        self.params = params
        self.generation = ""
        self.files = {}  # type: dict
        self.dirs = {}  # type: dict  # prefix -> {subdir name: inode}
        self.names = {}  # type: dict  # prefix -> {file name: True}
        self.wd_of = {}  # type: dict  # prefix -> wd
        self.multi = set()  # type: set  # files with several hard links
        self.new_multi = False
        self.full_at = time.monotonic()
        # Events read off the queue ahead of a scan (``absorb``), for the next ``refresh``.
        self.early_dirty = set()  # type: set
        self.early_touched = set()  # type: set
        self.early_lost = False
        self.wds = {}  # type: dict  # wd -> prefix
        self.fd = -1
        self.broken = not watch
        self.budget = _watch_budget() if watch else 0
        if watch:
            lib = _inotify()
            fd = lib.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC) if lib is not None else -1
            if fd < 0:
                self.broken = True
            else:
                self.fd = fd

    def takes_known(self, path):
        """Whether a recorded write of ``path`` can be taken as seen (see ``known_write``):
        a watched snapshot that has the file, or its directory (a file the write creates).
        A directory the snapshot has not seen yet (made by the write, or by a command
        whose events are still queued) is left to the scan."""
        if self.broken or self.fd < 0:
            return False
        return path in self.files or path[: path.rfind("/") + 1] in self.dirs

    def absorb(self):
        """Read the events queued so far into this snapshot, for the next ``refresh``."""
        touched = set()  # type: set
        dirty = self.drain(touched)
        if dirty is None:
            self.early_lost = True
            return
        self.early_dirty |= dirty
        self.early_touched |= touched

    def known_write(self, path, st):
        """The host put a file at ``path`` by renaming it there, and records that change
        itself; ``st`` is that file's stat. Take it as this snapshot's view, so the next
        scan does not hand the host its own write back. Called just after the rename,
        with the events from before it read off by ``absorb`` just before: writes to
        ``path`` seen then were to the file the rename replaced (or the write's own
        permission check), so they are dropped. What comes after still shows: a rename
        over the path is another inode, a write in place an event still queued, a chmod
        another mode."""
        self.early_touched.discard(path)
        cut = path.rfind("/") + 1
        self.names.setdefault(path[:cut], {})[path[cut:]] = True
        self.files[path] = (paths.type_of(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def watch_dir(self, dfd, prefix):
        if self.fd < 0:
            return
        if len(self.wds) >= self.budget:
            self.broken = True
            return
        # The descriptor's /proc path pins the exact directory we opened (no re-walk).
        wd = _libc[0].inotify_add_watch(self.fd, ("/proc/self/fd/%d" % dfd).encode(), _IN_MASK)
        if wd < 0:
            self.broken = True  # ENOSPC (watch budget), EACCES, ...: fall back to walks
            return
        self.wds[wd] = prefix
        self.wd_of[prefix] = wd

    def usable(self, params, since):
        return (
            self.fd >= 0
            and not self.broken
            and params == self.params
            and since == self.generation
            and time.monotonic() - self.full_at < FULL_SCAN_EVERY
        )

    def quiet(self, params, since, multi_max):
        """Whether a refresh from ``since`` would find nothing to re-read: the snapshot is
        usable, no event is queued or was read ahead, and at most ``multi_max`` hard-linked
        files are to be re-stat'ed. (An event that lands just after this is still read by
        the refresh: a quiet answer only says the refresh will be short.)"""
        if not self.usable(params, since) or self.early_lost or self.early_dirty or self.early_touched:
            return False
        if len(self.multi) > multi_max:
            return False
        try:
            # (poll, not select: a service's descriptors may be numbered past select's 1024)
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def drain(self, touched):
        """The prefixes of directories that had events, or None when the queue overflowed.
        Adds to ``touched`` the paths of files written to (content events)."""
        dirty = set()  # type: set
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return dirty
            except OSError:
                return None
            if not buf:
                return dirty
            off = 0
            while off + 16 <= len(buf):
                wd, mask, _cookie, size = _IN_HEADER.unpack_from(buf, off)
                name = buf[off + 16 : off + 16 + size].rstrip(b"\x00")
                off += 16 + size
                if mask & _IN_Q_OVERFLOW:
                    return None
                prefix = self.wds.get(wd)
                if prefix is None:
                    continue
                if name and mask & 0xA:  # IN_MODIFY | IN_CLOSE_WRITE
                    touched.add(prefix + os.fsdecode(name))
                if mask & _IN_IGNORED:  # the directory is gone (its parent has the event too)
                    self.wds.pop(wd, None)
                    if self.wd_of.get(prefix) == wd:
                        del self.wd_of[prefix]
                    dirty.add(prefix)
                    continue
                dirty.add(prefix)

    def refresh(self, base_fd, base_prefix, exclude, limit):
        """Re-read the directories inotify reported; returns (changed, removed) or None
        when a full walk is needed instead."""
        touched = set()  # type: set
        dirty = self.drain(touched)
        if dirty is None or self.early_lost:
            return None
        dirty |= self.early_dirty
        touched |= self.early_touched
        self.early_dirty, self.early_touched = set(), set()
        changed = {}  # type: dict
        removed = set()  # type: set
        self.new_multi = False
        for prefix in sorted(dirty, key=lambda p: p.count("/")):
            if prefix not in self.dirs:
                continue  # dropped with a parent, or rescanned as new already
            dfd = paths.open_below(base_fd, prefix[len(base_prefix) :])
            if dfd is None:
                self._drop(prefix, removed)
                parent = prefix[: prefix.rstrip("/").rfind("/") + 1] if prefix != base_prefix else None
                if parent is not None and parent in self.dirs:
                    sub = paths.open_below(base_fd, parent[len(base_prefix) :])
                    if sub is not None:
                        try:
                            self._rescan(sub, parent, exclude, changed, removed)
                        finally:
                            os.close(sub)
                continue
            try:
                self._rescan(dfd, prefix, exclude, changed, removed)
            finally:
                os.close(dfd)
            if self.broken:
                return None
        if self.new_multi:
            # A new hard link: its other names (in directories without an event) must be
            # re-stat'ed from now on too.
            inodes = {}  # type: dict
            for path in self.multi:
                v = self.files.get(path)
                if v is not None:
                    inodes[v[3]] = True
            for path, v in self.files.items():
                if v[3] in inodes:
                    self.multi.add(path)
        for path in list(self.multi):
            if path in changed:
                continue
            cur = scanwalk.lstat_below(base_fd, path[len(base_prefix) :])
            old = self.files.get(path)
            if cur is None or old is None:
                self.multi.discard(path)
                if old is not None and cur is None:
                    del self.files[path]
                    removed.add(path)
                continue
            if cur != old:
                self.files[path] = cur
                changed[path] = cur
        # Written to but with the same stat (a same-size rewrite within one mtime tick):
        # reported anyway, the host compares content hashes. This is what makes the
        # host's "racy file" re-hashing unnecessary after an incremental scan.
        for path in touched:
            if path not in changed and path in self.files:
                changed[path] = self.files[path]
        if len(self.files) > limit:
            return None
        removed -= set(changed)
        return changed, removed

    def _drop(self, prefix, removed):
        """Forget directory ``prefix`` and everything under it."""
        todo = [prefix]
        while todo:
            p = todo.pop()
            subs = self.dirs.pop(p, None)
            if subs is None:
                continue
            if p:
                self.files.pop(p[:-1], None)
                removed.add(p[:-1])
            todo.extend(p + name + "/" for name in subs)
            for name in self.names.pop(p, ()):
                path = p + name
                self.files.pop(path, None)
                self.multi.discard(path)
                removed.add(path)
            wd = self.wd_of.pop(p, None)
            if wd is not None and self.wds.get(wd) == p:
                del self.wds[wd]
                _libc[0].inotify_rm_watch(self.fd, wd)

    def _rescan(self, dfd, prefix, exclude, changed, removed):
        """Re-read one directory (not recursively); new subdirectories are walked whole."""
        files = {}
        subdirs = {}
        names = {}
        try:
            it = os.scandir(dfd)
        except OSError:
            it = None
        if it is not None:
            with it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if e.name not in exclude:
                                if len(prefix) + len(e.name) < scanwalk.MAX_PATH:
                                    subdirs[e.name] = e.inode()
                                files[prefix + e.name] = scanwalk.dir_row(e)
                            continue
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    path = prefix + e.name
                    files[path] = (paths.type_of(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)
                    names[e.name] = True
                    if st.st_nlink > 1 and path not in self.multi:
                        self.multi.add(path)
                        self.new_multi = True
        old_sub = self.dirs.get(prefix, {})
        for name in self.names.get(prefix, ()):
            if name not in names:
                path = prefix + name
                self.files.pop(path, None)
                self.multi.discard(path)
                removed.add(path)
        self.names[prefix] = names
        for path, v in files.items():
            if self.files.get(path) != v:
                self.files[path] = v
                changed[path] = v
        for name, ino in old_sub.items():
            if subdirs.get(name) != ino:
                self._drop(prefix + name + "/", removed)
        self.dirs[prefix] = dict(subdirs)
        for name, ino in subdirs.items():
            if old_sub.get(name) == ino:
                continue
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError:
                self.dirs[prefix].pop(name, None)
                continue
            try:
                fresh = {prefix + name: files.get(prefix + name, scanwalk.DIR_ROW)}  # type: dict
                scanwalk.walk(sub, prefix + name + "/", exclude, fresh, 1 << 62, self)
            finally:
                os.close(sub)
            for path, v in fresh.items():
                self.files[path] = v
                changed[path] = v
