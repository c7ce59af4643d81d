"""The SQLite FTS5 store behind the tool catalog.

Tables: ``tools`` (one row per tool, keyed by its id), ``tools_fts`` (an external-content
FTS5 index over name, description, capabilities, keywords; ``porter unicode61``) and
``tool_sources`` (status of each source). The FTS index is kept in step by triggers, and
tools are written with an *upsert* (``INSERT ... ON CONFLICT DO UPDATE``), never with
``INSERT OR REPLACE``: REPLACE deletes the old row without firing the delete trigger, so
the old text's tokens would stay in the index forever (the Go registry's fault). Rows
whose content hash is unchanged are not rewritten at all.

Each row also stores ``stems``: the terms FTS5 indexed for its four fields (computed
with :mod:`worker.catalog.stem` when the row is written), so search can say which
query word matched which field for its few best rows without FTS5 ``highlight()``.

Everything here is synchronous and guarded by one lock; :mod:`worker.catalog.search`
calls it through ``asyncio.to_thread``. Raises ``sqlite3.Error`` only for a broken
database file (infrastructure), never for user text: queries arrive here already built
from quoted terms (see :func:`fts_query`).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..storage.sqlite_wal import enable_wal
from .stem import padded

Source = Literal["builtin", "custom", "mcp"]
WEIGHTS = (10.0, 5.0, 3.0, 2.0)  # name, description, capabilities, keywords

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tools (
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    source TEXT NOT NULL,
    mcp_server TEXT NOT NULL DEFAULT '',
    input_schema TEXT,
    output_schema TEXT,
    capabilities TEXT NOT NULL,      -- JSON array of tags
    keywords TEXT NOT NULL,          -- JSON array of words
    examples TEXT NOT NULL,          -- JSON array
    indexed_at TEXT NOT NULL,
    version TEXT,
    requires_approval INTEGER NOT NULL DEFAULT 0,
    content_hash TEXT NOT NULL,
    stems TEXT NOT NULL DEFAULT ''   -- the FTS terms of the four indexed fields (see _stems)
);
CREATE INDEX IF NOT EXISTS tools_by_source ON tools(source, mcp_server);
CREATE VIRTUAL TABLE IF NOT EXISTS tools_fts USING fts5(
    name, description, capabilities, keywords,
    content='tools', content_rowid='rowid', tokenize='porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS tools_ai AFTER INSERT ON tools BEGIN
    INSERT INTO tools_fts(rowid, name, description, capabilities, keywords)
    VALUES (new.rowid, new.name, new.description, new.capabilities, new.keywords);
END;
CREATE TRIGGER IF NOT EXISTS tools_ad AFTER DELETE ON tools BEGIN
    INSERT INTO tools_fts(tools_fts, rowid, name, description, capabilities, keywords)
    VALUES ('delete', old.rowid, old.name, old.description, old.capabilities, old.keywords);
END;
CREATE TRIGGER IF NOT EXISTS tools_au AFTER UPDATE ON tools BEGIN
    INSERT INTO tools_fts(tools_fts, rowid, name, description, capabilities, keywords)
    VALUES ('delete', old.rowid, old.name, old.description, old.capabilities, old.keywords);
    INSERT INTO tools_fts(rowid, name, description, capabilities, keywords)
    VALUES (new.rowid, new.name, new.description, new.capabilities, new.keywords);
END;
CREATE TABLE IF NOT EXISTS tool_sources (
    name TEXT PRIMARY KEY,           -- 'builtin', 'custom', 'mcp:<server>'
    type TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    tool_count INTEGER NOT NULL DEFAULT 0,
    last_indexed TEXT,
    available INTEGER NOT NULL DEFAULT 1,
    status_message TEXT NOT NULL DEFAULT ''
);
"""

_UPSERT = """
INSERT INTO tools (id, name, description, source, mcp_server, input_schema, output_schema,
                   capabilities, keywords, examples, indexed_at, version, requires_approval, content_hash, stems)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT(id) DO UPDATE SET
    name=excluded.name, description=excluded.description, source=excluded.source,
    mcp_server=excluded.mcp_server, input_schema=excluded.input_schema,
    output_schema=excluded.output_schema, capabilities=excluded.capabilities,
    keywords=excluded.keywords, examples=excluded.examples, indexed_at=excluded.indexed_at,
    version=excluded.version, requires_approval=excluded.requires_approval,
    content_hash=excluded.content_hash, stems=excluded.stems
WHERE tools.content_hash != excluded.content_hash
"""

#: PRAGMA user_version once every row's ``stems`` is filled in by the current stemmer.
SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 5000  # how long a write waits for another process's write
_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
STEMS_SEP = "\x1f"

# Merge the FTS index into one segment after writes: a bulk index leaves several, and
# every query term is then looked up in each (about a third of a 1,000-tool query). It
# rewrites the whole index, which costs milliseconds even at 10,000 tools.
_OPTIMIZE = "INSERT INTO tools_fts(tools_fts) VALUES('optimize')"

_COLS = (
    "id, name, description, source, mcp_server, input_schema, output_schema, capabilities, "
    "keywords, examples, indexed_at, version, requires_approval"
)


@dataclass(frozen=True)
class ToolDescriptor:
    """One indexed tool, independent of where it came from."""

    id: str
    name: str
    description: str
    source: Source
    mcp_server: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    capabilities: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    examples: tuple[dict[str, Any], ...] = ()
    version: str | None = None
    requires_approval: bool = False
    indexed_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "mcp_server": self.mcp_server or None,
            "input_schema": self.input_schema,
            "output_schema": self.output_schema,
            "capabilities": list(self.capabilities),
            "keywords": list(self.keywords),
            "examples": list(self.examples),
            "version": self.version,
            "requires_approval": self.requires_approval,
            "indexed_at": self.indexed_at,
        }


@dataclass(frozen=True)
class SourceInfo:
    name: str
    type: str
    description: str
    tool_count: int
    last_indexed: str | None
    available: bool
    status_message: str


@dataclass(frozen=True)
class IndexStats:
    source: str
    total: int
    written: int  # new or changed rows
    pruned: int


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _row(t: ToolDescriptor, now: str) -> tuple[Any, ...]:
    caps = json.dumps(list(t.capabilities))
    kws = json.dumps(list(t.keywords))
    ins = json.dumps(t.input_schema, sort_keys=True, separators=(",", ":"))
    outs = None if t.output_schema is None else json.dumps(t.output_schema, sort_keys=True)
    ex = json.dumps(list(t.examples), sort_keys=True)
    h = hashlib.blake2b(
        "\x1f".join(
            (
                t.name,
                t.description,
                t.source,
                t.mcp_server,
                ins,
                outs or "",
                caps,
                kws,
                ex,
                t.version or "",
                str(int(t.requires_approval)),
            )
        ).encode(),
        digest_size=16,
    ).hexdigest()
    return (
        t.id,
        t.name,
        t.description,
        t.source,
        t.mcp_server,
        ins,
        outs,
        caps,
        kws,
        ex,
        now,
        t.version,
        int(t.requires_approval),
        h,
    )


_W = ", ".join(str(x) for x in WEIGHTS)
_T_COLS = ", ".join(f"t.{c.strip()}" for c in _COLS.split(","))
# Rank in the FTS table (joined with ``tools`` only when a filter needs its columns),
# then read just the winners' rows. CROSS JOIN keeps FTS the outer loop: driving FTS by
# rowid lookups (which the planner may pick for an IN filter) re-runs the MATCH per row;
# ``+rowid`` likewise keeps the allowed-rowid test a plain per-row check.
_TOP = (
    f"SELECT {_T_COLS}, f.score, t.stems FROM (SELECT tools_fts.rowid AS rowid, bm25(tools_fts, {_W}) AS score"
    " FROM tools_fts{join} WHERE tools_fts MATCH ?{where} ORDER BY score, rowid LIMIT ?) f"
    " CROSS JOIN tools t ON t.rowid = f.rowid{outer}"
)
_JOIN = " CROSS JOIN tools t ON t.rowid = tools_fts.rowid"
_IN_ALLOWED_ROWIDS = " AND +tools_fts.rowid IN temp.allowed_rowids"
# Checked again by id on the winners: a stale rowid can cost a candidate, never let one
# that is not allowed through.
_IN_ALLOWED_IDS = " WHERE t.id IN temp.allowed_ids"


def _stems(name: str, description: str, capabilities: str, keywords: str) -> str:
    """The ``stems`` column: each FTS column's terms as ``" a b "`` (see
    :func:`worker.catalog.stem.padded`), in column order, joined by :data:`STEMS_SEP`."""
    return STEMS_SEP.join((padded(name), padded(description), padded(capabilities), padded(keywords)))


def descriptor_from_row(r: Sequence[Any]) -> ToolDescriptor:
    """The descriptor of a row whose first columns are ``_COLS`` (as :meth:`CatalogIndex.fts_top` returns)."""
    return _descriptor(r)


def _descriptor(r: Sequence[Any]) -> ToolDescriptor:
    return ToolDescriptor(
        id=r[0],
        name=r[1],
        description=r[2],
        source=r[3],
        mcp_server=r[4] or "",
        input_schema=json.loads(r[5]) if r[5] else {},
        output_schema=json.loads(r[6]) if r[6] else None,
        capabilities=tuple(json.loads(r[7])),
        keywords=tuple(json.loads(r[8])),
        examples=tuple(json.loads(r[9])) if r[9] != "[]" else (),
        indexed_at=r[10],
        version=r[11],
        requires_approval=bool(r[12]),
    )


def source_key(source: str, mcp_server: str = "") -> str:
    return f"mcp:{mcp_server}" if source == "mcp" else source


class CatalogIndex:
    """The store. ``path`` may be ``":memory:"`` (tests, benchmarks)."""

    def __init__(self, path: Path | str) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            str(path), timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False, isolation_level=None
        )
        enable_wal(self._db, BUSY_TIMEOUT_MS / 1000)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        if self._db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            self._migrate()
        self._writes = 0  # bumped by every write of ours (PRAGMA data_version counts the others')
        self._allowed: frozenset[str] | None = None  # the ids in temp.allowed_ids
        self._allowed_key: tuple[int, int] | None = None  # (data_version, _writes) of temp.allowed_rowids

    def _migrate(self) -> None:
        """Bring a database written by an older version up to date: add and fill ``stems``."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:  # another process may have won
                cols = {r[1] for r in db.execute("PRAGMA table_info(tools)")}
                if "stems" not in cols:
                    db.execute("ALTER TABLE tools ADD COLUMN stems TEXT NOT NULL DEFAULT ''")
                rows = db.execute("SELECT rowid, name, description, capabilities, keywords FROM tools").fetchall()
                db.executemany("UPDATE tools SET stems=? WHERE rowid=?", [(_stems(*r[1:]), r[0]) for r in rows])
                db.execute(_OPTIMIZE)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writing ----------------------------------------------------------------------

    def replace_source(
        self,
        source: Source,
        tools: Iterable[ToolDescriptor],
        *,
        mcp_server: str = "",
        description: str = "",
        status_message: str = "",
    ) -> IndexStats:
        """Make ``tools`` the complete set of this source's tools: upsert them and prune
        the ones that are no longer there, in one transaction."""
        key = source_key(source, mcp_server)
        now = _now()
        rows = [_row(t, now) for t in tools]
        for t in rows:
            if t[3] != source or t[4] != mcp_server:
                raise ValueError(f"tool {t[0]!r} does not belong to source {key!r}")
        ids = {r[0] for r in rows}
        with self._lock:
            self._writes += 1
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                existing = dict(
                    db.execute(
                        "SELECT id, content_hash FROM tools WHERE source=? AND mcp_server=?",
                        (source, mcp_server),
                    ).fetchall()
                )
                changed = [(*r, _stems(r[1], r[2], r[7], r[8])) for r in rows if existing.get(r[0]) != r[13]]
                db.executemany(_UPSERT, changed)
                written = len(changed)
                stale = [(i,) for i in existing if i not in ids]
                db.executemany("DELETE FROM tools WHERE id=?", stale)
                db.execute(
                    "INSERT INTO tool_sources(name, type, description, tool_count, last_indexed, available,"
                    " status_message) VALUES (?,?,?,?,?,1,?) ON CONFLICT(name) DO UPDATE SET"
                    " type=excluded.type, description=excluded.description, tool_count=excluded.tool_count,"
                    " last_indexed=excluded.last_indexed, available=1,"
                    " status_message=excluded.status_message",
                    (key, source, description, len(ids), now, status_message),
                )
                if changed or stale:
                    db.execute(_OPTIMIZE)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return IndexStats(source=key, total=len(ids), written=written, pruned=len(stale))

    def mark_source_unavailable(self, source: Source, message: str, *, mcp_server: str = "") -> None:
        """Record that a source could not be read; its previously indexed tools stay."""
        key = source_key(source, mcp_server)
        with self._lock:
            self._db.execute(
                "INSERT INTO tool_sources(name, type, available, status_message) VALUES (?,?,0,?)"
                " ON CONFLICT(name) DO UPDATE SET available=0, status_message=excluded.status_message",
                (key, source, message),
            )

    def remove_source(self, source: Source, *, mcp_server: str = "") -> int:
        """Drop a source and all its tools (e.g. an MCP server removed from the config)."""
        with self._lock:
            self._writes += 1
            cur = self._db.execute("DELETE FROM tools WHERE source=? AND mcp_server=?", (source, mcp_server))
            self._db.execute("DELETE FROM tool_sources WHERE name=?", (source_key(source, mcp_server),))
            if cur.rowcount:
                self._db.execute(_OPTIMIZE)
            return cur.rowcount

    # -- reading ----------------------------------------------------------------------

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM tools").fetchone()[0])

    def get(self, tool_id: str) -> ToolDescriptor | None:
        with self._lock:
            r = self._db.execute(f"SELECT {_COLS} FROM tools WHERE id=?", (tool_id,)).fetchone()
        return _descriptor(r) if r else None

    def get_many(self, ids: Sequence[str]) -> dict[str, ToolDescriptor]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLS} FROM tools WHERE id IN ({marks})", list(ids)).fetchall()
        return {r[0]: _descriptor(r) for r in rows}

    def tools_of(self, source: Source, *, mcp_server: str = "") -> list[ToolDescriptor]:
        """Every indexed tool of one source, by name."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLS} FROM tools WHERE source=? AND mcp_server=? ORDER BY name, id", (source, mcp_server)
            ).fetchall()
        return [_descriptor(r) for r in rows]

    def by_capability(self, capability: str, sources: Sequence[str] = (), limit: int = 50) -> list[ToolDescriptor]:
        where, params = _filters([capability], sources)
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLS} FROM tools t WHERE {where} ORDER BY t.name, t.id LIMIT ?", [*params, limit]
            ).fetchall()
        return [_descriptor(r) for r in rows]

    def sources(self) -> list[SourceInfo]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, type, description, tool_count, last_indexed, available, status_message"
                " FROM tool_sources ORDER BY name"
            ).fetchall()
        return [SourceInfo(r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6]) for r in rows]

    def integrity_check(self) -> bool:
        """True when the FTS index matches the ``tools`` table exactly (rank=1 compares
        every token against the content table)."""
        with self._lock:
            try:
                self._db.execute("INSERT INTO tools_fts(tools_fts, rank) VALUES('integrity-check', 1)")
            except sqlite3.DatabaseError:
                return False
        return True

    def fts_top(
        self,
        match: str,
        *,
        limit: int,
        capabilities: Sequence[str] = (),
        sources: Sequence[str] = (),
        allowed_ids: set[str] | frozenset[str] | None = None,
        wait: bool = True,
    ) -> list[tuple[Any, ...]] | None:
        """Best ``limit`` rows for an FTS ``match`` expression (already escaped) by BM25
        (weights :data:`WEIGHTS`; lower is better; ties by rowid), in no particular order.
        Each row is the columns of ``_COLS`` (:func:`descriptor_from_row` decodes them),
        then the bm25 score, then ``stems``. Filters are applied in SQL, before the limit.

        With ``wait=False`` it never waits (for callers on an event loop): None when another
        thread holds the index or SQLite reports the database busy."""
        if allowed_ids is not None and not allowed_ids:
            return []
        where, params = _filters(capabilities, sources)
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            if not wait:
                self._db.execute("PRAGMA busy_timeout=0")
            try:
                join = "" if where == "1" else _JOIN
                where = "" if where == "1" else f" AND {where}"
                outer = ""
                if allowed_ids is not None:
                    self._set_allowed(allowed_ids)
                    where += _IN_ALLOWED_ROWIDS
                    outer = _IN_ALLOWED_IDS
                sql = _TOP.format(join=join, where=where, outer=outer)
                return self._db.execute(sql, [match, *params, limit]).fetchall()
            except sqlite3.OperationalError as e:
                if not wait and getattr(e, "sqlite_errorcode", 0) & 0xFF in _BUSY:
                    return None
                raise
            finally:
                if not wait:
                    self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        finally:
            self._lock.release()

    def _set_allowed(self, allowed_ids: set[str] | frozenset[str]) -> None:
        """Make ``temp.allowed_ids`` hold exactly ``allowed_ids`` and ``temp.allowed_rowids``
        their rows. Callers pass the same set search after search (the tools a registry
        can run), so the ids are rewritten only when the set changes and the rowids when
        it or the tools table does. Call with the lock held."""
        db = self._db
        key = (int(db.execute("PRAGMA data_version").fetchone()[0]), self._writes)
        same_ids = self._allowed is not None and self._allowed == allowed_ids
        if same_ids and self._allowed_key == key:
            return
        self._allowed = self._allowed_key = None
        db.execute("CREATE TEMP TABLE IF NOT EXISTS allowed_ids (id TEXT PRIMARY KEY) WITHOUT ROWID")
        db.execute("CREATE TEMP TABLE IF NOT EXISTS allowed_rowids (rowid INTEGER PRIMARY KEY)")
        db.execute("BEGIN")
        try:
            if not same_ids:
                db.execute("DELETE FROM temp.allowed_ids")
                db.executemany("INSERT INTO temp.allowed_ids VALUES (?)", [(i,) for i in allowed_ids])
            db.execute("DELETE FROM temp.allowed_rowids")
            db.execute("INSERT INTO temp.allowed_rowids SELECT t.rowid FROM tools t WHERE t.id IN temp.allowed_ids")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._allowed, self._allowed_key = frozenset(allowed_ids), key


def _filters(capabilities: Sequence[str], sources: Sequence[str]) -> tuple[str, list[Any]]:
    """SQL conditions on ``tools t``: every capability present as a whole tag (JSON array
    element, never a substring), source in ``sources`` (``builtin``/``custom``/``mcp`` or
    ``mcp:<server>``)."""
    conds: list[str] = ["1"]
    params: list[Any] = []
    for cap in capabilities:
        conds.append("EXISTS (SELECT 1 FROM json_each(t.capabilities) WHERE value = ?)")
        params.append(cap)
    if sources:
        alts = []
        for s in sources:
            if s.startswith("mcp:"):
                alts.append("(t.source='mcp' AND t.mcp_server=?)")
                params.append(s[4:])
            else:
                alts.append("t.source=?")
                params.append(s)
        conds.append("(" + " OR ".join(alts) + ")")
    return " AND ".join(conds), params
