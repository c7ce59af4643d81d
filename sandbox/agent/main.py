"""The agent's main loop and, for now, all of its operations (see the package's docstring)."""

import base64
import collections
import ctypes
import errno
import fnmatch
import hashlib
import json
import os
import queue
import re
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time

from . import activity, channel, paths, state
from .errors import Refused, error_answer

AGENT_VERSION = "1"

KILL_GRACE = 0.5
LINGER_AFTER_EXIT = 0.1
DISK_POLL = 0.05
#: A command is held to the reserve only once it has itself consumed this much, so one
#: that writes nothing is not stopped because something else filled the disk.
DISK_SLACK = 16 << 20
#: The share of the filesystem's inodes no command may use up (a disk can be filled with
#: empty files too).
INODE_RESERVE = 0.01
INODE_SLACK = 10000
#: For this long after starting a command the agent polls for its output and exit
#: without sleeping (yielding the CPU on each round). A thread that sleeps lets its CPU go
#: idle, and under virtualization (no guest halt-polling) waking an idle vCPU is slow:
#: measured in the sandbox on this project's CI VM, `true` takes ~0.2 ms less this way
#: and 8-13 ms commands ~1 ms less. Bounded: at most this much CPU per command.
SPIN_WINDOW = 0.002
_sched_yield = getattr(os, "sched_yield", lambda: None)

_exec_lock = threading.Lock()
_foreign_pids = set()  # type: set[int]  # helper processes (ripgrep) that the exec tree-kill must spare
_foreign_lock = threading.Lock()
_snapshots = {}  # type: dict
_scan_lock = threading.Lock()

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "CI": "1",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "TERM": "dumb",
    "DEBIAN_FRONTEND": "noninteractive",
    "GIT_TERMINAL_PROMPT": "0",
    "PIP_NO_INPUT": "1",
    "NO_COLOR": "1",
    # no __pycache__ in the workspace: stale bytecode and changelog noise
    "PYTHONDONTWRITEBYTECODE": "1",
}


# --------------------------------------------------------------------------- helpers


def _prctl(option, arg):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0
    except Exception:
        return False


def _hash_fd(f):
    h = hashlib.sha256()
    os.lseek(f, 0, 0)
    while True:
        chunk = os.read(f, 1 << 20)
        if not chunk:
            break
        h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- file ops


def op_hello(req):
    return {
        "version": AGENT_VERSION,
        "uid": os.getuid(),
        "gid": os.getgid(),
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
        "subreaper": state.subreaper,
        "ripgrep": _rg_command() is not None,
        # Commands run with the image's own /bin/sh: an image without one cannot serve.
        "shell": os.access("/bin/sh", os.X_OK),
        "cpu_quota": _cpu_quota(),
    }


def op_read(req):
    path = req.get("path", ".")
    max_bytes = min(int(req.get("max_bytes") or state.MAX_READ), state.MAX_READ)
    fd, name, parts, st = paths.resolve(path)
    try:
        if name is None:
            raise Refused("not_a_file", "Not a file: %s is a directory" % path)
        f, fst = paths.open_file(fd, name, st, path)
    finally:
        os.close(fd)
    try:
        # A whole small file is read once; its first 8 KiB decide "binary" (NUL byte).
        whole = fst.st_size <= min(max_bytes, 8192) and not req.get("line_range") and not req.get("offset")
        head = os.pread(f, 8192, 0)
        binary = b"\x00" in head
        if whole and req.get("length") is None and len(head) == fst.st_size:
            return {
                "data": channel.b64(head),
                "size": fst.st_size,
                "truncated": False,
                "sha256": hashlib.sha256(head).hexdigest(),
                "mtime_ns": fst.st_mtime_ns,
                "binary": binary,
                "total_lines": None,
            }
        line_range = req.get("line_range")
        total_lines = None
        digest = None
        if line_range:
            start, end = int(line_range[0]), int(line_range[1])
            out = []
            n = 0
            size = 0
            truncated = False
            with os.fdopen(os.dup(f), "rb") as fh:
                for line in fh:
                    n += 1
                    if start <= n <= end:
                        if size + len(line) > max_bytes:
                            out.append(line[: max_bytes - size])
                            size = max_bytes
                            truncated = True
                        elif not truncated:
                            out.append(line)
                            size += len(line)
            total_lines = n
            data = b"".join(out)
        else:
            offset = int(req.get("offset") or 0)
            length = req.get("length")
            want = fst.st_size - offset if length is None else int(length)
            want = max(0, min(want, fst.st_size - offset))
            truncated = want > max_bytes
            want = min(want, max_bytes)
            chunks = []
            pos = offset
            remaining = want
            while remaining > 0:
                chunk = os.pread(f, min(remaining, 1 << 20), pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
            if offset == 0 and not truncated and len(data) == fst.st_size:
                digest = hashlib.sha256(data).hexdigest()
        return {
            "data": channel.b64(data),
            "size": fst.st_size,
            "truncated": truncated,
            "sha256": digest,
            "mtime_ns": fst.st_mtime_ns,
            "binary": binary,
            "total_lines": total_lines,
        }
    finally:
        os.close(f)


def _check_expect(fd, name, st, path, req):
    expect = req.get("expect_sha256")
    if req.get("expect_absent") and st is not None:
        raise Refused("conflict", "Conflict: %s already exists" % path)
    if expect:
        if st is None:
            raise Refused("conflict", "Conflict: %s no longer exists" % path)
        f, _ = paths.open_file(fd, name, st, path)
        try:
            current = _hash_fd(f)
        finally:
            os.close(f)
        if current != expect:
            raise Refused("conflict", "Conflict: %s changed since it was read" % path)


def _disk_avail():
    """Bytes an unprivileged writer may still use on the workspace's filesystem, or
    None when the filesystem does not say."""
    st = _statvfs()
    return None if st is None else st.f_bavail * st.f_frsize


def _statvfs():
    try:
        return os.statvfs(state.ROOT)
    except OSError:
        return None


def _check_reserve(growth, path):
    if not state.DISK_RESERVE or growth <= 0:
        return
    avail = _disk_avail()
    if avail is not None and avail - growth < state.DISK_RESERVE:
        raise Refused(
            "no_space",
            "No space left for %s: writing %d more bytes would leave less than the %d bytes the "
            "sandbox keeps free on the workspace's disk (%d available)" % (path, growth, state.DISK_RESERVE, avail),
        )


class _DiskWatch(object):
    """Stops a command that fills the workspace's disk: more than DISK_LIMIT bytes
    consumed since it started, or free space below DISK_RESERVE (once it has consumed
    DISK_SLACK itself). The bind-mounted workspace is the host's disk, where the
    container's limits do not reach; RLIMIT_FSIZE (the container's ``fsize`` ulimit)
    bounds any one file, this bounds a command's total. It samples ``statvfs`` every
    DISK_POLL seconds, so a command can overshoot by what it writes in one interval.
    Inodes are held the same way (INODE_LIMIT, INODE_RESERVE) where the filesystem
    counts them (f_files > 0)."""

    def __init__(self, now):
        st = _statvfs()
        self.start = None if st is None else (st.f_bavail * st.f_frsize, st.f_favail)
        self.next = now + DISK_POLL
        self.used = 0
        self.files = 0

    def exceeded(self, now):
        if now < self.next or self.start is None:
            return False
        self.next = now + DISK_POLL
        st = _statvfs()
        if st is None:
            return False
        avail = st.f_bavail * st.f_frsize
        self.used = max(self.used, self.start[0] - avail)
        if state.DISK_LIMIT and self.used > state.DISK_LIMIT:
            return True
        if state.DISK_RESERVE and avail < state.DISK_RESERVE and self.used > DISK_SLACK:
            return True
        if st.f_files <= 0:
            return False  # no inode accounting (btrfs, some network filesystems)
        self.files = max(self.files, self.start[1] - st.f_favail)
        if state.INODE_LIMIT and self.files > state.INODE_LIMIT:
            return True
        return st.f_favail < st.f_files * INODE_RESERVE and self.files > INODE_SLACK


def op_write(req):
    path = req.get("path")
    data = base64.b64decode(req.get("data", ""))
    # fsync (file, then directory) unless the caller asked for process-crash safety only
    durable = req.get("fsync", True) is not False
    if len(data) > state.MAX_WRITE:
        raise Refused("too_large", "Write of %d bytes exceeds the %d byte cap" % (len(data), state.MAX_WRITE))
    parts = paths.split(path)
    if not parts:
        raise Refused("not_a_file", "Not a file: the workspace root is a directory")
    fd, name, parts, st = paths.resolve(path, create_dirs=req.get("mkdirs", True))
    try:
        if name is None or (st is not None and stat.S_ISDIR(st.st_mode)):
            raise Refused("not_a_file", "Not a file: %s is a directory" % path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise Refused("not_a_file", "Not a file: %s is %s" % (path, paths.kind_name(st.st_mode)))
        _check_expect(fd, name, st, path, req)
        _check_reserve(len(data) - (st.st_size if st is not None else 0), path)
        mode = (st.st_mode & 0o7777) if st is not None else 0o666
        create_mode = req.get("mode")
        if st is None and isinstance(create_mode, int) and not isinstance(create_mode, bool):
            mode = create_mode & 0o777  # a restored file gets its permissions back (never setuid)
        tmp = ".%s.loom-%s.tmp" % (name[:100], os.urandom(6).hex())
        try:
            f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        except PermissionError:
            raise Refused("permission", "Permission denied: cannot write in the directory of %s" % path)
        except OSError as e:
            if e.errno == errno.EROFS:
                raise Refused("permission", "Read-only: %s is on a read-only mount" % path)
            raise
        try:
            view = memoryview(data)
            while view:
                n = os.write(f, view)
                view = view[n:]
            if st is not None or mode != 0o666:
                os.fchmod(f, mode)  # exactly, whatever the umask
            if durable:
                os.fsync(f)
            written = os.fstat(f)
        except BaseException:
            os.close(f)
            os.unlink(tmp, dir_fd=fd)
            raise
        os.close(f)
        result = {
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "created": st is None,
            "path": paths.rel(parts),
        }
        if req.get("stage"):
            # Written and fsync'd, not yet in place: the host records its changelog entry
            # meanwhile and then sends ``commit`` (or ``abort``). The directory stays open,
            # so the rename happens exactly where the checks were made.
            if _staged:
                _drop_staged(STAGE_TTL)
            token = req.get("token")
            if not (isinstance(token, str) and 0 < len(token) <= 64 and token.isalnum()) or token in _staged:
                token = os.urandom(8).hex()
            expect = {"expect_sha256": req.get("expect_sha256"), "expect_absent": req.get("expect_absent")}
            expect["written"] = written
            with _staged_lock:
                _staged[token] = (fd, tmp, name, path, expect, durable, result, time.monotonic())
            fd = -1
            return {"staged": token, "path": paths.rel(parts), "mode": None if st is None else st.st_mode}
        _put_in_place(fd, tmp, name, durable)
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _put_in_place(fd, tmp, name, durable):
    """Rename the written temporary ``tmp`` over ``name`` (both in directory ``fd``).

    Two costs are moved off the caller's path, onto the tidying thread (measured A/B on
    edit_file with the changelog: -0.09 and -0.25 ms of ~1.5):

    - the file being replaced stays open (O_PATH: no read permission needed) across the
      rename and is closed afterwards. Freeing its inode and blocks is what made a
      replacing rename cost ~0.15 ms, against ~0.02 ms with the inode still held;
    - the directory's fsync (``durable``) runs just after the answer. What a power cut
      needs is already on disk by then: the new content (fsync'd before the rename) and,
      for a recorded change, its changelog entry (committed before the rename was asked
      for). A power cut in the fraction of a millisecond before the directory reaches the
      disk leaves the file wholly old, as if the write had come just after it.
    """
    try:
        held = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        held = -1  # nothing to replace
    try:
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        if held >= 0:
            os.close(held)
        os.unlink(tmp, dir_fd=fd)
        raise
    dfd = -1
    if durable:
        try:
            dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            pass
    if held >= 0 or dfd >= 0:
        _later(lambda: (_close(held), _sync_close(dfd)))


def _close(f):
    if f >= 0:
        os.close(f)


def _sync_close(dfd):
    if dfd < 0:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


_tidy = queue.Queue()  # type: queue.Queue
_tidy_thread = []  # type: list
_tidy_lock = threading.Lock()


def _later(fn):
    """Run ``fn`` on the tidying thread: after the current request is answered, in order."""
    if not _tidy_thread:
        with _tidy_lock:
            if not _tidy_thread:
                t = threading.Thread(target=_tidy_loop, daemon=True)
                t.start()
                _tidy_thread.append(t)
    _tidy.put(fn)


def _tidy_loop():
    while True:
        fn = _tidy.get()
        try:
            fn()
        except Exception:
            pass
        finally:
            _tidy.task_done()


def _tidy_drain(timeout):
    """Wait (at most ``timeout`` seconds) for what the tidying thread still has to do,
    so an agent that exits has fsync'd the directories of its last writes."""
    if not _tidy_thread:
        return
    done = threading.Event()
    _tidy.put(done.set)
    done.wait(timeout)


_staged = {}  # type: dict
_staged_lock = threading.Lock()
STAGE_TTL = 120.0


def _take_staged(req):
    token = req.get("staged")
    with _staged_lock:
        item = _staged.pop(token, None) if isinstance(token, str) else None
    if item is None:
        raise Refused("invalid", "No staged write %r (committed, aborted or expired)" % (token,))
    return item


def op_commit(req):
    """Put a staged write in place, if the target still is what the write expected."""
    fd, tmp, name, path, expect, durable, result, _at = _take_staged(req)
    try:
        try:
            here = paths.resolve(path, create_dirs=False)
        except Refused:
            here = None
        try:
            same = here is not None and here[1] == name and os.path.samestat(os.fstat(here[0]), os.fstat(fd))
        finally:
            if here is not None:
                os.close(here[0])
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        expect_path = req.get("expect_path")
        try:
            if expect_path is not None and expect_path != result["path"]:
                raise Refused("conflict", "Conflict: %s resolves to %s, not %s" % (path, result["path"], expect_path))
            if not same:
                raise Refused("conflict", "Conflict: %s was moved or relinked while being written" % path)
            # Our temporary, untouched: not replaced (by a link, say) nor written to since.
            try:
                now = os.stat(tmp, dir_fd=fd, follow_symlinks=False)
            except OSError:
                now = None
            was = expect["written"]
            if now is None or (now.st_ino, now.st_dev, now.st_size, now.st_mtime_ns, now.st_ctime_ns) != (
                was.st_ino,
                was.st_dev,
                was.st_size,
                was.st_mtime_ns,
                was.st_ctime_ns,
            ):
                raise Refused("conflict", "Conflict: the staged content of %s was tampered with" % path)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise Refused("not_a_file", "Not a file: %s is %s" % (path, paths.kind_name(st.st_mode)))
            _check_expect(fd, name, st, path, expect)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            raise
        _put_in_place(fd, tmp, name, durable)
        result = dict(result)
        result["created"] = st is None
        return result
    finally:
        os.close(fd)


def op_abort(req):
    fd, tmp, _name, _path, _expect, _durable, _result, _at = _take_staged(req)
    try:
        os.unlink(tmp, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    return {"aborted": True}


def _drop_staged(older_than=0.0):
    """Remove staged temporaries the host never committed (it went away, or forgot)."""
    now = time.monotonic()
    with _staged_lock:
        old = [t for t, item in _staged.items() if now - item[7] >= older_than]
        items = [_staged.pop(t) for t in old]
    for fd, tmp, *_rest in items:
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        os.close(fd)


def op_remove(req):
    path = req.get("path")
    if not paths.split(path):
        raise Refused("escape", "Refusing to remove the workspace root")
    fd, name, parts, st = paths.resolve(path, follow_last=False)
    try:
        if st is None:
            return {"removed": False}
        if stat.S_ISDIR(st.st_mode):
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError as e:
                raise Refused("conflict", "Cannot remove directory %s: %s" % (path, e.strerror))
            return {"removed": True}
        if req.get("expect_sha256"):
            _check_expect(fd, name, st, path, req)
        os.unlink(name, dir_fd=fd)
        return {"removed": True}
    finally:
        os.close(fd)


def _rmtree_at(dfd, name, counts):
    """Remove directory ``name`` under ``dfd`` and everything in it, never following a
    link (each level is opened O_NOFOLLOW from its parent's descriptor, so a directory
    swapped for a symlink mid-walk is unlinked as a link, not entered). A directory the
    command made unwritable (0555, as Go's module cache does) is made writable first: we
    own it. ``counts`` = [files, dirs, bytes] removed."""
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            os.unlink(name, dir_fd=dfd)
            counts[0] += 1
            counts[2] += st.st_size if stat.S_ISREG(st.st_mode) else 0
            return
        raise
    try:
        st = os.fstat(sub)
        if st.st_mode & 0o700 != 0o700:
            try:
                os.fchmod(sub, stat.S_IMODE(st.st_mode) | 0o700)
            except OSError:
                pass  # not ours: the unlinks below say so
        with os.scandir(sub) as it:
            entries = list(it)
        for ent in entries:
            if ent.is_dir(follow_symlinks=False):
                _rmtree_at(sub, ent.name, counts)
                continue
            try:
                size = ent.stat(follow_symlinks=False).st_size if ent.is_file(follow_symlinks=False) else 0
                os.unlink(ent.name, dir_fd=sub)
            except FileNotFoundError:
                continue
            counts[0] += 1
            counts[2] += size
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dfd)
    counts[1] += 1


def op_remove_tree(req):
    """Remove ``path`` whatever it is: a directory with everything in it (the changelog's
    undo of a directory tree a command made), a file or a link. Absent: nothing to do."""
    path = req.get("path")
    if not paths.split(path):
        raise Refused("escape", "Refusing to remove the workspace root")
    fd, name, parts, st = paths.resolve(path, follow_last=False)
    counts = [0, 0, 0]
    try:
        if st is None:
            return {"removed": False, "files": 0, "dirs": 0, "bytes": 0}
        try:
            if stat.S_ISDIR(st.st_mode):
                _rmtree_at(fd, name, counts)
            else:
                os.unlink(name, dir_fd=fd)
                counts[0] += 1
                counts[2] += st.st_size if stat.S_ISREG(st.st_mode) else 0
        except FileNotFoundError:
            pass
        except OSError as e:
            raise Refused(
                "conflict",
                "Cannot remove %s: %s (removed %d files and %d directories before that)"
                % (path, e.strerror, counts[0], counts[1]),
            )
        return {"removed": True, "files": counts[0], "dirs": counts[1], "bytes": counts[2]}
    finally:
        os.close(fd)


def op_chmod(req):
    """Set the permission bits of ``path`` (a file or directory; never a link, never
    followed out of the workspace)."""
    path = req.get("path")
    mode = req.get("mode")
    if not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise Refused("invalid", "mode must be an integer in 0..0o7777")
    fd, name, parts, st = paths.resolve(path, follow_last=False)
    try:
        if st is None:
            raise Refused("not_found", "Not found: %s" % path)
        if stat.S_ISLNK(st.st_mode):
            raise Refused("not_a_file", "Not a file: %s is a symlink (a link has no mode of its own)" % path)
        if name is None:
            target = os.dup(fd)
        else:
            target = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        try:
            # An O_PATH descriptor pins the inode we checked; fchmod() refuses O_PATH, the
            # /proc link to it does not (and never resolves to another file).
            os.chmod("/proc/self/fd/%d" % target, mode)
        except OSError as e:
            raise Refused("permission", "Cannot change the mode of %s: %s" % (path, e.strerror))
        finally:
            os.close(target)
        return {"mode": mode}
    finally:
        os.close(fd)


def op_symlink(req):
    """Create symlink ``path`` -> ``target`` (the changelog's undo of a removed or
    changed link). The target is stored as given, never resolved here; ``path`` must be
    absent. Reading through the link later is held to the workspace like any path."""
    path = req.get("path")
    target = req.get("target")
    if not isinstance(target, str) or not target or "\x00" in target:
        raise Refused("invalid", "target must be a non-empty string without NUL")
    if not paths.split(path):
        raise Refused("escape", "Refusing to replace the workspace root")
    fd, name, parts, st = paths.resolve(path, follow_last=False, create_dirs=True)
    try:
        if st is not None:
            raise Refused("conflict", "Cannot create symlink %s: something is already there" % path)
        try:
            os.symlink(target, name, dir_fd=fd)
        except OSError as e:
            raise Refused("conflict", "Cannot create symlink %s: %s" % (path, e.strerror))
        return {"created": True}
    finally:
        os.close(fd)


def op_mkdir(req):
    """Create directory ``path`` and any missing parent (the changelog's undo of a removed
    directory); one that already exists is left as it is. ``mode``: the new directory's
    permission bits (set exactly, not masked by the umask)."""
    path = req.get("path")
    mode = req.get("mode")
    if mode is not None and (not isinstance(mode, int) or not 0 <= mode <= 0o7777):
        raise Refused("invalid", "mode must be an integer in 0..0o7777")
    if not paths.split(path):
        return {"created": False}  # the workspace root
    fd, name, parts, st = paths.resolve(path, follow_last=False, create_dirs=True)
    try:
        if st is None:
            os.mkdir(name, 0o777 if mode is None else 0o700, dir_fd=fd)
            if mode is not None:
                sub = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                try:
                    os.chmod("/proc/self/fd/%d" % sub, mode)
                finally:
                    os.close(sub)
            return {"created": True}
        if stat.S_ISDIR(st.st_mode):
            return {"created": False}
        raise Refused("conflict", "Cannot create directory %s: something else is there" % path)
    finally:
        os.close(fd)


def op_stat(req):
    path = req.get("path", ".")
    fd, name, parts, st = paths.resolve(path, follow_last=False)
    try:
        if st is None:
            raise Refused("not_found", "Not found: %s" % path)
        target = None
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=fd)
        return {
            "path": paths.rel(parts),
            "type": paths.type_of(st.st_mode),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "mode": st.st_mode,
            "target": target,
        }
    finally:
        os.close(fd)


def op_hash(req):
    out = {}  # type: dict
    for path in req.get("paths") or []:
        try:
            fd, name, parts, st = paths.resolve(path)
            try:
                if name is None or st is None or not stat.S_ISREG(st.st_mode):
                    out[path] = None
                    continue
                f, _ = paths.open_file(fd, name, st, path)
                try:
                    out[path] = _hash_fd(f)
                finally:
                    os.close(f)
            finally:
                os.close(fd)
        except Refused:
            out[path] = None
    return {"hashes": out}


def _walk(dir_fd, prefix, depth, max_depth, exclude, visit, counter, limit):
    """Depth-first walk below an open directory fd, never following links."""
    try:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    dirs = []
    for e in entries:
        if counter[0] >= limit:
            counter[1] = True
            return
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if is_dir and e.name in exclude:
            continue
        rel = prefix + e.name
        visit(e, rel, depth, is_dir)
        if is_dir:
            dirs.append(e)
    for e in dirs:
        if max_depth is not None and depth >= max_depth:
            continue
        if counter[0] >= limit:
            counter[1] = True
            return
        try:
            sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            _walk(sub, prefix + e.name + "/", depth + 1, max_depth, exclude, visit, counter, limit)
        finally:
            os.close(sub)


def op_list(req):
    path = req.get("path", ".")
    depth = max(1, min(int(req.get("depth", 2)), 20))
    exclude = set(req.get("exclude") or ())
    limit = int(req.get("max_entries", 5000))
    dfd, parts = paths.open_dir(path)
    out = []
    counter = [0, False]

    def visit(e, rel, d, is_dir):
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            return
        counter[0] += 1
        out.append([rel, paths.type_of(st.st_mode), st.st_size if not is_dir else 0, d])

    try:
        _walk(dfd, "", 1, depth, exclude, visit, counter, limit)
    finally:
        os.close(dfd)
    return {"base": paths.rel(parts), "entries": out, "truncated": counter[1]}


# A directory in a scan: its existence and its mode. Its mtime and size change with every
# entry made in it, and the changelog records the entries themselves.
_DIR = ("dir", 0, 0, 0, 0)


def _dir_row(e):
    """The scan row of directory entry ``e``: one lstat per directory, for its mode (a
    ``chmod`` of a directory is a change undo must reverse)."""
    try:
        return ("dir", 0, 0, 0, e.stat(follow_symlinks=False).st_mode)
    except OSError:
        return _DIR


def _scan_walk(dfd, prefix, exclude, out, limit, snap=None):
    """Stat-only walk for change detection: no sorting, one lstat per non-directory
    (directories are recognised from d_type for free, and listed as ``_DIR``), never
    following links. With
    ``snap`` it also records the directory layout, watches each directory and notes
    hard-linked files (see :class:`_Snapshot`)."""
    dirs = []
    names = {}  # type: dict
    if snap is not None:
        snap.watch_dir(dfd, prefix)
    try:
        it = os.scandir(dfd)
    except OSError:
        return False
    track = snap is not None
    isreg = stat.S_ISREG
    with it:
        for e in it:
            name = e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    if name not in exclude:
                        if len(out) >= limit:
                            return True
                        dirs.append((name, e.inode()))
                        out[prefix + name] = _dir_row(e)
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if len(out) >= limit:
                return True
            key = prefix + name
            mode = st.st_mode
            out[key] = ("file" if isreg(mode) else paths.type_of(mode), st.st_size, st.st_mtime_ns, st.st_ino, mode)
            if track:
                names[name] = True
                if st.st_nlink > 1 and key not in snap.multi:
                    snap.multi.add(key)
                    snap.new_multi = True
    if snap is not None:
        snap.dirs[prefix] = dict(dirs)
        snap.names[prefix] = names
    for name, _ino in dirs:
        try:
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            if snap is not None:
                snap.dirs[prefix].pop(name, None)
            continue
        try:
            if _scan_walk(sub, prefix + name + "/", exclude, out, limit, snap):
                return True
        finally:
            os.close(sub)
    return False


# Change notification for the snapshot scan. inotify reports which directories had an
# entry created, deleted, renamed, written or re-stat'ed, so a scan after a command
# re-reads only those instead of the whole tree (a 10,000-file workspace: ~0.1 ms
# instead of ~25 ms). It is an accelerator, never the authority: anything it cannot vouch
# for falls back to the stat walk (see _Snapshot).
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


class _Snapshot(object):
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
        if dirty is None:
            return None
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
            cur = _lstat_below(base_fd, path[len(base_prefix) :])
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
                                subdirs[e.name] = e.inode()
                                files[prefix + e.name] = _dir_row(e)
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
                fresh = {prefix + name: files.get(prefix + name, _DIR)}  # type: dict
                _scan_walk(sub, prefix + name + "/", exclude, fresh, 1 << 62, self)
            finally:
                os.close(sub)
            for path, v in fresh.items():
                self.files[path] = v
                changed[path] = v


def _lstat_below(base_fd, rel):
    head, _, name = rel.rpartition("/")
    dfd = paths.open_below(base_fd, head)
    if dfd is None:
        return None
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(dfd)
    if stat.S_ISDIR(st.st_mode):
        return None
    return (paths.type_of(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)


def op_scan(req):
    dfd, parts = paths.open_dir(req.get("path", "."))
    prefix = "" if not parts else paths.rel(parts) + "/"
    try:
        with _scan_lock:
            # gVisor: edits made on the host side of the bind mount raise no event in the
            # sandbox, so only runc (the subreaper bit says which) watches.
            return scan_tree(dfd, prefix, req, _snapshots, state.subreaper)
    finally:
        os.close(dfd)


def scan_tree(dfd, prefix, req, snapshots, watch):
    """The work of ``op_scan`` on an open directory ``dfd`` (``prefix``: its path in the
    workspace), keeping snapshots in ``snapshots`` (caller holds their lock). Shared with
    the host, which scans a gVisor sandbox's workspace itself (sandbox/hostscan.py)."""
    exclude = set(req.get("exclude") or ())
    limit = int(req.get("max_files", 100000))
    key = req.get("snapshot")
    since = req.get("since")
    params = (req.get("path", "."), tuple(sorted(exclude)), limit)
    previous = snapshots.get(key) if key else None
    if previous is not None and previous.usable(params, since) and not req.get("walk"):
        delta = previous.refresh(dfd, prefix, exclude, limit)
        if delta is not None:
            previous.generation = os.urandom(8).hex()
            changed, removed = delta
            return {
                "entries": [[p, *v] for p, v in changed.items()],
                "removed": sorted(removed),
                "full": False,
                "truncated": False,
                "generation": previous.generation,
                "watched": True,
                "from_events": True,
            }
    # A full stat walk (first scan, a restart, a fallback, or no snapshot key).
    snap = _Snapshot(params, watch=bool(key) and watch)
    try:
        truncated = _scan_walk(dfd, prefix, exclude, snap.files, limit, snap if key else None)
    except BaseException:
        snap.close()
        raise
    if truncated:
        snap.broken = True
    current = snap.files
    snap.generation = generation = os.urandom(8).hex()
    if key:
        if previous is not None:
            previous.close()
        snapshots[key] = snap
    else:
        snap.close()
    watched = not snap.broken and snap.fd >= 0
    if previous is not None and since == previous.generation and params == previous.params:
        old = previous.files
        changed = [[p, *v] for p, v in current.items() if old.get(p) != v]
        removed = [p for p in old if p not in current]
        return {
            "entries": changed,
            "removed": removed,
            "full": False,
            "truncated": truncated,
            "generation": generation,
            "watched": watched,
        }
    return {
        "entries": [[p, *v] for p, v in current.items()],
        "removed": [],
        "full": True,
        "truncated": truncated,
        "generation": generation,
        "watched": watched,
    }


# --------------------------------------------------------------------------- search


def _match_order(m):
    return (m[0], m[1])


_cpu_seen = [0.0, None]  # type: list  # (monotonic time, container CPU seconds) at the last search


def _read_first(paths):
    for path in paths:
        try:
            with open(path) as fh:
                return fh.read()
        except OSError:
            continue
    return None


def _cpu_quota():
    """How many CPUs the container's CFS quota allows (cgroup v1 or v2), None if unlimited."""
    quota = _read_first(("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"))
    period = _read_first(("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"))
    try:
        if quota is not None and period is not None:
            q = int(quota)
            return q / float(int(period)) if q > 0 else None
        v2 = _read_first(("/sys/fs/cgroup/cpu.max",))
        if v2 is not None:
            q2, p2 = v2.split()[:2]
            return None if q2 == "max" else int(q2) / float(int(p2))
    except ValueError:
        pass
    return None


def _cpu_used():
    """CPU seconds the container has used so far (cgroup v1 or v2), or None."""
    v1 = _read_first(("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage"))
    try:
        if v1 is not None:
            return int(v1) / 1e9
        v2 = _read_first(("/sys/fs/cgroup/cpu.stat",))
        if v2 is not None:
            for line in v2.splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    except ValueError:
        pass
    return None


def _search_threads():
    """ripgrep's thread count: every core the container may run on (at most 4), unless
    the container has been using its CPU quota lately (the previous search a moment ago:
    searches back to back), when more threads would only run into the quota and be
    throttled; then as many as the quota allows."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    cores = max(1, min(cores, 4))
    quota = _cpu_quota()
    if quota is None or cores == 1:
        return cores
    now = time.monotonic()
    used = _cpu_used()
    last_t, last_used = _cpu_seen
    _cpu_seen[0], _cpu_seen[1] = now, used
    if used is None or last_used is None or now - last_t > 0.25:
        return cores
    rate = (used - last_used) / max(now - last_t, 1e-3)  # CPUs in use since the last search
    if rate > quota / 2.0:
        return max(1, min(cores, int(quota)))
    return cores


def _rg_command():
    """How to run ripgrep: the agent runtime's own copy (through the runtime's loader, so
    it runs in any image), else the image's ``rg`` on its PATH, else None (the search
    falls back to Python)."""
    lib = os.path.join(sys.prefix, "lib")
    loader, rg = os.path.join(lib, "loader"), os.path.join(sys.prefix, "bin", "rg")
    if os.access(loader, os.X_OK) and os.access(rg, os.X_OK):
        return [loader, "--library-path", lib, rg]
    found = shutil.which("rg", path=state.image_env.get("PATH") or BASE_ENV["PATH"])
    return [found] if found else None


def _search_rg(rg, pattern, target, glob, exclude, max_matches, ignore_case):
    argv = list(rg) + [
        "--no-config",
        "--line-number",
        "--with-filename",
        "--no-heading",
        "--null",
        "--color",
        "never",
        "--no-ignore",
        "--hidden",
        "--no-messages",
        "--max-columns",
        "500",
        "--max-columns-preview",
        # No --max-filesize: it costs ripgrep an extra stat per file, ~20% of a search of
        # many small files; a huge file is bounded by the search's timeout instead.
    ]
    # Threads: ripgrep sizes its pool by the CPU *quota* (one thread under the default
    # 1-CPU limit), but a quota caps CPU time per 100 ms period, not parallelism: a search
    # is a burst well inside one period, so it may use every core the container can run
    # on and still stay within its quota (5,000 files: ~47 ms on one thread, ~30 on two),
    # unless the quota is being used up already (see _search_threads).
    argv += ["--threads", str(_search_threads())]
    if ignore_case:
        argv.append("--ignore-case")
    if glob:
        argv += ["--glob", glob]
    # One alternation glob: ripgrep matches every path against every glob, and nine
    # separate "!name" globs cost more than the search itself on a 5,000-file tree.
    plain = sorted(ex for ex in exclude if not any(c in ex for c in ",{}[]*?\\!"))
    if plain:
        argv += ["--glob", "!{%s}" % ",".join(plain)]
    for ex in sorted(set(exclude) - set(plain)):
        argv += ["--glob", "!" + ex]
    # --regexp makes a pattern that starts with "-" a pattern, never an option; "--" ends options.
    argv += ["--regexp", pattern, "--", target]
    proc = subprocess.Popen(
        argv,
        cwd=state.ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(BASE_ENV),
        close_fds=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    with _foreign_lock:
        _foreign_pids.add(proc.pid)
    matches = []  # type: list
    truncated = False
    carry = b""  # a file name holding newlines arrives over several lines, before its NUL
    try:
        for raw in proc.stdout:
            if len(matches) >= max_matches:
                truncated = True
                break
            fname, sep, rest = raw.partition(b"\x00")
            if not sep:
                carry += raw
                continue
            fname, carry = carry + fname, b""
            lineno, _, text = rest.partition(b":")
            try:
                n = int(lineno)
            except ValueError:
                continue
            name = fname.decode("utf-8", "surrogateescape")  # exact: the host quotes odd names
            if name.startswith("./"):
                name = name[2:]
            matches.append([name, n, text.rstrip(b"\r\n").decode("utf-8", "replace")])
        if truncated:
            proc.kill()
        err = proc.stderr.read(65536).decode("utf-8", "replace")
        code = proc.wait()
    finally:
        with _foreign_lock:
            _foreign_pids.discard(proc.pid)
        proc.stdout.close()
        proc.stderr.close()
    if code == 2 and not matches and ("regex" in err.lower() or "parse error" in err.lower()):
        msg = err.strip().splitlines()
        raise Refused("invalid_pattern", "Invalid regex %r: %s" % (pattern, " ".join(m.strip() for m in msg[-4:])))
    return matches, truncated


def _search_py(pattern, dfd, prefix, glob, exclude, max_matches, ignore_case):
    try:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise Refused("invalid_pattern", "Invalid regex %r: %s" % (pattern, e))
    matches = []  # type: list
    state = {"truncated": False}
    files = []
    counter = [0, False]

    def visit(e, rel, d, is_dir):
        if is_dir:
            return
        if glob and not (fnmatch.fnmatch(e.name, glob) or fnmatch.fnmatch(rel, glob)):
            return
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_size <= 50 << 20:
            files.append(rel)

    _walk(dfd, "", 1, None, exclude, visit, counter, 1 << 30)
    for rel in files:
        try:
            f = os.open(rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            continue
        with os.fdopen(f, "rb") as fh:
            head = fh.read(8192)
            if b"\x00" in head:
                continue
            fh.seek(0)
            for n, raw in enumerate(fh, 1):
                # str matching, so "." is one character, not one byte of UTF-8
                line = raw.decode("utf-8", "surrogateescape")
                if rx.search(line):
                    if len(matches) >= max_matches:
                        state["truncated"] = True
                        return matches, True
                    text = raw.rstrip(b"\r\n")[:2000].decode("utf-8", "replace")[:500]
                    matches.append([prefix + rel, n, text])
    return matches, state["truncated"]


def op_search(req):
    pattern = req.get("pattern")
    if not isinstance(pattern, str) or pattern == "":
        raise Refused("invalid_pattern", "Invalid regex: the pattern is empty")
    path = req.get("path", ".")
    glob = req.get("glob") or None
    exclude = set(req.get("exclude") or ())
    max_matches = max(1, min(int(req.get("max_matches", 200)), 10000))
    ignore_case = bool(req.get("ignore_case"))
    fd, name, parts, st = paths.resolve(path)
    try:
        if st is None:
            raise Refused("not_found", "Not found: %s" % path)
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise Refused("not_a_file", "Cannot search %s: it is %s" % (path, paths.kind_name(st.st_mode)))
    finally:
        os.close(fd)
    # Matches come back sorted by path and line. ripgrep's threads finish files in no
    # fixed order, so more than asked for is collected and the first ``max_matches`` in
    # that order are kept: the answer is the same on every run unless there are over ten
    # times as many matches as asked for (then it is some ``max_matches`` of them).
    collect = min(max_matches * 10, 20000)
    rg = _rg_command() if not req.get("force_python") else None
    if rg:
        target = "./" + paths.rel(parts) if parts else "."
        matches, truncated = _search_rg(rg, pattern, target, glob, exclude, collect, ignore_case)
        engine = "ripgrep"
    else:
        if stat.S_ISREG(st.st_mode):
            dfd, _ = paths.open_dir(paths.rel(parts[:-1]))
            prefix = paths.rel(parts[:-1]) + "/" if len(parts) > 1 else ""
            glob = parts[-1]
        else:
            dfd, _ = paths.open_dir(path)
            prefix = paths.rel(parts) + "/" if parts else ""
        try:
            matches, truncated = _search_py(pattern, dfd, prefix, glob, exclude, collect, ignore_case)
        finally:
            os.close(dfd)
        engine = "python"
    matches.sort(key=_match_order)
    if len(matches) > max_matches:
        del matches[max_matches:]
        truncated = True
    return {"matches": matches, "truncated": truncated, "engine": engine}


# --------------------------------------------------------------------------- exec


class _Capped(object):
    """Keeps the first and last ``cap/2`` bytes of a stream; memory stays bounded."""

    def __init__(self, cap):
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = collections.deque()  # type: collections.deque
        self.tail_len = 0
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(bytes(chunk))
            self.tail_len += len(chunk)
            while self.tail_len - len(self.tail[0]) >= self.tail_cap:
                self.tail_len -= len(self.tail.popleft())

    def value(self):
        tail = b"".join(self.tail)
        if len(tail) > self.tail_cap:
            tail = tail[len(tail) - self.tail_cap :]
        kept = len(self.head) + len(tail)
        if kept >= self.total:
            return bytes(self.head) + tail, False
        marker = ("\n[... %d bytes omitted ...]\n" % (self.total - kept)).encode()
        return bytes(self.head) + marker + tail, True


def _proc_table():
    """{pid: (ppid, session, pgrp, starttime)} for every visible process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        try:
            rest = data[data.rindex(b")") + 2 :].split()
            table[int(name)] = (int(rest[1]), int(rest[3]), int(rest[2]), int(rest[19]))
        except (ValueError, IndexError):
            continue
    return table


def _start_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _call_marker(pid):
    """The LOOM_CALL value in a process's environment, '' if none, None if unreadable."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env = fh.read()
    except OSError:
        return None
    for item in env.split(b"\x00"):
        if item.startswith(b"LOOM_CALL="):
            return item[10:].decode("ascii", "replace")
    return ""


def _command_pids(ctx):
    """Every process the current command started.

    With the child-subreaper bit (runc) that is exactly this agent's process subtree:
    orphans come back to us. Where the kernel lacks it (gVisor), orphans go to PID 1, so
    we also take, among processes started after the command: those still in its session
    or process group, those carrying its LOOM_CALL marker, and orphans of PID 1 that carry
    no other call's marker (``setsid`` + ``env -i`` + double fork ends up there).
    """
    me = os.getpid()
    table = _proc_table()
    children = {}  # type: dict
    for pid, info in table.items():
        children.setdefault(info[0], []).append(pid)
    with _foreign_lock:
        spare = set(_foreign_pids)
    spare.add(me)
    spare.add(1)
    found = set()
    todo = [c for c in children.get(me, []) if c not in spare]
    if ctx is not None and not state.subreaper:
        sid, start, marker = ctx
        for pid, (ppid, session, pgrp, ticks) in table.items():
            if pid in spare or ppid == 0 or ticks < start:
                continue
            if session == sid or pgrp == sid:
                todo.append(pid)
                continue
            mark = _call_marker(pid)
            if mark == marker or (ppid == 1 and mark in ("", None)):
                todo.append(pid)
    while todo:
        pid = todo.pop()
        if pid in found or pid in spare:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def _reap(pids):
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


def _signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _no_children():
    """True when this agent has no child process at all (any thread's, zombies included):
    one ``waitid`` instead of reading every thread's children file."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    except (AttributeError, OSError):
        pass
    return False


def _own_children():
    """Direct children of this agent (all threads), or None when the kernel cannot say."""
    if _no_children():
        return set()
    kids = set()  # type: set[int]
    try:
        for tid in os.listdir("/proc/self/task"):
            with open("/proc/self/task/%s/children" % tid) as fh:
                kids.update(int(p) for p in fh.read().split())
    except (OSError, ValueError):
        return None
    with _foreign_lock:
        return kids - _foreign_pids


def _kill_tree(grace, ctx=None):
    """Kill every process the command started (TERM, ``grace`` seconds, then KILL).
    Returns True when nothing was left to kill (as subreaper: no child at all)."""
    if state.subreaper and _own_children() == set():
        return True  # fast path: as subreaper, no child means nothing of the command is left
    pids = _command_pids(ctx)
    if not pids:
        return False
    if grace > 0:
        _signal_all(pids, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            _reap(pids)
            pids = _command_pids(ctx)
            if not pids:
                return False
            time.sleep(0.02)
    for _ in range(500):
        pids = _command_pids(ctx)
        if not pids:
            return False
        _signal_all(pids, signal.SIGSTOP)  # freeze first so a fork bomb cannot outrun us
        _signal_all(pids, signal.SIGKILL)
        _reap(pids)
        time.sleep(0.002)


def _oom_kills():
    for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None


def _command_env_cwd(req):
    """The environment (the image's, then the non-interactive base, then the caller's
    valid strings) and the real working directory (resolved inside the workspace) for a
    process the host asks for."""
    env = dict(state.image_env)
    env.update(BASE_ENV)
    if state.image_env.get("PATH"):
        env["PATH"] = state.image_env["PATH"]  # the image's own PATH (/usr/local/go/bin, ...)
    env["HOME"] = os.environ.get("HOME", "/tmp")
    env["USER"] = env["LOGNAME"] = os.environ.get("USER", "sandbox")
    for k, v in (req.get("env") or {}).items():
        if isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v:
            env[k] = v
    cwd_fd, parts = paths.open_dir(req.get("cwd", "."))
    os.close(cwd_fd)
    return env, state.ROOT + ("/" + "/".join(parts) if parts else "")


def op_exec(req):
    command = req.get("command")
    argv = req.get("argv")
    if argv is not None:
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise Refused("invalid", "argv must be a non-empty list of strings")
    elif not isinstance(command, str) or not command.strip():
        raise Refused("invalid", "Empty command")
    timeout = float(req.get("timeout", 60))
    cap = int(req.get("max_output", 256 * 1024))
    hard_limit = int(req.get("output_limit", 64 << 20))
    env, cwd = _command_env_cwd(req)
    scan_req = req.get("scan")
    if isinstance(scan_req, dict):
        # The scans bracketing the command travel with it. Run only if the tree is known
        # unchanged since the host's last scan; otherwise hand that scan back unrun, so
        # the host records outside changes before the command can touch the same files.
        pre = op_scan(scan_req)
        if not (pre.get("from_events") and not pre["entries"] and not pre["removed"]):
            return {"ran": False, "scan": pre}
        scan_req = dict(scan_req)
        scan_req["since"] = pre["generation"]
    else:
        scan_req = None
    result = _run_command(req, command, argv, timeout, cap, hard_limit, env, cwd)
    if scan_req is not None:
        try:
            result["scan"] = op_scan(scan_req)
        except Exception:
            pass  # the host's next scan (a full diff) catches up
    return result


def _run_command(req, command, argv, timeout, cap, hard_limit, env, cwd):
    marker = os.urandom(8).hex()
    env["LOOM_CALL"] = marker
    with _exec_lock:
        oom_before = _oom_kills()
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv or ["/bin/sh", "-c", command],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            return {
                "exit_code": 127,
                "stdout": "",
                "stderr": channel.b64(("%s\n" % e).encode()),
                "outcome": "exit",
                "duration_ms": 0.0,
                "truncated": False,
                "signal": None,
                "stdout_bytes": 0,
                "stderr_bytes": 0,
            }
        assert proc.stdout is not None and proc.stderr is not None
        # The start time is only needed where orphans are hunted by heuristics (gVisor).
        ctx = (proc.pid, 0 if state.subreaper else (_start_ticks(proc.pid) or 0), marker)
        try:
            # The OOM killer must pick the command, never the agent.
            with open("/proc/%d/oom_score_adj" % proc.pid, "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        out_buf, err_buf = _Capped(cap), _Capped(cap)
        bufs = {proc.stdout.fileno(): out_buf, proc.stderr.fileno(): err_buf}
        sel = selectors.DefaultSelector()
        for f in (proc.stdout, proc.stderr):
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ)
        deadline = started + timeout
        outcome = None
        disk = _DiskWatch(started) if (state.DISK_LIMIT or state.DISK_RESERVE or state.INODE_LIMIT) else None
        exited_at = None
        open_fds = set(bufs)
        last_touch = started
        while open_fds:
            now = time.monotonic()
            if now >= deadline:
                outcome = "timeout"
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > LINGER_AFTER_EXIT:
                break  # a background child still holds the pipe: do not wait for it
            if now - last_touch > 30:
                activity.touch()
                last_touch = now
            if disk is not None and disk.exceeded(now):
                outcome = "disk_limit"
                break
            wait = min(deadline - now, DISK_POLL if exited_at is None else LINGER_AFTER_EXIT)
            if now - started < SPIN_WINDOW:
                wait = 0
                _sched_yield()
            for key, _ in sel.select(max(wait, 0)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    open_fds.discard(key.fd)
                    continue
                bufs[key.fd].add(chunk)
            if sum(b.total for b in bufs.values()) > hard_limit:
                outcome = "output_limit"
                break
        while outcome is None and proc.poll() is None:
            # Its output is closed but it still runs: wait for it, watching the disk.
            now = time.monotonic()
            if now >= deadline:
                outcome = "timeout"
            elif disk is not None and disk.exceeded(now):
                outcome = "disk_limit"
            else:
                try:
                    proc.wait(min(deadline - now, DISK_POLL) if disk is not None else deadline - now)
                except subprocess.TimeoutExpired:
                    pass
        clean = _kill_tree(KILL_GRACE if outcome == "timeout" else 0, ctx)
        # Drain what is left in the pipes now that every writer is dead.
        for fd in list(open_fds):
            try:
                while True:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    bufs[fd].add(chunk)
                    if bufs[fd].total > hard_limit * 2:
                        break
            except OSError:
                pass
        sel.close()
        code = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        if not clean and not (state.subreaper and _own_children() == set()):
            _reap(_command_pids(ctx))
        duration = (time.monotonic() - started) * 1000.0
        sig = None
        exit_code = code  # type: int | None
        if code < 0:
            sig = -code
            exit_code = None
        if outcome is None:
            # The OOM killer sends SIGKILL, to the command or to a child (sh then exits 137).
            killed = sig == signal.SIGKILL or (exit_code is not None and exit_code > 128)
            oom_after = _oom_kills() if killed else None
            if oom_before is not None and oom_after is not None and oom_after > oom_before:
                outcome = "oom"
            elif sig is not None:
                outcome = "signal"
            else:
                outcome = "exit"
        if outcome in ("timeout", "output_limit", "disk_limit"):
            exit_code = None
        out, t1 = out_buf.value()
        err, t2 = err_buf.value()
        return {
            "exit_code": exit_code,
            "stdout": channel.b64(out),
            "stderr": channel.b64(err),
            "outcome": outcome,
            "duration_ms": duration,
            "truncated": bool(t1 or t2),
            "signal": sig,
            "stdout_bytes": out_buf.total,
            "stderr_bytes": err_buf.total,
            "disk_used": disk.used if disk is not None and outcome == "disk_limit" else None,
        }


# --------------------------------------------------------------------------- spawn
#
# Long-lived processes with streamed stdio (a stdio MCP server, a language server). Their
# output travels as unsolicited events {"event": "stdout"|"exit", "proc": pid, ...}. They
# are spared by the per-command tree kill and killed when the host closes the stream.

_procs = {}  # type: dict
_procs_lock = threading.Lock()
MAX_PROCS = 16


def _pump(proc, announced):
    pid = proc.pid
    err = _Capped(64 * 1024)
    # No event before the host has the spawn's answer (and so its handler): it would be
    # dropped as being about an unknown process.
    announced.wait(30)

    def drain_err():
        while True:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                return
            err.add(chunk)

    t = threading.Thread(target=drain_err, daemon=True)
    t.start()
    fd = proc.stdout.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        channel.send({"event": "stdout", "proc": pid, "data": channel.b64(chunk)})
    code = proc.wait()
    t.join(1.0)
    with _procs_lock:
        _procs.pop(pid, None)
    with _foreign_lock:
        _foreign_pids.discard(pid)
    tail, _ = err.value()
    channel.send({"event": "exit", "proc": pid, "code": code, "stderr": channel.b64(tail)})


def op_spawn(req):
    argv = req.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Refused("invalid", "argv must be a non-empty list of strings")
    with _procs_lock:
        if len(_procs) >= MAX_PROCS:
            raise Refused("too_large", "Too many long-lived processes (max %d)" % MAX_PROCS)
    env, cwd = _command_env_cwd(req)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise Refused("not_found", "Cannot start %s: %s" % (argv[0], e.strerror or e))
    with _foreign_lock:
        _foreign_pids.add(proc.pid)
    with _procs_lock:
        _procs[proc.pid] = proc
    announced = threading.Event()
    threading.Thread(target=_pump, args=(proc, announced), daemon=True).start()
    return {"proc": proc.pid, "_after_send": announced.set}


def _get_proc(req):
    with _procs_lock:
        proc = _procs.get(req.get("proc"))
    if proc is None:
        raise Refused("not_found", "No such process")
    return proc


def op_stdin(req):
    proc = _get_proc(req)
    data = base64.b64decode(req.get("data") or "")
    try:
        if data:
            proc.stdin.write(data)
            proc.stdin.flush()
        if req.get("close"):
            proc.stdin.close()
    except (BrokenPipeError, ValueError):
        raise Refused("conflict", "The process no longer reads its input")
    return {"written": len(data)}


def _kill_subtree(root, grace):
    """TERM then KILL a process and everything below it."""

    def tree():
        table = _proc_table()
        kids = {}  # type: dict
        for pid, info in table.items():
            kids.setdefault(info[0], []).append(pid)
        out, todo = [], [root] if root in table else []
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(kids.get(pid, []))
        return out

    pids = tree()
    _signal_all(pids, signal.SIGTERM)
    end = time.monotonic() + grace
    while pids and time.monotonic() < end:
        time.sleep(0.02)
        pids = [p for p in tree() if _proc_table().get(p, (0, 0, 0, 0))[0] != 0 or p == root]
        if all(_is_zombie(p) for p in pids):
            break
    for _ in range(100):
        pids = [p for p in tree() if not _is_zombie(p)]
        if not pids:
            return
        _signal_all(pids, signal.SIGKILL)
        time.sleep(0.005)


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] == b"Z"
    except (OSError, ValueError):
        return True


def op_kill(req):
    proc = _get_proc(req)
    _kill_subtree(proc.pid, float(req.get("grace", 0.5)))
    return {"killed": True}


# --------------------------------------------------------------------------- main loop


def op_direct(req):
    """Offer the host the direct channel (see ``channel.offer_direct``)."""
    return channel.offer_direct(_serve_direct)


def _serve_direct(reader):
    """Serve the direct channel; when the host leaves it, the agent's work is over."""
    _serve(reader)
    _host_gone()
    if not state.keeper_ttl:
        os._exit(0)


FAST_OPS = {
    "hello": op_hello,
    "read": op_read,
    "write": op_write,
    "remove": op_remove,
    "mkdir": op_mkdir,
    "chmod": op_chmod,
    "symlink": op_symlink,
    "stat": op_stat,
    "hash": op_hash,
    "commit": op_commit,
    "abort": op_abort,
}
SLOW_OPS = {
    "direct": op_direct,
    "list": op_list,
    "remove_tree": op_remove_tree,
    "scan": op_scan,
    "search": op_search,
    "exec": op_exec,
    "spawn": op_spawn,
    "stdin": op_stdin,
    "kill": op_kill,
}


def _handle(req):
    rid = req.get("id")
    op = req.get("op")
    fn = FAST_OPS.get(op) or SLOW_OPS.get(op)
    after = None
    try:
        if fn is None:
            raise Refused("invalid", "Unknown op %r" % (op,))
        result = fn(req)
        after = result.pop("_after_send", None) if isinstance(result, dict) else None
        resp = {"id": rid, "ok": True, "result": result}
    except Exception as e:  # never let one request kill the agent
        resp = error_answer(rid, e)
    channel.send(resp)
    if after is not None:
        after()


_work = queue.Queue()  # type: queue.Queue
_idle = [0]
_idle_lock = threading.Lock()


def _worker():
    while True:
        req = _work.get()
        _handle(req)
        with _idle_lock:
            _idle[0] += 1


def _dispatch_slow(req):
    """Slow ops run on reusable worker threads (a new thread per call costs ~0.1 ms);
    one more thread is started whenever every worker is busy, so nothing waits."""
    with _idle_lock:
        if _idle[0] > 0:
            _idle[0] -= 1
            start = False
        else:
            start = True
    if start:
        threading.Thread(target=_worker, daemon=True).start()
    _work.put(req)


def main(config):
    state.configure(config)
    channel.open_stdout(sys.stdout.buffer)
    state.subreaper = _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of commands come back to us
    _prctl(4, 0)  # PR_SET_DUMPABLE=0: commands (same uid) cannot open /proc/<agent>/fd to forge replies
    os.umask(0o022)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    stdin = sys.stdin.buffer
    keeper_ttl = state.keeper_ttl
    if keeper_ttl:
        activity.touch()
        threading.Thread(target=activity.keeper, args=(float(keeper_ttl),), daemon=True).start()
    channel.send({"id": 0, "ok": True, "result": op_hello({})})
    _serve(stdin)
    _host_gone()
    if keeper_ttl:
        # The container's main process: stay as its keeper until the idle TTL ends it.
        threading.Event().wait()


_gone_lock = threading.Lock()


def _serve(reader):
    """Read requests until EOF: fast ops inline, slow ones on worker threads."""
    while True:
        line = reader.readline()
        if not line:
            return
        activity.touch()
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("request is not an object")
        except ValueError as e:
            channel.send({"id": None, "ok": False, "code": "invalid", "error": "Malformed request: %s" % e})
            continue
        if req.get("op") in SLOW_OPS:
            _dispatch_slow(req)
        else:
            _handle(req)


def _host_gone():
    """The host went away (either channel ended): leave nothing running behind us, and no
    staged temporary."""
    with _gone_lock:
        _drop_staged()
        _tidy_drain(5.0)
        with _procs_lock:
            spawned = list(_procs)
        for pid in spawned:
            _kill_subtree(pid, 0.2)
        _kill_tree(0)


def run(argv=None):
    """Run the agent: the config from ``argv`` (``[root]``, when run by hand as
    ``python3 -m sandbox.agent ROOT``) or else from the first line on stdin."""
    if argv:
        cfg = {"root": argv[0]}
    else:
        cfg = json.loads(sys.stdin.buffer.readline() or b"{}")
    try:
        main(cfg)
    except KeyboardInterrupt:
        pass
