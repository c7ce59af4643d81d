"""Groups of changelog entries: what one call (a tool call, a background process, one of an
agent's turns, :mod:`worker.agents.turns`) changed, as ``undo --last N`` and ``log --groups``
see it.

A group is every entry of one call id; an entry without a call id is a group of its own.
Undo entries (``origin='undo'``) belong to no group. Groups are ordered by their newest
entry, so "the last N groups" are the N calls that changed something most recently.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from .model import Entry


class Group(BaseModel):
    """One call's entries, as ``log --groups`` shows them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str | None
    tool: str
    #: What the call said it did (a command, an agent's tool summary), from its first entry's note.
    summary: str | None
    entries: list[int]
    paths: list[str]
    first: int
    last: int
    ts: float
    #: Every entry of the group is reverted.
    reverted: bool


def _key(e: Entry) -> str:
    return f"call:{e.call_id}" if e.call_id is not None else f"entry:{e.id}"


def group(entries: list[Entry]) -> list[Group]:
    """``entries`` (any order) as groups, oldest group first; undo entries left out."""
    found: dict[str, list[Entry]] = {}
    for e in sorted(entries, key=lambda e: e.id):
        if e.origin != "undo":
            found.setdefault(_key(e), []).append(e)
    out = []
    for members in found.values():
        head = members[0]
        note = head.note or ""
        out.append(
            Group(
                call_id=head.call_id,
                tool=head.tool,
                summary=note[2:] if note.startswith("$ ") else (note or None),
                entries=[e.id for e in members],
                paths=sorted({p for e in members for p in (e.path, e.new_path) if p}),
                first=head.id,
                last=members[-1].id,
                ts=members[-1].ts,
                reverted=all(e.reverted_by is not None or e.state != "applied" for e in members),
            )
        )
    return sorted(out, key=lambda g: g.last)


def select_last(core: Any, n: int) -> list[Entry]:
    """The entries of the last ``n`` groups not yet reverted, newest first (blocking; db
    thread). Raises ValueError for ``n < 1``, EntryNotFoundError when there is none."""
    from .errors import EntryNotFoundError

    if n < 1:
        raise ValueError("last must be at least 1")
    rows: list[Entry] = core.store.entries("origin != 'undo'")
    live = [g for g in group(rows) if not g.reverted]
    if not live:
        raise EntryNotFoundError("no changelog group is left to undo")
    wanted = {i for g in live[-n:] for i in g.entries}
    return sorted((e for e in rows if e.id in wanted), key=lambda e: -e.id)
