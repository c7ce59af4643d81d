"""Directories made (by a command's ``mkdir`` or for a tool's write), as undo sees them:
removed when nothing else is left in them, kept otherwise with the reason (what is still
in them, and which change put it there). Used by :mod:`.undo` for the dry run's
prediction and the real run's reason."""

from __future__ import annotations

from sandbox.base import Sandbox
from sandbox.errors import NotADirError, PathNotFoundError

from ..quoting import quote_path
from .model import Entry
from .paths import inside
from .recorder import ChangelogCore

#: What a path is to undo's plan: (kind or None when absent, sha256 for files).
State = tuple[str | None, str | None]


def made_dir(e: Entry) -> bool:
    """A directory made (by a command's ``mkdir`` or for a tool's write), not a tree made
    whole: its undo removes it only when nothing else is left in it, and keeps it otherwise
    with the reason (what is still in it, and which change put it there)."""
    return e.op == "create" and e.after_kind == "dir" and e.before_kind is None and not e.is_tree


async def kept_dirs(
    core: ChangelogCore,
    sandbox: Sandbox,
    plan: list[Entry],
    final: dict[str, State],
    removals: list[tuple[int, list[str]]],
) -> dict[int, str]:
    """For a dry run: the directories made that the undo of ``plan`` would keep, by entry
    id, with the reason. A directory goes when every path now in it goes: a path the plan
    leaves absent (``final``), inside a tree it removes, or a made directory that goes too
    (deepest first). Raises sandbox infrastructure errors."""
    gone_dirs: set[str] = set()
    kept: dict[int, str] = {}
    made = sorted((e for e in plan if made_dir(e)), key=lambda e: -e.path.count("/"))
    made_paths = {e.path for e in made}
    for e in made:
        stay = [
            p
            for p in await children(sandbox, e.path)
            if p not in gone_dirs
            and (p in made_paths or final.get(p, ("?", None)) != (None, None))
            and not any(inside(p, r) for _id, roots in removals for r in roots)
        ]
        if stay:
            kept[e.id] = await why_kept(core, e, stay)
        else:
            gone_dirs.add(e.path)
    return kept


async def children(sandbox: Sandbox, path: str) -> list[str]:
    """What is in directory ``path`` now ([] when it is not there)."""
    try:
        listing = await sandbox.list(path, depth=1, exclude=(), max_entries=1000)
    except (PathNotFoundError, NotADirError):
        return []
    # (the listing's paths are relative to the directory listed)
    return [x.path if x.path.startswith(path + "/") else f"{path}/{x.path}" for x in listing.entries if x.depth <= 1]


async def why_kept(core: ChangelogCore, e: Entry, stay: list[str]) -> str:
    """ "kept d/: not empty (d/x was added by a later change, entry 7, call c)"."""
    first = sorted(stay)[0]
    found = await core.db(
        core.store.entries,
        "(path = ? OR new_path = ?) AND state = 'applied' AND origin != 'undo'",
        (first, first),
        order="id DESC",
    )
    if found and made_dir(found[0]) and found[0].reverted_by is None:
        why = f"{quote_path(first)}/ stays, not empty"  # a directory made, kept too: its step says why
    elif found:
        by = found[0]
        when = "a later change" if by.id > e.id else "a change"
        who = f"{when}, entry {by.id}" + (f", call {by.call_id}" if by.call_id else "")
        why = f"{quote_path(first)} was added by {who}"
    else:
        why = f"{quote_path(first)} is in it, not recorded by the changelog"
    more = f" and {len(stay) - 1} more" if len(stay) > 1 else ""
    return f"kept {quote_path(e.path)}/: not empty ({why}{more})"
