"""The diff of what recorded entries changed: each from its before-image to its
after-image, as the changelog holds them (not the files as they are now, which
:meth:`~worker.changelog.Changelog.diff` shows).

This is "what did this call do": it needs no sandbox, only the blob store, so it can be
shown for a call long after the workspace moved on, or for one already reverted. Where
the changelog kept no content (a file over the size cap, an ignored directory), the diff
says so instead of showing text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from ..quoting import quote_path
from .diff import Content, unified
from .model import Entry

#: How a blob is fetched (``Store.get_blob`` on the changelog's database thread).
GetBlob = Callable[[str], Awaitable[bytes | None]]


async def _content(get_blob: GetBlob, kind: str | None, sha: str | None, *, note: str | None = None) -> Content:
    if kind is None:
        return None
    if kind == "symlink":
        target = await get_blob(sha) if sha else None
        return f"(symlink -> {target.decode('utf-8', 'surrogateescape')})" if target is not None else "(symlink)"
    if kind != "file":
        return f"({kind})"
    blob = await get_blob(sha) if sha else None
    if blob is None:
        return f"({note or 'content not kept'})"
    return blob


def _header(old: str | None, new: str | None, note: str) -> str:
    a = "/dev/null" if old is None else quote_path(f"a/{old}")
    b = "/dev/null" if new is None else quote_path(f"b/{new}")
    return f"--- {a}\n+++ {b}\n@@ {note} @@\n"


async def entries_diff(entries: Iterable[Entry], get_blob: GetBlob) -> str:
    """The unified diff of ``entries`` (oldest first), one part per entry."""
    out: list[str] = []
    for e in sorted(entries, key=lambda e: e.id):
        if e.state == "failed":
            continue  # recorded, then refused by the sandbox: nothing changed
        if e.tree_files is not None:
            where = e.path + "/" if e.is_tree else e.path + "/*"
            verb = "Only in b" if e.op == "create" else "Changed in b"
            out.append(f"{verb}: {quote_path(where)} ({e.describe()}; entry {e.id}, content not shown)\n")
            continue
        if "dir" in (e.before_kind, e.after_kind) and e.before_kind == e.after_kind:
            continue  # a directory's permission bits: no content to show
        if e.after_kind == "dir" and not e.before_kind:
            out.append(f"Only in b: {quote_path(e.path + '/')} (directory; entry {e.id})\n")
            continue
        if e.before_kind == "dir" and not e.after_kind:
            out.append(f"Only in a: {quote_path(e.path + '/')} (directory; entry {e.id})\n")
            continue
        lost = None if e.restorable else (e.note or "before-image not kept")
        old = await _content(get_blob, e.before_kind, e.before_hash, note=lost)
        new = await _content(get_blob, e.after_kind, e.after_hash)
        if e.op == "rename" and e.new_path:
            part = unified(e.new_path, old, new, old_path=e.path)
            out.append(part or _header(e.path, e.new_path, "renamed, content unchanged"))
            continue
        part = unified(e.path, old, new)
        if not part and e.before_mode and e.after_mode and e.before_mode != e.after_mode:
            part = _header(e.path, e.path, f"mode {e.before_mode & 0o7777:o} -> {e.after_mode & 0o7777:o}")
        if e.state == "pending" and part:
            part = f"(entry {e.id} is still pending: the change may not have happened)\n" + part
        out.append(part)
    return "".join(out)
