"""``list``: the entries below a directory to a depth, and the walk it shares with the
Python fallback of search."""

import os

from . import paths


def walk(dir_fd, prefix, depth, max_depth, exclude, visit, counter, limit):
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
            walk(sub, prefix + e.name + "/", depth + 1, max_depth, exclude, visit, counter, limit)
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
        walk(dfd, "", 1, depth, exclude, visit, counter, limit)
    finally:
        os.close(dfd)
    return {"base": paths.rel(parts), "entries": out, "truncated": counter[1]}
