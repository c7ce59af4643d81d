"""The snapshot store's index and lineage: one SQLite database on the host.

``$LOOM_DATA_DIR/snapshots/index.sqlite3`` (WAL, so the CLI reads while the service
writes) holds every snapshot (its workspace, settings, where the changelog stood, size,
strategy; a deleted one keeps its row so lineage stays readable) and every fork (its
directory, the snapshot it came from). A snapshot's *parent* is the snapshot its
workspace was forked from; its *children* are the forks made from it. Each snapshot's
files live beside it in ``snapshots/<id>/`` (``tree/``, ``scratch.tar``). The directory
is 0700 and never mounted into a sandbox: lineage and settings are out of every agent's
reach.
"""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..storage.sqlite_wal import enable_wal
from .errors import SnapshotError, SnapshotNotFoundError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots(
  id TEXT PRIMARY KEY, name TEXT, workspace TEXT NOT NULL, created REAL NOT NULL,
  strategy TEXT NOT NULL, files INTEGER NOT NULL, bytes INTEGER NOT NULL,
  changelog_entry INTEGER NOT NULL, settings TEXT NOT NULL, parent TEXT,
  with_scratch INTEGER NOT NULL, deleted REAL);
CREATE INDEX IF NOT EXISTS snapshots_ws ON snapshots(workspace);
CREATE TABLE IF NOT EXISTS forks(
  workspace TEXT PRIMARY KEY, snapshot TEXT NOT NULL, created REAL NOT NULL, strategy TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS forks_snapshot ON forks(snapshot);
"""
_COLUMNS = (
    "id, name, workspace, created, strategy, files, bytes, changelog_entry, settings, parent, with_scratch, deleted"
)


class Snapshot(BaseModel):
    """A named, immutable point of a workspace."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="snap-<12 hex>.")
    name: str | None = Field(None, description="The name given when it was taken.")
    workspace: str = Field(description="The workspace it was taken of (real path on the host).")
    created: float = Field(description="When (Unix time).")
    strategy: str = Field(description="How its tree was copied: btrfs, reflink or copy.")
    files: int = Field(description="Files, links and other non-directories in its tree.")
    bytes: int = Field(description="Apparent size of its regular files.")
    changelog_entry: int = Field(description="The workspace's last changelog entry when it was taken (0: none).")
    settings: dict[str, Any] = Field(description="The workspace's own settings then (image, limits, egress, env).")
    parent: str | None = Field(None, description="The snapshot its workspace was forked from, if any.")
    with_scratch: bool = Field(False, description="Whether it holds the sandbox's /tmp and $HOME.")
    deleted: float | None = Field(None, description="When it was deleted (its row is kept for lineage).")
    forks: list[str] = Field(default_factory=list, description="Directories of the forks made from it.")
    live_forks: list[str] = Field(default_factory=list, description="Those forks whose directory still exists.")
    children: list[str] = Field(default_factory=list, description="Snapshots taken of those forks.")


class Fork(BaseModel):
    """A workspace made from a snapshot."""

    model_config = ConfigDict(extra="forbid")

    workspace: str
    snapshot: str
    created: float
    strategy: str


class Index:
    """The index database; every method is blocking (call it through ``asyncio.to_thread``)."""

    def __init__(self, root: Path) -> None:
        """Open (creating) ``root/index.sqlite3``. Raises SnapshotError."""
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._db = sqlite3.connect(self.root / "index.sqlite3", isolation_level=None, check_same_thread=False)
            enable_wal(self._db)
            self._db.execute("PRAGMA busy_timeout=60000")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise SnapshotError(f"cannot open the snapshot index in {self.root}: {e}") from e

    def close(self) -> None:
        self._db.close()

    def directory(self, snapshot_id: str) -> Path:
        return self.root / snapshot_id

    def _snapshot(self, row: tuple[Any, ...]) -> Snapshot:
        d = dict(zip([c.strip() for c in _COLUMNS.split(",")], row, strict=True))
        d["settings"] = json.loads(d["settings"])
        d["with_scratch"] = bool(d["with_scratch"])
        snap = Snapshot(**d)
        forks = [
            r[0]
            for r in self._db.execute(
                "SELECT workspace FROM forks WHERE snapshot = ? ORDER BY created, workspace", (snap.id,)
            )
        ]
        snap.forks = forks
        snap.live_forks = [f for f in forks if os.path.isdir(f)]
        if forks:
            marks = ",".join("?" * len(forks))
            snap.children = [
                r[0]
                for r in self._db.execute(
                    f"SELECT id FROM snapshots WHERE workspace IN ({marks}) ORDER BY created", forks
                )
            ]
        return snap

    def add(self, snap: Snapshot) -> None:
        self._db.execute(
            f"INSERT INTO snapshots({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                snap.id,
                snap.name,
                snap.workspace,
                snap.created,
                snap.strategy,
                snap.files,
                snap.bytes,
                snap.changelog_entry,
                json.dumps(snap.settings, sort_keys=True),
                snap.parent,
                int(snap.with_scratch),
                snap.deleted,
            ),
        )

    def get(self, ref: str, workspace: str | None = None) -> Snapshot:
        """A snapshot by id, or by name (the newest of that name; of ``workspace`` when
        given). Raises SnapshotNotFoundError."""
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM snapshots WHERE id = ?", (ref,)).fetchall()
        if not rows:
            where, params = "name = ? AND deleted IS NULL", [ref]
            if workspace is not None:
                where += " AND workspace = ?"
                params.append(workspace)
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM snapshots WHERE {where} ORDER BY created DESC LIMIT 1", params
            ).fetchall()
        if not rows:
            raise SnapshotNotFoundError(f"no snapshot {ref!r}" + (f" of {workspace}" if workspace else ""))
        return self._snapshot(rows[0])

    def list(self, workspace: str | None = None, *, deleted: bool = False) -> list[Snapshot]:
        """Snapshots, oldest first (of ``workspace`` when given; deleted ones with ``deleted``)."""
        where, params = ["1"], []
        if workspace is not None:
            where.append("workspace = ?")
            params.append(workspace)
        if not deleted:
            where.append("deleted IS NULL")
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM snapshots WHERE {' AND '.join(where)} ORDER BY created, id", params
        ).fetchall()
        return [self._snapshot(r) for r in rows]

    def count(self, workspace: str) -> int:
        return int(
            self._db.execute(
                "SELECT COUNT(*) FROM snapshots WHERE workspace = ? AND deleted IS NULL", (workspace,)
            ).fetchone()[0]
        )

    def total_bytes(self) -> int:
        return int(
            self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM snapshots WHERE deleted IS NULL").fetchone()[0]
        )

    def mark_deleted(self, snapshot_id: str) -> None:
        self._db.execute("UPDATE snapshots SET deleted = ? WHERE id = ?", (time.time(), snapshot_id))

    def add_forks(self, forks: builtins.list[Fork]) -> None:
        self._db.execute("BEGIN IMMEDIATE")  # one transaction, one commit
        try:
            self._db.executemany(
                "INSERT OR REPLACE INTO forks(workspace, snapshot, created, strategy) VALUES (?,?,?,?)",
                [(f.workspace, f.snapshot, f.created, f.strategy) for f in forks],
            )
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def drop_fork(self, workspace: str) -> None:
        self._db.execute("DELETE FROM forks WHERE workspace = ?", (workspace,))

    def origin(self, workspace: str) -> Fork | None:
        """The fork record of ``workspace`` (None: not a fork)."""
        row = self._db.execute(
            "SELECT workspace, snapshot, created, strategy FROM forks WHERE workspace = ?", (workspace,)
        ).fetchone()
        return None if row is None else Fork(workspace=row[0], snapshot=row[1], created=row[2], strategy=row[3])
