"""The whole state of a directory tree, for "undo gives back exactly the tree there was"
tests: every path with its kind, permission bits, bytes or link target (never following a
link). Timestamps are left out: undo restores content, kinds and modes, not mtimes."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def tree_state(root: Path) -> dict[str, tuple[str, int, str]]:
    """``{relative path: (kind, permission bits, sha256 of content or link target)}``."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode, "")
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    out[rel] = ("file", mode, hashlib.sha256(f.read()).hexdigest())
            else:
                out[rel] = ("other", mode, "")
        # os.walk does not enter links to directories (followlinks=False): they are listed.
    return out


def tree_hash(root: Path) -> str:
    """One digest of :func:`tree_state`."""
    h = hashlib.sha256()
    for rel, (kind, mode, digest) in sorted(tree_state(root).items()):
        h.update(f"{rel}\0{kind}\0{mode:o}\0{digest}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def tree_diff(before: dict[str, tuple[str, int, str]], after: dict[str, tuple[str, int, str]]) -> list[str]:
    """What differs, readably, for an assertion message."""
    out = []
    for rel in sorted(set(before) | set(after)):
        if before.get(rel) != after.get(rel):
            out.append(f"{rel}: {before.get(rel)} -> {after.get(rel)}")
    return out
