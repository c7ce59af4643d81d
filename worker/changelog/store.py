"""Durable storage of one workspace's changelog: a SQLite database in WAL mode.

Why SQLite, blobs included: one committed transaction makes the entry *and* its
before-image durable together (one fsync with ``synchronous=FULL``), so a crash can never
leave an entry pointing at a missing or torn blob, nor an orphan blob file; WAL lets a CLI
call read while a server writes; ``AUTOINCREMENT`` ids are never reused, even after a
crash or a deleted row. Blobs are content-addressed (sha256 primary key), so the baseline
and repeated edits of the same file are stored once. Files up to the 16 MiB per-file cap
sit comfortably in SQLite rows.

Everything here is blocking; :class:`~worker.changelog.recorder.Changelog` calls it on
one dedicated thread. Several processes may share a database: writers serialize on
SQLite's own lock (``BEGIN IMMEDIATE`` + ``busy_timeout``) and, for the read-check-write
sequences that must not interleave, on :class:`WorkspaceLock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fcntl
import functools
import hashlib
import os
import secrets
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import lockwait
from ..result import has_surrogate
from ..storage.sqlite_wal import enable_wal
from .errors import ChangelogDamagedError, ChangelogStorageError
from .model import Entry

SCHEMA_VERSION = "2"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs(sha256 TEXT PRIMARY KEY, size INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS entries(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  ts REAL NOT NULL, call_id TEXT, subtask_id TEXT, tool TEXT NOT NULL,
  op TEXT NOT NULL CHECK (op IN ('create','modify','delete','rename')),
  path TEXT NOT NULL, new_path TEXT, before_hash TEXT, after_hash TEXT,
  before_kind TEXT, after_kind TEXT, before_mode INTEGER,
  state TEXT NOT NULL CHECK (state IN ('pending','applied','failed')),
  origin TEXT NOT NULL CHECK (origin IN ('tool','shell','undo')),
  restorable INTEGER NOT NULL, note TEXT, reverts INTEGER, reverted_by INTEGER);
CREATE INDEX IF NOT EXISTS entries_call ON entries(call_id);
CREATE INDEX IF NOT EXISTS entries_subtask ON entries(subtask_id);
CREATE INDEX IF NOT EXISTS entries_path ON entries(path);
CREATE INDEX IF NOT EXISTS entries_pending ON entries(state) WHERE state = 'pending';
CREATE TABLE IF NOT EXISTS baseline(
  path TEXT PRIMARY KEY, type TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
  ino INTEGER NOT NULL, mode INTEGER NOT NULL, sha256 TEXT, target TEXT, status TEXT NOT NULL,
  racy INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS baseline_racy ON baseline(racy) WHERE racy = 1;
CREATE TABLE IF NOT EXISTS members(
  entry_id INTEGER NOT NULL, path TEXT NOT NULL, type TEXT NOT NULL, PRIMARY KEY(entry_id, path));
"""
#: Columns added after schema 1, with their types: added to an older database when it is
#: opened (``ALTER TABLE ... ADD COLUMN``: cheap, no rewrite; old rows read NULL).
_ADDED_COLUMNS = (("after_mode", "INTEGER"), ("tree_files", "INTEGER"), ("tree_bytes", "INTEGER"))

ENTRY_COLUMNS = (
    "id, ts, call_id, subtask_id, tool, op, path, new_path, before_hash, after_hash, before_kind, "
    "after_kind, before_mode, state, origin, restorable, note, reverts, reverted_by, after_mode, "
    "tree_files, tree_bytes"
)
_ENTRY_FIELDS = [c.strip() for c in ENTRY_COLUMNS.split(",")]
BASELINE_COLUMNS = "path, type, size, mtime_ns, ino, mode, sha256, target, status, racy"
#: ``racy`` of a baseline row a tool's write left with the stat the sandbox reported (or a
#: scan then found still holding that content): racy (a stat walk re-hashes it), and its
#: content is the changelog's own, so a scan that reports the file checks it by hash, not
#: by a read (``ShellTracker._known_content``).
RACY_OWN_WRITE = 2


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- text that SQLite cannot hold as it is --------------------------------------------
#
# A Linux file name is bytes, not UTF-8: a command may create ``b"bad\xff.txt"``, which
# reaches the host as the str "bad\udcff.txt" (surrogateescape), and a caller's call id
# may hold a lone surrogate too. SQLite's TEXT must be UTF-8, so binding such a str
# failed, and with it every later scan of the workspace (one odd file name made every
# shell command an internal error). Such strings are stored with each NUL or surrogate
# written as NUL + four hex digits: reversible, and no other string maps to the same
# text (a stored NUL always starts an escape; file names never hold NUL). Everything
# else is stored as it is, so ordinary rows read the same with any SQLite client.


def _escape(text: str) -> str:
    return "".join(f"\x00{ord(c):04x}" if c == "\x00" or "\ud800" <= c <= "\udfff" else c for c in text)


def _unescape(text: str) -> str:
    out, i = [], 0
    while True:
        j = text.find("\x00", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        out.append(chr(int(text[j + 1 : j + 5], 16)))
        i = j + 5


def to_db(value: Any) -> Any:
    """``value`` as bound to SQLite (only a str that UTF-8 cannot hold changes)."""
    if type(value) is str and ("\x00" in value or (not value.isascii() and has_surrogate(value))):
        return _escape(value)
    return value


def _text(raw: bytes) -> str:
    """SQLite TEXT back to the str that was stored (the connection's text factory)."""
    text = raw.decode("utf-8", "surrogateescape")
    return _unescape(text) if "\x00" in text else text


def _params(params: Any) -> Any:
    if isinstance(params, dict):
        return {k: to_db(v) for k, v in params.items()}
    return tuple(to_db(v) for v in params)


class Connection:
    """The store's SQLite connection with every bound parameter passed through
    :func:`to_db` (reads are decoded by the connection's text factory)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.raw = db

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        return self.raw.execute(sql, _params(params))

    def executemany(self, sql: str, rows: Iterable[Any]) -> sqlite3.Cursor:
        return self.raw.executemany(sql, (_params(r) for r in rows))

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction


def _storage_error(path: Path, e: sqlite3.Error, workspace: Path | None = None) -> ChangelogStorageError:
    """SQLite's error as ours: a malformed database is damage, anything else (a full disk,
    an I/O error, busy beyond the timeout) a storage failure."""
    if isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError):
        return ChangelogDamagedError(path, str(e), workspace)
    if "malformed" in str(e) or "not a database" in str(e):
        return ChangelogDamagedError(path, str(e), workspace)
    return ChangelogStorageError(f"changelog storage failed: {e}")


_MAGIC = b"SQLite format 3\x00"


def _damage(path: Path, existed: bool) -> str | None:
    """What is wrong with the file of a database, judged without opening it: None when it
    is a healthy file or may be a new one. ``existed``: it held a history before."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "the database file is missing" if existed else None
    except OSError as e:
        return f"cannot stat it: {e}"
    if st.st_size == 0:
        return "the database file is empty (0 bytes)" if existed else None
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        return f"cannot read it: {e}"
    if len(head) < 100 or not head.startswith(_MAGIC):
        return "not a SQLite database (its header is damaged)"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    valid = head[24:28] == head[92:96]  # the header's page count is current
    try:
        wal = os.stat(str(path) + "-wal").st_size
    except OSError:
        wal = 0
    # With frames in the WAL a checkpoint may have been cut short: SQLite replays it.
    if valid and wal == 0 and pages and st.st_size < pages * page:
        return f"truncated: {st.st_size} bytes of the {pages * page} its header counts"
    return None


def _entry(row: Sequence[Any]) -> Entry:
    d = dict(zip(_ENTRY_FIELDS, row, strict=True))
    d["restorable"] = bool(d["restorable"])
    return Entry(**d)


def _make_schema(db: sqlite3.Connection) -> None:
    """This version's schema made in ``db`` (in the caller's transaction), whatever part of
    it is there already, and its version recorded."""
    for stmt in _SCHEMA.split(";"):
        if stmt.strip():
            db.execute(stmt)
    have = {r[1] for r in db.execute("PRAGMA table_info(entries)").fetchall()}
    for col, typ in _ADDED_COLUMNS:
        if col not in have:
            db.execute(f"ALTER TABLE entries ADD COLUMN {col} {typ}")
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))


@functools.cache
def _template() -> bytes:
    """A new database's file: this version's schema, in WAL mode, made once per process in
    memory. Made on disk instead, a database's schema statements and its switch to WAL took
    ~4.5 ms of CPU and two fsyncs of every new workspace (~7 ms here, more while the
    workspace's sandbox starts beside it); written from here it is one file and one fsync."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db.execute("BEGIN")
        _make_schema(db)
        db.execute("COMMIT")
        image = bytearray(db.serialize())
    finally:
        db.close()
    image[18] = image[19] = 2  # the file format's write and read versions: 2 is WAL
    return bytes(image)


def _create(path: Path, fsync: bool) -> None:
    """Make ``path`` a new database from :func:`_template` unless a file is there (or
    appears meanwhile: another process creating it, whose file is never replaced). Written
    aside, synced, then linked into place, so a crash leaves either no database or a whole
    one. Best effort: anything failing leaves the database to be made as before.
    """
    if os.path.lexists(path):
        return
    tmp = path.with_name(f"{path.name}.new-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, _template())
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.link(tmp, path)  # (never over a file: EEXIST when another process made one)
    except (OSError, sqlite3.Error, AttributeError):  # (AttributeError: a SQLite without serialize)
        pass
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


@functools.cache
def _schema_objects() -> frozenset[tuple[str, str]]:
    """The tables and indexes :data:`_SCHEMA` makes, as ``sqlite_master`` names them."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(_SCHEMA)
        return frozenset(db.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))
    finally:
        db.close()


def _current(raw: sqlite3.Connection) -> bool:
    """Whether a database has this version's whole schema (every table and index, the added
    columns, the version recorded): opening it then changes nothing. Reads only."""
    have = set(raw.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))
    if not _schema_objects() <= have:
        return False
    columns = {r[1] for r in raw.execute("PRAGMA table_info(entries)")}
    if any(col not in columns for col, _ in _ADDED_COLUMNS):
        return False
    row = raw.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    return row is not None and row[0] == SCHEMA_VERSION


class Store:
    """One workspace's changelog database. Not thread-safe: use it from one thread."""

    def __init__(self, path: Path, *, fsync: bool = True, workspace: Path | None = None) -> None:
        """Open (creating) the database. ``fsync=False`` commits without fsync
        (``synchronous=NORMAL`` in WAL mode): a committed transaction survives the death of
        any process, not a power cut. ``workspace`` names the workspace in errors.

        A database that held a history before (its marker file ``<name>.created`` exists)
        but is now missing, empty, truncated or not a database is never taken as a new,
        empty history: ChangelogDamagedError. Raises ChangelogStorageError otherwise.
        """
        self._fsync = fsync
        self.path = path
        self.workspace = workspace
        marker = path.with_name(path.name + ".created")
        existed = marker.exists()
        problem = _damage(path, existed)
        if problem is not None:
            raise ChangelogDamagedError(path, problem, workspace)
        if not existed:
            _create(path, fsync)
        try:
            raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
            raw.text_factory = _text
            self._db = Connection(raw)
            enable_wal(raw)
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            self._db.execute("PRAGMA busy_timeout=60000")
            if existed:
                self._check(raw)
            # A history of this version opens without a write (a transaction and its fsync:
            # ~3 ms of every open, every CLI call's), and so does a new one made from the
            # template; any other is brought up to date in one transaction, the workspace it
            # records named in it.
            if not _current(raw):
                with self.tx():
                    _make_schema(raw)
                    if workspace is not None:
                        self._db.execute(
                            "INSERT OR IGNORE INTO meta(key, value) VALUES ('workspace', ?)", (str(workspace),)
                        )
        except ChangelogDamagedError:
            raise
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError):
                raise ChangelogStorageError(f"cannot open the changelog database {path}: {e}") from e
            raise ChangelogDamagedError(path, str(e), workspace) from e
        if not existed:
            try:  # from now on an empty or missing database is a lost history
                marker.touch(mode=0o600)
            except OSError as e:
                raise ChangelogStorageError(f"cannot write {marker}: {e}") from e

    def _check(self, raw: sqlite3.Connection) -> None:
        """The integrity check of a database that held a history: SQLite's own
        ``quick_check`` (reads every page: a few milliseconds per megabyte, once per open)
        and the tables a history has. Raises ChangelogDamagedError."""
        try:
            rows = raw.execute("PRAGMA quick_check(5)").fetchall()
            tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as e:
            raise ChangelogDamagedError(self.path, str(e), self.workspace) from e
        if rows != [("ok",)]:
            problem = "integrity check: " + "; ".join(str(r[0]) for r in rows)[:300]
            raise ChangelogDamagedError(self.path, problem, self.workspace)
        missing = {"meta", "entries", "blobs", "baseline"} - tables
        if missing:
            raise ChangelogDamagedError(self.path, "tables missing: " + ", ".join(sorted(missing)), self.workspace)

    def close(self) -> None:
        self._db.raw.close()

    @contextlib.contextmanager
    def tx(self, *, durable: bool = True) -> Iterator[Connection]:
        """One write transaction. ``durable=False`` skips the commit fsync (safe against a
        process crash, not a power cut) for records that recovery can rebuild; a store
        opened with ``fsync=False`` never fsyncs.

        Raises ChangelogStorageError (disk full, I/O error, busy beyond the timeout).
        """
        db = self._db
        switch = not durable and self._fsync  # a NORMAL connection has nothing to switch
        try:
            if switch:
                db.execute("PRAGMA synchronous=NORMAL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise _storage_error(self.path, e, self.workspace) from e
        finally:
            if switch:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("PRAGMA synchronous=FULL")

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        """Raises ChangelogStorageError."""
        try:
            return self._db.execute(sql, tuple(params)).fetchall()
        except sqlite3.Error as e:
            raise _storage_error(self.path, e, self.workspace) from e

    # -- blobs ----------------------------------------------------------------------

    @staticmethod
    def put_blob(db: Connection, digest: str, data: bytes) -> None:
        db.execute("INSERT OR IGNORE INTO blobs(sha256, size, data) VALUES (?, ?, ?)", (digest, len(data), data))

    def get_blob(self, digest: str) -> bytes | None:
        """The blob, or None when missing or when its content no longer matches its name."""
        rows = self.query("SELECT data FROM blobs WHERE sha256 = ?", (digest,))
        if not rows:
            return None
        data = bytes(rows[0][0])
        return data if sha256(data) == digest else None

    # -- entries --------------------------------------------------------------------

    @staticmethod
    def insert_entry(db: Connection, **fields: Any) -> int:
        """Insert an entry; ``_made``: entries inserted first, in the same transaction (the
        directories a write makes, each dict's ``fields``; its ``id`` is set)."""
        for m in fields.pop("_made", ()):
            m["id"] = Store.insert_entry(db, **m["fields"])
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        cur = db.execute(f"INSERT INTO entries({cols}) VALUES ({marks})", tuple(fields.values()))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def entries(self, where: str = "1", params: Iterable[Any] = (), *, order: str = "id") -> list[Entry]:
        return [
            _entry(r) for r in self.query(f"SELECT {ENTRY_COLUMNS} FROM entries WHERE {where} ORDER BY {order}", params)
        ]

    def entry(self, entry_id: int) -> Entry | None:
        found = self.entries("id = ?", (entry_id,))
        return found[0] if found else None

    @staticmethod
    def put_members(db: Connection, entry_id: int, members: Iterable[tuple[str, str]]) -> None:
        """The paths (with their types) a group entry covers (see ``Entry.tree_files``)."""
        db.executemany(
            "INSERT OR IGNORE INTO members(entry_id, path, type) VALUES (?, ?, ?)",
            ((entry_id, p, t) for p, t in members),
        )

    def members(self, entry_id: int) -> list[tuple[str, str]]:
        """The (path, type) pairs of a group entry, sorted by path."""
        rows = self.query("SELECT path, type FROM members WHERE entry_id = ? ORDER BY path", (entry_id,))
        return [(r[0], r[1]) for r in rows]

    # -- meta -----------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        rows = self.query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    @staticmethod
    def set_meta(db: Connection, key: str, value: str) -> None:
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))


#: Per lock file: the hold in progress in this process (see :class:`WorkspaceLock`).
_HOLDS: dict[str, object] = {}
_HELD: contextvars.ContextVar[frozenset[object]] = contextvars.ContextVar("loom_held_locks", default=frozenset())
#: Per task: for each ``async with`` of a WorkspaceLock in progress, whether it re-entered.
_ENTERED: contextvars.ContextVar[tuple[bool, ...]] = contextvars.ContextVar("loom_lock_entries", default=())


class WorkspaceLock:
    """Serializes read-check-write sequences on one workspace across coroutines *and*
    processes: an ``asyncio.Lock`` in-process plus ``flock`` on a file in the data
    directory. The kernel drops a dead process's ``flock``, so a SIGKILL never wedges it.
    Acquisition polls with ``LOCK_NB`` so that cancelling a waiter can never leave the
    lock held by an orphaned thread.

    Reentrant within one hold: code running inside a hold (the same task, or a task it
    started during the hold) passes through, whichever ``WorkspaceLock`` object of the
    same file it uses. Why: a workspace holds its mutation lock across a whole command
    and calls the changelog, which takes the same lock for what other callers (an undo
    from the CLI) must not interleave with; several changelog objects of one workspace
    may live in one process (the service's and the registry's), each with its own file
    descriptor, and two descriptors' ``flock`` would wait for each other. A task started
    during a hold that outlives it holds nothing afterwards (the hold's token is gone).
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._key = str(path)
        self._local = asyncio.Lock()

    def _reentered(self) -> bool:
        hold = _HOLDS.get(self._key)
        return hold is not None and hold in _HELD.get()

    async def __aenter__(self) -> None:
        if self._reentered():
            _ENTERED.set((*_ENTERED.get(), True))
            return
        with lockwait.waiting():
            await self._local.acquire()
            try:
                delay = 0.0005
                while True:
                    try:
                        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 0.02)
            except BaseException:
                self._local.release()
                raise
        token = object()
        _HOLDS[self._key] = token
        _HELD.set(_HELD.get() | {token})
        _ENTERED.set((*_ENTERED.get(), False))

    async def __aexit__(self, *exc: object) -> None:
        entered = _ENTERED.get()
        _ENTERED.set(entered[:-1])
        if entered and entered[-1]:
            return  # a re-entry: the outer hold releases
        token = _HOLDS.pop(self._key, None)
        _HELD.set(_HELD.get() - {token})
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._local.release()

    def close(self) -> None:
        os.close(self._fd)
