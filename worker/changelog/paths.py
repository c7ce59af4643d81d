"""Workspace-relative path checks and canonicalization through the sandbox.

The changelog stores canonical workspace-relative paths (parent symlinks inside the
workspace resolved, as the agent resolves them) so that a write through ``link.txt`` and a
later scan that sees ``real.txt`` change name the same file. Paths read back from the
database are re-checked lexically before undo uses them: an entry whose path escapes the
workspace has been tampered with and is refused.
"""

from __future__ import annotations

import posixpath

from sandbox.answers import MAX_RELPATH
from sandbox.base import FileStat, Sandbox
from sandbox.errors import PathNotFoundError

_MAX_HOPS = 40


def is_safe_relpath(path: object) -> bool:
    """True when ``path`` is a normalized workspace-relative path that stays inside."""
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > MAX_RELPATH:
        return False
    if path.startswith("/") or path in (".", ".."):
        return False
    return posixpath.normpath(path) == path and not path.startswith("../")


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies under it."""
    return path == root or path.startswith(root + "/")


async def canonical(sandbox: Sandbox, path: str) -> tuple[str, FileStat | None]:
    """The canonical workspace-relative path of ``path`` and its lstat (None when absent).

    Returns ``(path, None)`` unchanged when it cannot be canonicalized lexically (a link
    that leaves the workspace, too many hops): the agent's own refusal then surfaces on
    the next call. Raises sandbox errors other than "not found" (PathEscapeError,
    NotADirError, infrastructure errors).
    """
    rel, st, _missing = await canonical_new(sandbox, path)
    return rel, st


async def canonical_new(sandbox: Sandbox, path: str) -> tuple[str, FileStat | None, list[str]]:
    """:func:`canonical`, and for an absent ``path`` also the directories a write of it
    would make: its missing parents, canonical too, outermost first (``[]`` when its
    directory exists: the common case costs no more round trips than :func:`canonical`).
    Raises like :func:`canonical`.
    """
    current = path
    for _ in range(_MAX_HOPS):
        try:
            st = await sandbox.stat(current)
        except PathNotFoundError:
            head, name = posixpath.split(posixpath.normpath(current.lstrip("/")) or ".")
            if head in ("", "."):
                return name, None, []
            try:
                parent = await sandbox.stat(head)
            except PathNotFoundError:
                return await _missing_parents(sandbox, posixpath.normpath(current.lstrip("/")))
            return (posixpath.join(parent.path, name) if parent.path != "." else name), None, []
        if st.type != "symlink" or st.target is None:
            return st.path, st, []
        target = st.target
        base = posixpath.dirname(st.path)
        joined = posixpath.normpath(posixpath.join(base, target)) if not target.startswith("/") else target
        if joined.startswith("/workspace/"):
            joined = joined[len("/workspace/") :]
        if not is_safe_relpath(joined):
            return path, st, []
        current = joined
    return path, None, []


async def _missing_parents(sandbox: Sandbox, path: str) -> tuple[str, None, list[str]]:
    """``path`` (absent, and so is its directory) rebased on its deepest existing ancestor's
    canonical path, and the directories between them, outermost first. Raises like
    :func:`canonical`."""
    parts = path.split("/")
    for i in range(len(parts) - 2, 0, -1):
        try:
            st = await sandbox.stat("/".join(parts[:i]))
        except PathNotFoundError:
            continue
        base = st.path
        if st.type == "symlink":  # the write goes where the link leads, as the agent resolves it
            base, _st = await canonical(sandbox, "/".join(parts[:i]))
        break
    else:
        i, base = 0, "."
    rest = parts[i:]
    prefix = "" if base == "." else base + "/"
    return prefix + "/".join(rest), None, [prefix + "/".join(rest[: j + 1]) for j in range(len(rest) - 1)]
