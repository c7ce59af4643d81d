"""A directory watched for the host with inotify (E2B's ``WatchDir``): ``watch_start``,
and the notification ``watch_stop``.

Each watch is a thread reading its own inotify instance; what happens in the directory
(recursively: in its subdirectories too, new ones watched as they appear) is sent to the
host as events ``{"event": "fswatch", "watch": ID, "events": [[name, type], ...]}``,
``name`` relative to the watched directory and ``type`` one of ``create``, ``write``,
``remove``, ``rename``, ``chmod`` (as E2B's envd reports them through fsnotify: a move
is ``rename`` where it left and ``create`` where it arrived). A watch that cannot go on
(its queue overflowed, no watch left in the kernel's budget) ends with ``{"event":
"fswatch", "watch": ID, "error": ...}``. A watch ends when the host stops it or goes.

inotify works the same under runc and gVisor for changes made inside the sandbox, which
is where every change of E2B's API is made (through this agent). It does not see changes
made on the host side of a bind mount under gVisor; none are made there while a sandbox
runs.
"""

import ctypes
import os
import select
import struct
import threading

from . import channel, snapshot
from .errors import Refused

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_ISDIR = 0x40000000
_MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_HEADER = struct.Struct("iIII")
#: The characters of the tag in the name of a loom write's temporary (see :func:`_temporary`).
_TAG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _temporary(name):
    r"""Whether ``name`` is the temporary a loom write puts in place with a rename
    (``write``), ``\..*\.loom-[A-Za-z0-9]+\.tmp``: not reported; its rename onto a name is
    that name written (created, then written, as envd reports a file written in place).
    Matched without ``re``, which the agent's boot does not import."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return False
    # Only the last ".loom-" can start the tag: an earlier one's tag holds a "." and a "-".
    i = name.rfind(".loom-", 1, len(name) - 4)
    tag = name[i + 6 : len(name) - 4]
    return i >= 1 and bool(tag) and _TAG_CHARS.issuperset(tag)


#: Watches one agent keeps at once, and the events sent in one message.
MAX_WATCHES = 64
BATCH = 512

_watches = {}  # type: dict  # host's id -> Watch
_lock = threading.Lock()


def _types(mask, root_self):
    """E2B's event types of one inotify event, in envd's order."""
    out = []
    if mask & (IN_CREATE | IN_MOVED_TO):
        out.append("create")
    if mask & IN_MOVED_FROM or (root_self and mask & IN_MOVE_SELF):
        out.append("rename")
    if mask & IN_ATTRIB:
        out.append("chmod")
    if mask & IN_MODIFY:
        out.append("write")
    if mask & IN_DELETE or (root_self and mask & IN_DELETE_SELF):
        out.append("remove")
    return out


class Watch(object):
    """One watched directory (see the module docstring)."""

    def __init__(self, wid, path, recursive):
        lib = snapshot._inotify()
        if lib is None:
            raise Refused("unsupported", "inotify is not available in this sandbox")
        self.lib = lib
        self.id = wid
        self.path = path
        self.recursive = recursive
        self.prefix = {}  # type: dict  # wd -> "" or "sub/dir/"
        self.moved = {}  # type: dict  # cookie -> rel path of a directory that left
        self.put = set()  # type: set  # cookies of loom's temporaries renamed away
        # The kernel's watch budget is per uid and shared with the host user's programs:
        # a watch takes at most what a scan snapshot may (``snapshot._watch_budget``).
        self.budget = snapshot._watch_budget()
        self.fd = lib.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise Refused("limit", "no inotify instance left for a watch: %s" % os.strerror(ctypes.get_errno()))
        self.wake_r, self.wake_w = os.pipe()
        self.stopped = False
        self.fd_lock = threading.Lock()  # (a descriptor closed is never written after)
        try:
            self._add(path, "", root=True)
            if recursive:
                self._add_tree(path, "", announce=False)
        except BaseException:
            self.close()
            raise

    def _add(self, path, prefix, root=False):
        if len(self.prefix) >= self.budget:
            raise Refused(
                "limit",
                "more than %d directories under %s: watch a smaller tree, or not recursively"
                % (self.budget, self.path),
            )
        flags = _MASK | IN_ONLYDIR | (0 if root else IN_DONT_FOLLOW)
        wd = self.lib.inotify_add_watch(self.fd, os.fsencode(path), flags)
        if wd < 0:
            err = ctypes.get_errno()
            if root or err == 28:  # ENOSPC: the kernel's watch budget
                raise Refused("limit", "cannot watch %s: %s" % (path, os.strerror(err)))
            return  # a subdirectory gone, or not ours to read: not watched
        self.prefix[wd] = prefix

    def _add_tree(self, path, prefix, announce):
        """Watch the subdirectories under ``path``; with ``announce``, report what is in
        it as created (a directory that just appeared may have entries already)."""
        out = []
        for top, dirs, files in os.walk(path):
            rel = os.path.relpath(top, path)
            sub = prefix + ("" if rel == "." else rel + "/")
            for d in sorted(dirs):
                self._add(os.path.join(top, d), sub + d + "/")
                if announce:
                    out.append([sub + d, "create"])
            if announce:
                out.extend([sub + f, "create"] for f in sorted(files) if not _temporary(f))
        return out

    def start(self):
        threading.Thread(target=self._run, name="fswatch-%s" % self.id, daemon=True).start()

    def stop(self):
        self.stopped = True
        with self.fd_lock:
            if self.wake_w >= 0:
                try:
                    os.write(self.wake_w, b"x")
                except OSError:
                    pass

    def close(self):
        with self.fd_lock:
            for fd in (self.fd, self.wake_r, self.wake_w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self.fd = self.wake_r = self.wake_w = -1

    def _run(self):
        error = None
        try:
            while not self.stopped:
                ready, _, _ = select.select([self.fd, self.wake_r], [], [])
                if self.stopped:
                    break
                if self.fd in ready:
                    events = self._read()
                    for i in range(0, len(events), BATCH):
                        channel.send({"event": "fswatch", "watch": self.id, "events": events[i : i + BATCH]})
        except Refused as e:
            error = e.message
        except (OSError, ValueError) as e:
            error = "the watch of %s failed: %s" % (self.path, e)
        finally:
            with _lock:
                if _watches.get(self.id) is self:
                    del _watches[self.id]
            self.close()
        if error is not None and not self.stopped:
            channel.send({"event": "fswatch", "watch": self.id, "error": error})

    def _read(self):
        """The events queued now, as ``[name, type]``. Raises Refused (overflow)."""
        out = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not buf:
                break
            off = 0
            while off + 16 <= len(buf):
                wd, mask, cookie, size = _HEADER.unpack_from(buf, off)
                name = os.fsdecode(buf[off + 16 : off + 16 + size].rstrip(b"\x00"))
                off += 16 + size
                if mask & IN_Q_OVERFLOW:
                    raise Refused(
                        "limit", "too many changes at once under %s: the watch's event queue overflowed" % self.path
                    )
                out.extend(self._event(wd, mask, cookie, name))
        self._forget_moved()
        self.put.clear()
        return out

    def _event(self, wd, mask, cookie, name):
        prefix = self.prefix.get(wd)
        if prefix is None:
            return []
        if mask & IN_IGNORED:
            del self.prefix[wd]
            return []
        if not name:  # the watched directory itself: only the root's own events count
            if prefix:
                return []  # (its parent reports it)
            return [[".", t] for t in _types(mask, True)]
        rel = prefix + name
        if _temporary(name):
            if mask & IN_MOVED_FROM:
                self.put.add(cookie)
            return []
        if mask & IN_MOVED_TO and cookie in self.put:
            self.put.discard(cookie)
            return [[rel, "create"], [rel, "write"]]
        found = [[rel, t] for t in _types(mask, False)]
        if self.recursive and mask & IN_ISDIR:
            if mask & IN_MOVED_FROM:
                self.moved[cookie] = rel
            elif mask & IN_MOVED_TO and cookie in self.moved:
                self._renamed(self.moved.pop(cookie), rel)
            elif mask & (IN_CREATE | IN_MOVED_TO):
                here = os.path.join(self.path, rel)
                self._add(here, rel + "/")
                found.extend(self._add_tree(here, rel + "/", announce=True))
        return found

    def _renamed(self, old, new):
        """A watched subdirectory moved inside the tree: its watches go on under the new name."""
        for wd, p in list(self.prefix.items()):
            if p == old + "/" or p.startswith(old + "/"):
                self.prefix[wd] = new + "/" + p[len(old) + 1 :]

    def _forget_moved(self):
        """Subdirectories that moved out of the tree: no longer watched."""
        for old in self.moved.values():
            for wd, p in list(self.prefix.items()):
                if p.startswith(old + "/"):
                    self.lib.inotify_rm_watch(self.fd, wd)
                    del self.prefix[wd]
        self.moved.clear()


def op_watch_start(req):
    """Watch the directory ``path`` (links followed) as the host's watch ``watch`` (an
    id it chose), its subdirectories too with ``recursive``. Raises Refused
    (``not_found``, ``not_a_directory``, ``limit``, ``conflict``: the id is taken)."""
    wid = req.get("watch")
    path = req.get("path")
    if not isinstance(wid, int) or isinstance(wid, bool):
        raise Refused("invalid", "watch must be an integer id")
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise Refused("invalid", "path must be an absolute path without NUL bytes")
    try:
        if not os.path.isdir(path):
            if os.path.lexists(path):
                raise Refused("not_a_directory", "path %s not a directory" % path)
            raise Refused("not_found", "path %s not found" % path)
    except OSError as e:
        raise Refused("not_found", "path %s not found: %s" % (path, e))
    with _lock:
        if wid in _watches:
            raise Refused("conflict", "watch %d exists" % wid)
        if len(_watches) >= MAX_WATCHES:
            raise Refused("limit", "at most %d directories are watched at once: stop one first" % MAX_WATCHES)
    watch = Watch(wid, path, bool(req.get("recursive")))
    with _lock:
        _watches[wid] = watch
    # Events only once the host has the answer (it registered its handler before asking).
    return {"watching": True, "_after_send": watch.start}


def op_watch_stop(req):
    """Stop watch ``watch`` (a notification: nothing is answered)."""
    with _lock:
        watch = _watches.pop(req.get("watch"), None)
    if watch is not None:
        watch.stop()


def stop_all():
    """The host is gone: stop every watch."""
    with _lock:
        watches = list(_watches.values())
        _watches.clear()
    for w in watches:
        w.stop()
