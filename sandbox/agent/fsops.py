"""Directories anywhere in the sandbox, for a harness: ``fs_stat``, ``fs_list``,
``fs_mkdir``, ``fs_move``, ``fs_remove`` (E2B's filesystem service is served with them).

As ``sysfiles`` does for file content, these take absolute paths and run as this
process's user, the kernel judging what that user may do; links are followed where the
shell's tools follow them (``mkdir -p``, ``mv``, ``rm -rf`` never follow the last
component). An entry is described with its link's own facts (size, times, owner) and
its target's type and permission bits, as E2B's envd describes one.

A change that touches the workspace is made only when the host says it records it
(``recorded``: it brackets the request with its change scans, so the changelog has it);
otherwise it is refused with code ``in_workspace`` and nothing changes, so that no
change of the workspace escapes the changelog through a link.
"""

import errno
import grp
import os
import pwd
import stat

from . import state, sysfiles, tree
from .errors import Refused

#: Most entries one listing returns (a JSON answer stays well under the line limit).
MAX_ENTRIES = 100000

_CODES = {
    errno.EEXIST: "exists",
    errno.ENOTEMPTY: "exists",
    errno.EXDEV: "invalid",
    errno.EINVAL: "invalid",
    errno.EBUSY: "conflict",
}


def _refusal(e, path):
    code = _CODES.get(e.errno)
    if code is None:
        return sysfiles.refusal(e, path)
    return Refused(code, "%s: %s" % (e.strerror or e, path))


def _abs(req, key="path"):
    path = req.get(key)
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise Refused("invalid", "%s must be an absolute path without NUL bytes" % key)
    return os.path.normpath(path) if path != "/" else path


def _kind(mode):
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "other"


class _Names(object):
    """User and group names by id, looked up once per request."""

    def __init__(self):
        self.users = {}  # type: dict
        self.groups = {}  # type: dict

    def user(self, uid):
        if uid not in self.users:
            try:
                self.users[uid] = pwd.getpwuid(uid).pw_name
            except (KeyError, OSError):
                self.users[uid] = str(uid)
        return self.users[uid]

    def group(self, gid):
        if gid not in self.groups:
            try:
                self.groups[gid] = grp.getgrgid(gid).gr_name
            except (KeyError, OSError):
                self.groups[gid] = str(gid)
        return self.groups[gid]


def entry_of(path, names, st=None):
    """The description of the entry at ``path`` (not following it when it is a link).
    Raises FileNotFoundError when nothing is there, OSError."""
    if st is None:
        st = os.lstat(path)
    out = {
        "name": os.path.basename(path) or "/",
        "size": st.st_size,
        "mode": st.st_mode,
        "uid": st.st_uid,
        "gid": st.st_gid,
        "owner": names.user(st.st_uid),
        "group": names.group(st.st_gid),
        "mtime_ns": st.st_mtime_ns,
    }
    if stat.S_ISLNK(st.st_mode):
        out["symlink"] = True
        out["target"] = os.path.realpath(path)
        try:
            target = os.stat(path)
            out["type"] = _kind(target.st_mode)
            out["perm"] = target.st_mode & 0o777
        except OSError:  # dangling, a loop, or not ours to see
            out["type"] = "other"
            out["perm"] = 0
    else:
        out["type"] = _kind(st.st_mode)
        out["perm"] = st.st_mode & 0o777
    return out


def _in_workspace(path):
    """Whether ``path``'s own entry (its directory's links followed, not its last
    component's) is the workspace or in it."""
    parent, name = os.path.split(path)
    where = os.path.realpath(parent or "/")
    full = os.path.join(where, name) if name else where
    root = state.ROOT.rstrip("/") or "/"
    return full == root or full.startswith(root + "/")


def _check_recorded(req, *targets):
    if req.get("recorded"):
        return
    for t in targets:
        if _in_workspace(t):
            raise Refused("in_workspace", "%s is in the workspace: the host records that change" % t)


def op_fs_stat(req):
    path = _abs(req)
    try:
        return {"entry": entry_of(path, _Names())}
    except OSError as e:
        raise _refusal(e, path)


def op_fs_list(req):
    """The entries under ``path`` (its links followed) to ``depth`` levels (1: its own
    entries), in the order of a sorted depth-first walk that never enters a linked
    directory; each with ``rel``, its path below ``path``. A subdirectory that cannot be
    read is listed but not entered. Raises Refused (``not_found``, ``not_a_directory``,
    ``permission``, ``too_large``: more than ``limit`` entries)."""
    path = _abs(req)
    depth = max(1, int(req.get("depth") or 1))
    limit = max(1, min(int(req.get("limit") or MAX_ENTRIES), MAX_ENTRIES))
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as e:
        raise _refusal(e, path)
    if not stat.S_ISDIR(st.st_mode):
        raise Refused("not_a_directory", "path is not a directory: %s" % path)
    names = _Names()
    out = []
    try:
        first = _scan(real)
    except OSError as e:
        raise _refusal(e, path)
    # (rel prefix, level, remaining sorted names): a walk of any depth without recursion
    stack = [("", 1, real, first)]
    while stack:
        prefix, level, where, todo = stack[-1]
        if not todo:
            stack.pop()
            continue
        name = todo.pop(0)
        full = os.path.join(where, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue  # gone meanwhile
        item = entry_of(full, names, st)
        item["rel"] = prefix + name
        out.append(item)
        if len(out) > limit:
            raise Refused("too_large", "more than %d entries under %s: list it with a smaller depth" % (limit, path))
        if stat.S_ISDIR(st.st_mode) and level < depth:
            try:
                stack.append((prefix + name + "/", level + 1, full, _scan(full)))
            except OSError:
                pass  # listed, not entered
    return {"entries": out}


def _scan(directory):
    with os.scandir(directory) as it:
        return sorted(e.name for e in it)


def _ensure_dirs(path):
    """Make ``path`` and its missing parents (0755 less the umask), as ``mkdir -p``.
    Raises Refused."""
    parts = [p for p in path.split("/") if p]
    sub = ""
    for p in parts:
        sub += "/" + p
        try:
            st = os.stat(sub)
        except FileNotFoundError:
            try:
                os.mkdir(sub, 0o755)
            except FileExistsError:
                pass
            except OSError as e:
                raise _refusal(e, sub)
            continue
        except OSError as e:
            raise _refusal(e, sub)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused("not_a_directory", "path is a file: %s" % sub)


def op_fs_mkdir(req):
    """Make the directory ``path`` and its missing parents. Raises Refused: ``exists``
    (a directory is there), ``invalid`` (something else is), ``not_a_directory`` (a
    parent is a file), ``permission``, ``in_workspace``."""
    path = _abs(req)
    _check_recorded(req, path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _refusal(e, path)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise Refused("exists", "directory already exists: %s" % path)
        raise Refused("invalid", "path already exists but it is not a directory: %s" % path)
    _ensure_dirs(path)
    try:
        return {"entry": entry_of(path, _Names())}
    except OSError as e:
        raise _refusal(e, path)


def op_fs_move(req):
    """Rename ``source`` to ``destination`` (its missing parents made; an existing file
    there replaced, as ``mv`` does); across file systems, copied and then removed.
    Raises Refused: ``not_found`` (no source), ``exists`` (a directory with entries is at
    the destination), ``permission``, ``in_workspace``."""
    source = _abs(req, "source")
    destination = _abs(req, "destination")
    _check_recorded(req, source, destination)
    if not os.path.lexists(source):
        raise Refused("not_found", "source file not found: %s" % source)
    _ensure_dirs(os.path.dirname(destination))
    try:
        os.rename(source, destination)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise _refusal(e, source if e.errno == errno.ENOENT else destination)
        # /tmp (the container's tmpfs) and the workspace are two file systems
        try:
            import shutil  # (here: its import is ~3 ms of the agent's boot, for one rare op)

            shutil.move(source, destination)
        except OSError as e2:
            raise _refusal(e2, destination)
    try:
        return {"entry": entry_of(destination, _Names())}
    except OSError as e:
        raise _refusal(e, destination)


def op_fs_remove(req):
    """Remove ``path`` whatever it is (a directory with everything in it; a link, never
    what it points to); nothing there is no error. Raises Refused: ``invalid`` (the
    workspace itself), ``permission``, ``in_workspace``."""
    path = _abs(req)
    root = state.ROOT.rstrip("/") or "/"
    if path == "/" or (os.path.realpath(path) == root and not os.path.islink(path)):
        raise Refused("invalid", "refusing to remove %s itself: remove what is in it" % path)
    _check_recorded(req, path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"removed": False}
    except OSError as e:
        raise _refusal(e, path)
    try:
        if stat.S_ISDIR(st.st_mode):
            parent = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                tree.rmtree_at(parent, os.path.basename(path), [0, 0, 0])
            finally:
                os.close(parent)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise _refusal(e, path)
    return {"removed": True}
