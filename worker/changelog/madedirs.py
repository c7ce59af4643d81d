"""Directories made (by a command's ``mkdir`` or for a tool's write).

A tool's write records the directories it makes (:func:`made_entries`, in the write's
own transaction: :meth:`.store.Store.insert_entry` takes them first) and settles them
with it (:func:`settle_made`), the shell baseline learning of them so the next scan does
not record them again. Undo removes such a directory when nothing else is left in it and
keeps it otherwise with the reason (what is still in it, and which change put it there):
the dry run's prediction and the real run's reason are here, used by :mod:`.undo`."""

from __future__ import annotations

from typing import Any

from sandbox.base import Sandbox
from sandbox.errors import AgentError, NotADirError, PathNotFoundError

from ..quoting import quote_path
from .finish import made_dir_row
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


def made_entries(write: dict[str, Any], dirs: list[str]) -> list[dict[str, Any]]:
    """The entries of directories ``dirs`` (outermost first) made by the write whose entry
    is ``write``: each a ``create`` of a directory, as a command's ``mkdir`` is recorded,
    as ``{"path", "fields"}`` (``id`` is set when inserted)."""
    keep = {k: v for k, v in write.items() if k != "_made"}
    return [
        {
            "path": d,
            "fields": {
                **keep,
                "op": "create",
                "path": d,
                "before_hash": None,
                "after_hash": None,
                "before_kind": None,
                "after_kind": "dir",
                "before_mode": None,
                "restorable": 1,
                "note": f"made for {write['path']}",
                "reverts": None,
            },
        }
        for d in dirs
    ]


async def settle_made(core: ChangelogCore, sandbox: Sandbox, made: list[dict[str, Any]], *, written: bool) -> None:
    """Settle the entries of the directories a write made: applied with the write; when it
    failed, applied where the directory is there anyway (the agent makes a write's
    directories first), failed where not, left pending when the sandbox cannot tell
    (recovery then settles them). An applied one is a row of the shell baseline (stat
    unknown: the next scan refreshes it and records nothing)."""
    states: list[tuple[int, str, str]] = []
    for m in made:
        if "id" not in m:
            continue
        if written:
            states.append((m["id"], m["path"], "applied"))
            continue
        try:
            there = (await sandbox.stat(m["path"])).type == "dir"
        except (PathNotFoundError, NotADirError):
            there = False
        except AgentError:
            continue
        states.append((m["id"], m["path"], "applied" if there else "failed"))
    if states:
        await core.db(_settle_tx, core, states)


def _settle_tx(core: ChangelogCore, states: list[tuple[int, str, str]]) -> None:
    # Not fsync'd, as a change's own step 5: lost, the entries stay pending for recovery.
    with core.store.tx(durable=False) as db:
        for entry_id, path, state in states:
            cur = db.execute("UPDATE entries SET state = ? WHERE id = ? AND state = 'pending'", (state, entry_id))
            if state == "applied" and cur.rowcount == 1:
                made_dir_row(db, path)
