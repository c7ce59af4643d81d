"""Files anywhere in the sandbox, for a harness: ``fs_read``, ``fs_write``, ``fs_append``.

The model's file tools stay inside the workspace (``files``, ``write``: resolved from the
root's descriptor, links out of it refused, every change recorded by the host first). A
harness (an evaluation framework driving the sandbox) reads what the sandbox's user can
read and writes where that user can write: ``/tmp``, ``$HOME``, the workspace; the rest
of the root file system is read-only. Here the kernel is the judge: a path is opened as
the shell opens it, as this process's user, links followed (they cannot lead out of the
container: its file system is all there is), so a 0444 file, another user's directory or
a read-only mount refuse exactly as ``cat`` and ``>`` would, and an existing file is
rewritten in place as ``>`` rewrites it (its owner, mode and links kept).

A write whose directory turns out to be inside the workspace is not made here: it is
refused with code ``in_workspace`` and the workspace-relative path as its message, so
the host writes it through the changelog like any change of the workspace.
"""

import errno
import os
import stat
import threading
import time

from . import paths, state, write
from .errors import Refused

#: Writes whose content comes in pieces (``more``), by token: (fd, path, size, total, when).
_open = {}  # type: dict
_open_lock = threading.Lock()
OPEN_TTL = 120.0

_CODES = {
    errno.ENOENT: ("not_found", "No such file or directory"),
    errno.EACCES: ("permission", "Permission denied"),
    errno.EPERM: ("permission", "Operation not permitted"),
    errno.EROFS: ("permission", "Read-only file system"),
    errno.ENOTDIR: ("not_a_directory", "Not a directory"),
    errno.EISDIR: ("is_a_directory", "Is a directory"),
    errno.ELOOP: ("not_found", "Too many levels of symbolic links"),
    errno.ENAMETOOLONG: ("invalid", "File name too long"),
    errno.ENOSPC: ("no_space", "No space left on device"),
    errno.EDQUOT: ("no_space", "Disk quota exceeded"),
    errno.EFBIG: ("too_large", "File too large"),
}


def refusal(e, path):
    """``e`` (an OSError about ``path``) as the shell would say it, with its code."""
    code, text = _CODES.get(e.errno, ("os_error", e.strerror or str(e)))
    return Refused(code, "%s: %s" % (text, path))


def _abs(req):
    path = req.get("path")
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise Refused("invalid", "path must be an absolute path without NUL bytes")
    return path


def _kind_check(st, path):
    if stat.S_ISDIR(st.st_mode):
        raise Refused("is_a_directory", "Is a directory: %s" % path)
    if not stat.S_ISREG(st.st_mode):
        raise Refused("not_a_file", "Not a regular file: %s is %s" % (path, paths.kind_name(st.st_mode)))


def op_fs_read(req):
    """``length`` bytes (at most state.MAX_READ) of the file at ``offset``, raw after the
    answer's line, with the file's size and identity (the host reads a large file in
    pieces and checks they all come from one unchanged file). Never opens a FIFO or a
    device (it could block, or never end)."""
    path = _abs(req)
    offset = max(0, int(req.get("offset") or 0))
    length = max(0, min(int(req.get("length", state.MAX_READ)), state.MAX_READ))
    try:
        st = os.stat(path)
    except OSError as e:
        raise refusal(e, path)
    _kind_check(st, path)
    try:
        f = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise refusal(e, path)
    try:
        fst = os.fstat(f)
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise Refused("conflict", "Conflict: %s changed while being opened" % path)
        chunks = []
        pos, left = offset, min(length, max(0, fst.st_size - offset))
        while left > 0:
            chunk = os.pread(f, min(left, 1 << 20), pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
            left -= len(chunk)
        return {
            "size": fst.st_size,
            "dev": fst.st_dev,
            "ino": fst.st_ino,
            "mtime_ns": fst.st_mtime_ns,
            "ctime_ns": fst.st_ctime_ns,
            "_raw": b"".join(chunks),
        }
    finally:
        os.close(f)


def _in_workspace(dir_fd, name):
    """The workspace-relative path of ``name`` in the directory ``dir_fd`` when that
    directory is the workspace or inside it (as the kernel names the open directory,
    whatever links led there), else None."""
    try:
        where = os.readlink("/proc/self/fd/%d" % dir_fd)
    except OSError:
        return None
    root = state.ROOT.rstrip("/") or "/"
    if where == root:
        return name
    if where.startswith(root + "/"):
        return where[len(root) + 1 :] + "/" + name
    return None


def op_fs_write(req):
    """Write the request's content to ``path`` as this process's user: its parents made
    as ``mkdir -p`` would (``mkdirs``, default true), an existing file truncated and
    rewritten in place, a new one created with ``mode`` (default 0o666 less the umask).
    With ``more`` (and ``total``, the whole size) the rest comes in ``fs_append``
    requests; the answer then carries the ``token`` they name.

    Raises Refused: ``in_workspace`` (the message is the workspace-relative path: the
    host writes it through the changelog), ``permission``, ``is_a_directory``,
    ``not_a_file``, ``not_found``, ``too_large``, ``no_space``."""
    path = _abs(req)
    data = write.request_data(req)
    more = bool(req.get("more"))
    total = int(req.get("total") or len(data)) if more else len(data)
    if len(data) > state.MAX_WRITE or total > state.MAX_FILE:
        raise Refused("too_large", "Write of %d bytes exceeds the sandbox's cap" % max(total, len(data)))
    real = os.path.realpath(path)  # the links of the path followed, as the shell's open would
    parent, name = os.path.split(real)
    if not name:
        raise Refused("is_a_directory", "Is a directory: %s" % path)
    if req.get("mkdirs", True):
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise refusal(e, parent)
    try:
        dfd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise refusal(e, parent)
    try:
        inside = _in_workspace(dfd, name)
        if inside is not None:
            raise Refused("in_workspace", inside)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise refusal(e, path)
        if st is not None:
            if stat.S_ISLNK(st.st_mode):
                raise Refused("conflict", "Conflict: %s changed while being written" % path)
            _kind_check(st, path)
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        flags |= os.O_TRUNC if st is not None else os.O_CREAT | os.O_EXCL
        mode = req.get("mode")
        mode = mode & 0o777 if isinstance(mode, int) and not isinstance(mode, bool) else 0o666
        try:
            f = os.open(name, flags, mode, dir_fd=dfd)
        except OSError as e:
            raise refusal(e, path)
    finally:
        os.close(dfd)
    try:
        _write_all(f, data, path)
    except BaseException:
        os.close(f)
        raise
    answer = {"size": len(data), "created": st is None, "path": real}
    if more and len(data) < total:
        token = os.urandom(8).hex()
        with _open_lock:
            _drop(OPEN_TTL)
            _open[token] = (f, path, len(data), total, time.monotonic())
        answer["token"] = token
        return answer
    os.close(f)
    return answer


def op_fs_append(req):
    """More content of an ``fs_write`` made with ``more``, raw after the line; ``last``
    closes the file (its size must then be the announced one). Raises Refused."""
    token = req.get("token")
    data = write.request_data(req)
    with _open_lock:
        item = _open.get(token) if isinstance(token, str) else None
    if item is None:
        raise Refused("invalid", "No write %r taking more content" % (token,))
    f, path, size, total, when = item
    try:
        if size + len(data) > total:
            raise Refused("invalid", "More content than announced for %s" % path)
        _write_all(f, data, path)
    except BaseException:
        with _open_lock:
            if _open.pop(token, None) is not None:
                os.close(f)
        raise
    size += len(data)
    last = bool(req.get("last"))
    with _open_lock:
        if last:
            _open.pop(token, None)
        else:
            _open[token] = (f, path, size, total, when)
    if last:
        os.close(f)
        if size != total:
            raise Refused("invalid", "%s got %d bytes, not the %d announced" % (path, size, total))
    return {"size": size}


def _write_all(f, data, path):
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(f, view) :]
    except OSError as e:
        raise refusal(e, path)


def _drop(older_than):
    """Close pieced writes the host never finished (caller holds the lock)."""
    now = time.monotonic()
    for token in [t for t, item in _open.items() if now - item[4] >= older_than]:
        os.close(_open.pop(token)[0])


def drop_all():
    """When the host goes: close every pieced write left open."""
    with _open_lock:
        _drop(0.0)
