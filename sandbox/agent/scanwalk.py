"""The stat-only walk behind change scans, and the row it records per path:
(type, size, mtime_ns, inode, mode), a directory as ``DIR_ROW`` with only its mode.
Never follows a link: each directory is opened O_NOFOLLOW from its parent's descriptor."""

import os
import stat

from . import paths

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
    it stopped at ``limit`` rows."""
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
                        out[prefix + name] = dir_row(e)
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
            if walk(sub, prefix + name + "/", exclude, out, limit, snap):
                return True
        finally:
            os.close(sub)
    return False


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
