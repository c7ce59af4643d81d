"""Changes to the tree other than file content, most of them the changelog's undo of what a
command did: ``remove``, ``remove_tree``, ``mkdir``, ``chmod`` and ``symlink``. None of
them follows a link out of the workspace."""

import errno
import os
import stat

from . import dirstack, files, paths
from .errors import Refused


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
            files.check_expect(fd, name, st, path, req)
        os.unlink(name, dir_fd=fd)
        return {"removed": True}
    finally:
        os.close(fd)


def rmtree_at(dfd, name, counts):
    """Remove directory ``name`` under ``dfd`` and everything in it, never following a
    link (each level is opened O_NOFOLLOW from its parent's descriptor, so a directory
    swapped for a symlink mid-walk is unlinked as a link, not entered). A directory the
    command made unwritable (0555, as Go's module cache does) is made writable first: we
    own it. Iterative, to any depth (``dirstack``). ``counts`` = [files, dirs, bytes]
    removed. Raises OSError (what could not be removed; ESTALE: a directory was moved
    while the removal was below it)."""
    stack = dirstack.DirStack(dfd)
    try:
        if not _enter(stack, name, counts):
            return
        todo = [_clear(stack.fd(), counts)]
        while todo:
            subs = todo[-1]
            if subs:
                sub = subs.pop()
                if _enter(stack, sub, counts):
                    todo.append(_clear(stack.fd(), counts))
                continue
            todo.pop()
            done = stack.name()
            stack.pop()
            os.rmdir(done, dir_fd=stack.fd())
            counts[1] += 1
    finally:
        stack.close()


def _enter(stack, name, counts):
    """Open directory ``name`` of the stack's top as its new top: True. A name that is no
    directory (any more: swapped for a link or a file) is unlinked as it is, and one gone
    already is left: False."""
    try:
        stack.push(name)
        return True
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
    parent = stack.fd()
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    counts[0] += 1
    counts[2] += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return False


def _clear(sub, counts):
    """Unlink everything but the subdirectories in open directory ``sub`` (made
    writable first); returns the subdirectories' names."""
    st = os.fstat(sub)
    if st.st_mode & 0o700 != 0o700:
        try:
            os.fchmod(sub, stat.S_IMODE(st.st_mode) | 0o700)
        except OSError:
            pass  # not ours: the unlinks below say so
    dirs = []
    with os.scandir(sub) as it:
        entries = list(it)
    for ent in entries:
        if ent.is_dir(follow_symlinks=False):
            dirs.append(ent.name)
            continue
        try:
            size = ent.stat(follow_symlinks=False).st_size if ent.is_file(follow_symlinks=False) else 0
            os.unlink(ent.name, dir_fd=sub)
        except FileNotFoundError:
            continue
        counts[0] += 1
        counts[2] += size
    return dirs


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
                rmtree_at(fd, name, counts)
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
