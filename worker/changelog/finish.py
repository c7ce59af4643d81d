"""Step 5 of a change (and recovery's settling): the entry's state, and the shell
baseline kept in step with it. Runs inside a store transaction."""

from __future__ import annotations

from typing import Any

from .store import RACY_OWN_WRITE

#: What a change leaves in the shell baseline: (path, content hash after) or, where the
#: sandbox said, (path, hash, (size, mtime_ns, inode, st_mode) of the file put there).
Baseline = tuple[str, str | None] | tuple[str, str | None, tuple[int, int, int, int] | None]


def finish_in(
    db: Any,
    entry_id: int,
    state: str,
    baseline: Baseline | None,
    reverts: int | None,
    mode: int | None = None,
    note: str | None = None,
) -> bool:
    """Step 5 inside a transaction (also recovery's settling). Only a still-pending entry:
    another process's recovery, or the writer's own late step 5, may have come first.
    Returns whether it was still pending (and is settled now)."""
    cur = db.execute(
        "UPDATE entries SET state = ?, before_mode = COALESCE(?, before_mode), note = COALESCE(?, note) "
        "WHERE id = ? AND state = 'pending'",
        (state, mode, note, entry_id),
    )
    if state == "applied" and cur.rowcount == 1:
        if baseline is not None:
            baseline_after_change(db, *baseline)
        if reverts is not None:
            db.execute("UPDATE entries SET reverted_by = ? WHERE id = ?", (entry_id, reverts))
    return bool(cur.rowcount == 1)


def baseline_after_change(db: Any, path: str, after: str | None, stat: tuple[int, int, int, int] | None = None) -> None:
    """Keep the shell baseline in step with a change made through the changelog.

    With the file's ``stat`` as the sandbox put it there (a committed write: the agent's
    scan snapshot takes that same file as seen, so no scan hands it back), the row is that
    stat, marked :data:`~.store.RACY_OWN_WRITE` (a stat walk re-hashes it, as any file
    written within a tick of a scan; a scan that reports it checks it by hash). Without,
    the stat is unknown, so it is set impossible (-1) and mode 0 (unknown): the next scan
    sees the file as changed, hashes it, finds the recorded content and only refreshes
    the stat.
    """
    if after is None:
        db.execute("DELETE FROM baseline WHERE path = ?", (path,))
        return
    kept = db.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (after,)).fetchone() is not None
    size, mtime_ns, ino, mode, racy = (*stat, RACY_OWN_WRITE) if stat is not None else (-1, -1, 0, 0, 0)
    db.execute(
        "INSERT OR REPLACE INTO baseline(path, type, size, mtime_ns, ino, mode, sha256, target, status, "
        "racy) VALUES (?, 'file', ?, ?, ?, ?, ?, NULL, ?, ?)",
        (path, size, mtime_ns, ino, mode, after, "ok" if kept else "too_large", racy),
    )


def made_dir_row(db: Any, path: str) -> None:
    """A directory a change made, as a row of the shell baseline (stat unknown: the next
    scan refreshes it and records nothing)."""
    db.execute(
        "INSERT OR REPLACE INTO baseline(path, type, size, mtime_ns, ino, mode, sha256, target, "
        "status, racy) VALUES (?, 'dir', -1, -1, 0, 0, NULL, NULL, 'dir', 0)",
        (path,),
    )
