"""``repair``: a damaged changelog made whole again, keeping what is readable.

The damaged database is moved aside (``changelog.sqlite3.damaged-<time>``, never deleted:
an operator may still want to look at it) and a new one is written with every row that
can still be read from it, table by table and row by row (a damaged page loses the rows
on it, not the table). The shell baseline is never carried over: what a damaged
baseline says about the tree cannot be trusted, so the next command builds a new one
from the tree as it is (changes made between the last readable entry and the repair are
then not attributable: the report says so). Entries whose before-image blob was lost stay
in the log, marked not restorable.

Blocking (it reads and writes whole databases): call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from .recorder import workspace_dir
from .store import Store

#: The tables carried over, in an order that keeps references valid.
_TABLES = ("meta", "blobs", "entries", "members")


@dataclass
class RepairReport:
    """What a repair kept and lost."""

    database: Path
    moved_to: Path | None = None
    kept: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int | None] = field(default_factory=dict)  # None: unknown (nothing readable)
    unrestorable: int = 0
    healthy: bool = False

    def lines(self) -> list[str]:
        if self.healthy:
            return [f"{self.database}: not damaged; nothing to repair"]
        out = [f"{self.database}: repaired; the damaged file is kept as {self.moved_to}"]
        for table in _TABLES:
            lost = self.lost.get(table)
            what = "unknown number" if lost is None else str(lost)
            out.append(f"  {table}: kept {self.kept.get(table, 0)}, lost {what}")
        if self.unrestorable:
            out.append(f"  {self.unrestorable} entries lost their before-image: marked not restorable")
        out.append(
            "  the shell baseline is rebuilt by the next command: changes made since the last kept entry "
            "are not in the log"
        )
        return out


Row = list[tuple[str, object]]


def _rows(src: sqlite3.Connection, table: str) -> tuple[list[Row], int | None]:
    """The readable rows of ``table`` and how many were not (None: the table is gone)."""
    try:
        cols = [r[1] for r in src.execute(f"PRAGMA table_info({table})")]
        top = src.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0] or 0
    except sqlite3.DatabaseError:
        return [], None
    if not cols:
        return [], None
    rows: list[Row] = []
    lost = 0
    names = ", ".join(cols)
    for rowid in range(1, top + 1):
        try:
            row = src.execute(f"SELECT {names} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            lost += 1
            continue
        if row is not None:
            rows.append(list(zip(cols, row, strict=True)))
    return rows, lost


def repair(data_dir: Path, workspace: Path, *, force: bool = False) -> RepairReport:
    """Repair the changelog of ``workspace`` under ``data_dir`` (see the module docstring).
    A healthy one is left alone unless ``force``. Raises OSError (moving or writing)."""
    root = workspace_dir(Path(data_dir), Path(workspace))
    db = root / "changelog.sqlite3"
    report = RepairReport(db)
    if not force:
        try:
            Store(db).close()
            report.healthy = True
            return report
        except Exception:  # damaged (or unopenable): repair below
            pass
    moved = db.with_name(f"{db.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    if db.exists():
        os.replace(db, moved)
        report.moved_to = moved
    for side in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(str(db) + side, str(moved) + side)
    read: dict[str, tuple[list[Row], int | None]] = {}
    if report.moved_to is not None:
        try:
            src = sqlite3.connect(f"file:{moved}?mode=ro", uri=True)
            src.text_factory = bytes
        except sqlite3.Error:
            src = None
        if src is not None:
            with contextlib.closing(src):
                for table in _TABLES:
                    read[table] = _rows(src, table)
    marker = db.with_name(db.name + ".created")
    with contextlib.suppress(FileNotFoundError):
        marker.unlink()  # a new database, on purpose
    store = Store(db)
    try:
        with store.tx() as conn:
            for table in _TABLES:
                rows, lost = read.get(table, ([], None))
                report.lost[table] = lost
                kept = 0
                for row in rows:
                    cols = [c for c, _v in row]
                    if table == "meta" and dict(row).get("key") in (b"baseline", "baseline"):
                        continue  # rebuilt by the next command
                    # As stored (text already in the store's escaped form): through the raw
                    # connection, which escapes nothing again.
                    values = [
                        v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) and c != "data" else v
                        for c, v in row
                    ]
                    marks = ", ".join("?" for _ in cols)
                    conn.raw.execute(f"INSERT OR REPLACE INTO {table}({', '.join(cols)}) VALUES ({marks})", values)
                    kept += 1
                report.kept[table] = kept
            # Entries whose before-image is gone cannot be undone: say so in the log.
            cur = conn.execute(
                "UPDATE entries SET restorable = 0, note = COALESCE(note || ' ', '') || '[before-image lost in a "
                "repair]' WHERE restorable = 1 AND before_hash IS NOT NULL AND before_kind = 'file' "
                "AND before_hash NOT IN (SELECT sha256 FROM blobs)"
            )
            report.unrestorable = cur.rowcount
            conn.execute("UPDATE entries SET state = 'failed' WHERE state = 'pending'")
            conn.execute("DELETE FROM meta WHERE key = 'baseline'")
            conn.execute("DELETE FROM baseline")
    finally:
        store.close()
    return report


def survey(data_dir: Path) -> list[tuple[Path, str]]:
    """Every changelog under ``data_dir`` that needs attention: ``(its database, what)``,
    damaged (judged from its file, without opening it) or holding interrupted work a
    crashed worker left (recorded by the next use of the workspace). For ``doctor``."""
    from .intents import IntentJournal
    from .store import _damage

    out: list[tuple[Path, str]] = []
    for root in sorted((Path(data_dir) / "workspaces").glob("*/")):
        db = root / "changelog.sqlite3"
        problem = _damage(db, db.with_name(db.name + ".created").exists())
        if problem is not None:
            out.append((db, f"damaged ({problem}): `loom-worker repair --workspace DIR`"))
            continue
        if (root / "intents").exists():
            journal = IntentJournal(root / "intents")
            try:
                if journal.orphans():
                    out.append((db, "a crashed worker left a command or write unfinished: recorded at the next call"))
            except Exception:  # unreadable: said by the next use
                pass
            finally:
                journal.close()
    return out
