"""Unified diffs and the net summary of recorded changes.

Diffs compare a path's *first* recorded before-image with its content now, read through
the sandbox, so several edits show as one cumulative change.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from sandbox.base import Sandbox

from ..quoting import quote_path
from .model import Entry, Summary

#: What a path holds in a diff: None = absent; bytes = content; str = a placeholder.
Content = bytes | str | None


def unified(path: str, old: Content, new: Content, *, old_path: str | None = None) -> str:
    """A git-style unified diff of one path ('' when equal)."""
    if old == new:
        return ""
    # Quoted like git's headers when a name is not plain text (a newline would end the
    # header line early and a patch tool would read another file name).
    a = quote_path(f"a/{old_path or path}") if old is not None else "/dev/null"
    b = quote_path(f"b/{path}") if new is not None else "/dev/null"
    if isinstance(old, str) or isinstance(new, str):
        note = old if isinstance(old, str) else new
        return f"--- {a}\n+++ {b}\n@@ {note!s} @@\n"
    old_text = _text(old)
    new_text = _text(new)
    if old_text is None or new_text is None:
        return f"Binary files {a} and {b} differ\n"
    lines = difflib.unified_diff(old_text.splitlines(keepends=True), new_text.splitlines(keepends=True), a, b)
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _text(data: bytes | None) -> str | None:
    if data is None:
        return ""
    if b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


async def read_now(sandbox: Sandbox, path: str, max_bytes: int) -> Content:
    """Current content through the sandbox: bytes, None when absent, a note otherwise."""
    from sandbox.errors import AgentError, PathNotFoundError

    try:
        r = await sandbox.read(path, max_bytes=max_bytes)
    except PathNotFoundError:
        return None
    except AgentError as e:
        return f"(cannot read: {e})"
    return r.data if r.sha256 is not None else f"(current content over {max_bytes} bytes)"


def first_before(entries: Iterable[Entry]) -> dict[str, Entry]:
    """Per path, the earliest applied entry that touched it (renames count for both paths)."""
    out: dict[str, Entry] = {}
    for e in sorted(entries, key=lambda e: e.id):
        if e.state != "applied":
            continue
        out.setdefault(e.path, e)
        if e.new_path:
            out.setdefault(e.new_path, e)
    return out


def summarize(entries: list[Entry]) -> Summary:
    """Net effect per path of the applied entries, from the first before to the last after."""
    first: dict[str, tuple[str | None, str | None]] = {}
    last: dict[str, tuple[str | None, str | None]] = {}
    renamed: list[tuple[str, str]] = []
    not_restorable: set[str] = set()
    for e in sorted(entries, key=lambda e: e.id):
        if e.state != "applied":
            continue
        if e.op == "rename" and e.new_path:
            first.setdefault(e.path, (e.before_kind, e.before_hash))
            first.setdefault(e.new_path, (None, None))
            last[e.path] = (None, None)
            last[e.new_path] = (e.after_kind, e.after_hash)
            if not e.reverted:
                renamed.append((e.path, e.new_path))
        else:
            first.setdefault(e.path, (e.before_kind, e.before_hash))
            last[e.path] = (e.after_kind, e.after_hash)
        if not e.restorable and not e.reverted:
            not_restorable.add(e.path)
    renamed_paths = {p for pair in renamed for p in pair}
    created, modified, deleted = [], [], []
    for path, (kind0, hash0) in sorted(first.items()):
        kind1, hash1 = last[path]
        if path in renamed_paths:
            continue
        if kind0 is None and kind1 is not None:
            created.append(path)
        elif kind0 is not None and kind1 is None:
            deleted.append(path)
        elif kind0 is not None and (kind0, hash0) != (kind1, hash1):
            modified.append(path)
    return Summary(
        created=created,
        modified=modified,
        deleted=deleted,
        renamed=renamed,
        not_restorable=sorted(not_restorable),
    )
