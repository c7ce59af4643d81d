"""``list``: the entries below a directory to a depth, and the walk it shares with the
Python fallback of search."""

import errno
import os

from . import dirstack, paths


def walk(dir_fd, prefix, depth, max_depth, exclude, visit, counter, limit):
    """Depth-first walk below an open directory fd, never following links: each
    directory's entries in name order, then its subdirectories'. Iterative, to any depth
    (``dirstack``); a directory moved away while the walk was below it is left out."""
    stack = dirstack.DirStack(dir_fd)
    try:
        todo = [_entries(dir_fd, prefix, depth, exclude, visit, counter, limit)]
        pre = [prefix]
        while todo:
            if counter[1]:
                return
            subs = todo[-1]
            level = depth + len(todo) - 1
            if not subs or (max_depth is not None and level >= max_depth):
                todo.pop()
                pre.pop()
                stack.pop()
                continue
            if counter[0] >= limit:
                counter[1] = True
                return
            name = subs.pop()
            try:
                sub = stack.push(name)
            except OSError as e:
                if e.errno == errno.ESTALE:
                    todo[-1] = []
                continue
            below = pre[-1] + name + "/"
            todo.append(_entries(sub, below, level + 1, exclude, visit, counter, limit))
            pre.append(below)
    finally:
        stack.close()


def _entries(dir_fd, prefix, depth, exclude, visit, counter, limit):
    """Visit one directory's entries in name order; returns its subdirectories' names,
    last first (``walk`` pops them)."""
    try:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return []
    dirs = []
    for e in entries:
        if counter[0] >= limit:
            counter[1] = True
            break
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if is_dir and e.name in exclude:
            continue
        visit(e, prefix + e.name, depth, is_dir)
        if is_dir:
            dirs.append(e.name)
    dirs.reverse()
    return dirs


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
