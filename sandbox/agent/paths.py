"""Paths inside the workspace, resolved from the root's descriptor.

Every path an operation names is walked component by component from an O_PATH
descriptor of the workspace root (``state.ROOT_FD``): ``..`` is handled lexically and
may not leave the root, a symlink is followed only while its target stays inside the
workspace (one hop at a time, restarting from the root), and FIFOs, sockets and devices
are refused before any open that could block. Nothing here takes a path string to the
kernel from the root down: every open is relative to a descriptor already checked.
"""

import errno
import os
import stat

from . import state
from .errors import Refused


def type_of(mode):
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def kind_name(mode):
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def split(path):
    """Workspace-relative components of ``path``; ``..`` handled lexically."""
    if not isinstance(path, str):
        raise Refused("invalid", "path must be a string")
    if "\x00" in path:
        raise Refused("escape", "path contains a NUL byte")
    p = path
    if p == state.ROOT or p.startswith(state.ROOT + "/"):
        p = p[len(state.ROOT) :]
    elif p.startswith("/"):
        raise Refused("escape", "Path %r is outside the workspace" % path)
    parts = []  # type: list[str]
    for comp in p.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                raise Refused("escape", "Path %r escapes the workspace" % path)
            parts.pop()
        else:
            parts.append(comp)
    return parts


def walk_parts(path):
    """The components of ``path`` for ``resolve``, and whether it must name a directory.

    Unlike ``split``, ``..`` is kept: ``resolve`` takes it against the directory reached,
    as the kernel does (``link/..`` is the parent of the link's target, ``file/..`` is
    ENOTDIR, ``missing/..`` ENOENT), so a path means what it means to the shell in the
    sandbox. A trailing ``/``, ``/.`` or ``/..`` says the last component must be a
    directory (POSIX: ``a.txt/`` is ENOTDIR)."""
    if not isinstance(path, str):
        raise Refused("invalid", "path must be a string")
    if "\x00" in path:
        raise Refused("escape", "path contains a NUL byte")
    p = path
    if p == state.ROOT or p.startswith(state.ROOT + "/"):
        p = p[len(state.ROOT) :]
    elif p.startswith("/"):
        raise Refused("escape", "Path %r is outside the workspace" % path)
    comps = [c for c in p.split("/") if c not in ("", ".")]
    tail = p.rstrip("/").rpartition("/")[2]
    must_dir = bool(comps) and (p.endswith("/") or tail in (".", ".."))
    return comps, must_dir


def rel(parts):
    return "/".join(parts) if parts else "."


def read_link(name, dir_fd):
    """The target of link ``name`` in ``dir_fd``, or None when it is no longer a link
    (replaced or removed by a process in the sandbox between the caller's lstat and
    now: readlink then fails with EINVAL or ENOENT, and the caller looks again)."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOENT):
            return None
        raise


#: How a directory on the way is entered: never through a symlink, never anything else.
_ENTER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def resolve(path, follow_last=True, create_dirs=False):
    """Walk ``path`` from the workspace root without ever leaving it.

    Returns ``(dir_fd, name, parts, st)``: an O_PATH descriptor of the parent directory
    (the caller closes it), the final component's name (None for the root itself), the
    resolved workspace-relative components and the final component's lstat (None when
    it does not exist). Symlinks whose target stays inside the workspace are followed,
    one hop at a time, by restarting the walk from the root; any other is refused. ``..``
    is the parent of the directory reached (``walk_parts``), and a path with a trailing
    slash must name a directory. Raises Refused: escape, not_found (a missing directory
    on the way), not_a_directory (a file on the way, or a file named with a trailing
    slash).
    """
    stack, must_dir = walk_parts(path)
    if must_dir:
        follow_last = True  # "link/" names what the link points to
    cur = []  # type: list[str]
    hops = 0
    fd = os.dup(state.ROOT_FD)
    try:
        while stack:
            comp = stack.pop(0)
            last = not stack
            if comp == "..":
                # The parent of the directory reached (every component before this one
                # was checked to be a directory and entered): walk to it again from the
                # root, as a link's target is walked.
                if not cur:
                    raise Refused("escape", "Path %r escapes the workspace" % path)
                stack = cur[:-1] + stack
                cur = []
                os.close(fd)
                fd = os.dup(state.ROOT_FD)
                continue
            if not last:
                # The usual case first: a directory on the way, entered with one call (no
                # lstat before it). O_NOFOLLOW with O_DIRECTORY fails on a symlink or
                # anything but a directory; then the lstat below says which it was.
                try:
                    nfd = os.open(comp, _ENTER, dir_fd=fd)
                except OSError:
                    pass
                else:
                    os.close(fd)
                    fd = nfd
                    cur.append(comp)
                    continue
            try:
                st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    return fd, comp, cur + [comp], None
                if not create_dirs:
                    raise Refused("not_found", "Not found: %s (no directory %s)" % (path, rel(cur + [comp])))
                try:
                    os.mkdir(comp, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode) and (follow_last or not last):
                hops += 1
                if hops > 40:
                    raise Refused("escape", "Too many levels of symbolic links in %r" % path)
                target = read_link(comp, fd)
                if target is None:
                    # Replaced (or removed) by another process since the lstat: look again.
                    stack.insert(0, comp)
                    continue
                if target.startswith("/"):
                    try:
                        base = split(target)
                    except Refused:
                        raise Refused(
                            "escape",
                            "Path %r goes through a symlink (%s -> %s) that leaves the workspace"
                            % (path, rel(cur + [comp]), target),
                        ) from None
                else:
                    base = list(cur)
                    for t in target.split("/"):
                        if t in ("", "."):
                            continue
                        if t == "..":
                            if not base:
                                raise Refused(
                                    "escape",
                                    "Path %r goes through a symlink (%s -> %s) that leaves the workspace"
                                    % (path, rel(cur + [comp]), target),
                                )
                            base.pop()
                        else:
                            base.append(t)
                stack = base + stack
                cur = []
                os.close(fd)
                fd = os.dup(state.ROOT_FD)
                continue
            if last:
                if must_dir and not stat.S_ISDIR(st.st_mode):
                    raise Refused("not_a_directory", "Not a directory: %s" % path)
                return fd, comp, cur + [comp], st
            if not stat.S_ISDIR(st.st_mode):
                raise Refused("not_a_directory", "Not a directory: %s" % rel(cur + [comp]))
            try:
                nfd = os.open(comp, _ENTER, dir_fd=fd)
            except OSError as e:
                # Swapped for a link or a file between the lstat and the open.
                raise Refused("escape", "Path %r changed while being resolved (%s)" % (path, e.strerror))
            os.close(fd)
            fd = nfd
            cur.append(comp)
        return fd, None, cur, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def open_dir(path):
    """A readable (not O_PATH) descriptor of directory ``path`` and its components."""
    fd, name, parts, st = resolve(path)
    try:
        if name is None:
            return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd), parts
        if st is None:
            raise Refused("not_found", "Not found: %s" % path)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused("not_a_directory", "Not a directory: %s" % path)
        try:
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd), parts
        except OSError as e:
            raise Refused("escape", "Directory %r changed while being opened (%s)" % (path, e.strerror))
    finally:
        os.close(fd)


def open_file(dir_fd, name, st, path):
    """Open a regular file for reading; refuse anything else before a blocking open."""
    if st is None:
        raise Refused("not_found", "File not found: %s" % path)
    if not stat.S_ISREG(st.st_mode):
        raise Refused("not_a_file", "Not a file: %s is %s" % (path, kind_name(st.st_mode)))
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise Refused("not_found", "File not found: %s" % path)
        if e.errno == errno.EACCES:
            raise Refused("permission", "Permission denied: %s" % path)
        raise Refused("escape", "File %r changed while being opened (%s)" % (path, e.strerror))
    fst = os.fstat(f)
    if not stat.S_ISREG(fst.st_mode) or fst.st_ino != st.st_ino:
        os.close(f)
        raise Refused("escape", "File %r changed while being opened" % path)
    return f, fst


def open_below(base_fd, relpath):
    """A readable descriptor of directory ``relpath`` under ``base_fd``, following no link
    at all (a component swapped for a symlink means the directory is gone), or None."""
    fd = os.dup(base_fd)
    try:
        for comp in relpath.split("/"):
            if not comp:
                continue
            nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except OSError:
        os.close(fd)
        return None
