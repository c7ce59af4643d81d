"""The stat-only walk behind change scans, and the row it records per path:
(type, size, mtime_ns, inode, mode), a directory as ``DIR_ROW`` with only its mode.
Never follows a link: each directory is opened O_NOFOLLOW from its parent's descriptor."""

import errno
import os
import stat

from . import dirstack, paths

#: The longest workspace-relative path a scan reports (characters): 5,000 levels of
#: 12-byte names. Linux bounds a path given to one system call (PATH_MAX, 4,096), not a
#: tree, so a walk from descriptors reaches any depth, but every row travels to the host
#: and into the changelog: a directory whose path would be longer is reported and not
#: entered (undo of a tree made whole removes it with everything in it all the same).
MAX_PATH = 1 << 16

# A directory in a scan: its existence and its mode. Its mtime and size change with every
# entry made in it, and the changelog records the entries themselves.
DIR_ROW = ("dir", 0, 0, 0, 0)


def dir_row(e):
    """The scan row of directory entry ``e``: one lstat per directory, for its mode (a
    ``chmod`` of a directory is a change undo must reverse)."""
    try:
        return ("dir", 0, 0, 0, e.stat(follow_symlinks=False).st_mode)
    except OSError:
        return DIR_ROW


def walk(dfd, prefix, exclude, out, limit, snap=None):
    """Stat-only walk for change detection: no sorting, one lstat per non-directory
    (directories are recognised from d_type, and their row is ``dir_row``), never
    following links. With ``snap`` it also records the directory layout, watches each
    directory and notes hard-linked files (see ``snapshot.Snapshot``). Returns True when
    it stopped at ``limit`` rows.

    Iterative, to any depth (see ``dirstack``): a directory moved away while the walk
    was below it is left out, and with ``snap`` the snapshot is marked broken (the next
    scan walks again)."""
    stack = dirstack.DirStack(dfd)
    try:
        todo = []  # per level: the subdirectories still to walk
        pre = [prefix]  # per level: its prefix
        subs = _read(dfd, prefix, exclude, out, limit, snap)
        if subs is None:
            return True
        todo.append(subs)
        while todo:
            subs = todo[-1]
            if not subs:
                todo.pop()
                pre.pop()
                stack.pop()
                continue
            name = subs.pop()
            here = pre[-1]
            try:
                sub = stack.push(name)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                    # Out of descriptors or memory: skipping the directory would be a
                    # wrong record (its changes missed), so the scan fails instead.
                    raise
                if snap is not None:
                    snap.dirs.get(here, {}).pop(name, None)
                    if e.errno == errno.ESTALE:
                        snap.broken = True
                if e.errno == errno.ESTALE:
                    todo[-1] = []  # this level moved: the rest of it is gone from here
                continue
            below = here + name + "/"
            found = _read(sub, below, exclude, out, limit, snap)
            if found is None:
                return True
            todo.append(found)
            pre.append(below)
        return False
    finally:
        stack.close()


def _read(dfd, prefix, exclude, out, limit, snap):
    """One directory of ``walk``: its rows into ``out``; returns the names of its
    subdirectories to walk, or None when ``limit`` was reached."""
    dirs = []
    names = {}  # type: dict
    if snap is not None:
        snap.watch_dir(dfd, prefix)
    try:
        it = os.scandir(dfd)
    except OSError:
        return []
    track = snap is not None
    isreg = stat.S_ISREG
    with it:
        for e in it:
            name = e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    if name not in exclude:
                        if len(out) >= limit:
                            return None
                        if len(prefix) + len(name) < MAX_PATH:
                            dirs.append((name, e.inode()))
                        out[prefix + name] = dir_row(e)
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if len(out) >= limit:
                return None
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
    # Reversed: ``walk`` pops from the end, so subdirectories are walked in listing order.
    return [name for name, _ino in reversed(dirs)]


def lstat_below(base_fd, rel):
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
