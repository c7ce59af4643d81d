"""Changelog durability modes, the deferred settling of a successful write, and pending
entries found when recording (a crashed writer's): settled by hash before the new entry."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import ExecRequest, Sandbox, StagedWrite, WriteResult
from worker.changelog import Changelog, Limits


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SpySandbox:
    """Forwards to a real sandbox, remembering the keyword arguments of each write."""

    def __init__(self, box: Sandbox) -> None:
        self._box = box
        self.writes: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._box, name)

    async def write(self, path: str, data: bytes, **kw: Any) -> WriteResult:
        self.writes.append(kw)
        return await self._box.write(path, data, **kw)

    async def stage_write(self, path: str, data: bytes, **kw: Any) -> StagedWrite:
        self.writes.append(kw)  # the staged half is where the file is written (and fsync'd)
        return await self._box.stage_write(path, data, **kw)


@pytest.fixture
async def box(local_backend: Any, workspace: Path) -> AsyncIterator[SpySandbox]:
    yield SpySandbox(await local_backend.get(workspace))


def synchronous(cl: Changelog) -> int:
    return int(cl._core.store.query("PRAGMA synchronous")[0][0])


async def test_full_is_the_default_and_fsyncs(tmp_path: Path, workspace: Path, box: Any) -> None:
    async with Changelog.open(tmp_path / "data", workspace) as cl:
        assert cl.limits.durability == "full"
        assert synchronous(cl) == 2  # FULL
        await cl.write(box, "a.txt", b"one")
    assert box.writes and all(kw.get("fsync", True) is True for kw in box.writes)


@pytest.mark.parametrize("how", ["argument", "limits"])
async def test_process_durability_skips_both_fsyncs(tmp_path: Path, workspace: Path, box: Any, how: str) -> None:
    kw: dict[str, Any] = {"durability": "process"} if how == "argument" else {"limits": Limits(durability="process")}
    async with Changelog.open(tmp_path / "data", workspace, **kw) as cl:
        assert cl.limits.durability == "process"
        assert synchronous(cl) == 1  # NORMAL: WAL commits without fsync
        await cl.write(box, "a.txt", b"one", call_id="c1")
        await cl.write(box, "a.txt", b"two", call_id="c2")
        assert [kw.get("fsync") for kw in box.writes] == [False, False]
        assert [(e.op, e.state) for e in await cl.log()] == [("create", "applied"), ("modify", "applied")]
        await cl.undo(box, all=True)
    assert not (workspace / "a.txt").exists()
    assert [kw.get("fsync") for kw in box.writes][-1] is False  # the undo's own write too


def test_unknown_durability_is_refused(tmp_path: Path, workspace: Path) -> None:
    with pytest.raises(ValueError):
        Changelog.open(tmp_path / "data", workspace, durability="sometimes")  # type: ignore[arg-type]


async def test_entries_are_settled_when_read_back_in_the_same_process(
    tmp_path: Path, workspace: Path, box: Any
) -> None:
    async with Changelog.open(tmp_path / "data", workspace) as cl:
        for i in range(20):
            await cl.write(box, "f.txt", b"v%d" % i)
            assert (await cl.log())[-1].state == "applied"


async def test_a_pending_entry_is_settled_before_the_next_is_recorded(
    tmp_path: Path, workspace: Path, box: Any
) -> None:
    async with Changelog.open(tmp_path / "data", workspace) as cl:
        # As if the writer died right after the agent wrote: the entry stays pending.
        cl._core._finish_later = lambda *a: None  # type: ignore[method-assign]
        await cl.write(box, "a.txt", b"one")
    async with Changelog.open(tmp_path / "data", workspace) as cl:
        assert [e.state for e in await cl.log()] == ["pending"]
        await cl.write(box, "a.txt", b"two")
        log = await cl.log()
    assert [(e.op, e.state) for e in log] == [("create", "applied"), ("modify", "applied")]
    assert log[1].before_hash == log[0].after_hash == h(b"one")


async def test_a_late_settle_does_not_undo_another_writers_progress(tmp_path: Path, workspace: Path, box: Any) -> None:
    data = tmp_path / "data"
    async with Changelog.open(data, workspace) as a, Changelog.open(data, workspace) as b:
        a._core._finish_later = lambda *args: None  # type: ignore[method-assign]
        await a.write(box, "a.txt", b"one")
        first = (await a.log())[0]
        await b.write(box, "a.txt", b"two")  # settles A's entry by hash, then records its own
        # A's deferred settle finally runs: the entry is no longer pending, nothing changes.
        await a._core.db(a._core._finish_tx, first.id, "applied", ("a.txt", first.after_hash), None)
        rows = await b._core.db(b._core.store.query, "SELECT sha256 FROM baseline WHERE path = 'a.txt'")
        log = await b.log()
    assert rows == [(h(b"two"),)]
    assert [(e.op, e.state) for e in log] == [("create", "applied"), ("modify", "applied")]


def test_limits_come_from_loom_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from worker.settings import Settings

    monkeypatch.setenv("LOOM_CHANGELOG_MAX_FILE_BYTES", "1000")
    monkeypatch.setenv("LOOM_CHANGELOG_MAX_TOTAL_BYTES", "50000")
    monkeypatch.setenv("LOOM_CHANGELOG_MAX_FILES", "77")
    monkeypatch.setenv("LOOM_CHANGELOG_IGNORED_DIRS", '["node_modules", "build"]')
    monkeypatch.setenv("LOOM_DURABILITY", "process")
    limits = Settings().changelog_limits()
    assert (limits.max_file_bytes, limits.max_total_bytes, limits.max_files) == (1000, 50000, 77)
    assert limits.ignored_dirs == ("node_modules", "build") and limits.durability == "process"
    monkeypatch.setenv("LOOM_CHANGELOG_MAX_FILE_BYTES", str(64 << 20))
    with pytest.raises(ValueError):
        Settings()  # beyond what the agent reads at once: refused, not silently capped


async def test_shell_limits_from_settings_are_enforced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workspace: Path, box: Any
) -> None:
    from worker.settings import Settings
    from worker.workspace import Workspace

    monkeypatch.setenv("LOOM_CHANGELOG_MAX_FILE_BYTES", "10")
    async with Changelog.open(tmp_path / "data", workspace, limits=Settings().changelog_limits()) as cl:
        ws = Workspace(workspace, box, cl)
        await ws.run_shell(ExecRequest("true"))
        _r, changed = await ws.run_shell(
            ExecRequest("head -c 100 /dev/zero > big.bin && echo hi > small.txt"), call_id="c"
        )
        assert changed == ["big.bin", "small.txt"]
        restorable = {e.path: e.restorable for e in await cl.log(call_id="c")}
        assert restorable == {"big.bin": True, "small.txt": True}  # created: undo removes them
        _r, changed = await ws.run_shell(ExecRequest("echo x >> big.bin && rm small.txt"), call_id="d")
        restorable = {e.path: e.restorable for e in await cl.log(call_id="d")}
        assert restorable == {"big.bin": False, "small.txt": True}  # no before-image over 10 bytes


def test_opening_waits_for_another_process_creating_the_database(tmp_path: Path) -> None:
    """Two processes opening a new changelog at once: while one holds its first write
    transaction, SQLite refuses the other's switch to WAL at once (no busy wait, a lock
    upgrade that could deadlock). The store retries instead of failing the call."""
    import sqlite3
    import threading
    import time

    from worker.changelog.store import Store

    path = tmp_path / "changelog.sqlite3"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE creating(x)")
    timer = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    timer.start()
    started = time.monotonic()
    try:
        store = Store(path)
        assert time.monotonic() - started >= 0.2  # it did wait for the other transaction
        assert store.query("PRAGMA journal_mode") == [("wal",)]
        store.close()
    finally:
        timer.join()
        other.close()


def test_opening_a_history_of_this_version_writes_nothing_and_an_older_one_is_brought_up(tmp_path: Path) -> None:
    """A history whose schema is this version's whole opens without a write transaction: it
    does not wait for another process's write (nor pay a commit's fsync, every CLI call).
    One that lacks an index, a column or the version is brought up to date as before."""
    import sqlite3
    import threading

    from worker.changelog.store import SCHEMA_VERSION, Store

    path = tmp_path / "changelog.sqlite3"
    Store(path, workspace=tmp_path / "ws").close()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process's write under way
    opened: list[Store] = []
    t = threading.Thread(target=lambda: opened.append(Store(path)), daemon=True)
    t.start()
    t.join(10)
    assert opened, "opening a current history waited for another process's write"
    opened[0].close()
    other.execute("ROLLBACK")

    other.execute("DROP INDEX entries_path")
    other.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    store = Store(path)
    assert store.meta("schema") == SCHEMA_VERSION
    assert store.query("SELECT name FROM sqlite_master WHERE name = 'entries_path'") == [("entries_path",)]
    store.close()
    other.close()


def test_a_new_history_made_from_the_template_is_the_one_the_statements_make(tmp_path: Path) -> None:
    """A new database is written from a template made in memory (one file, one fsync,
    instead of a WAL switch and a schema's statements on disk): its tables, indexes,
    columns, version and WAL mode are exactly those of one made statement by statement,
    it passes SQLite's check, and the changelog names its workspace in it."""
    import sqlite3

    from worker.changelog import store as store_mod
    from worker.changelog.store import SCHEMA_VERSION, Store

    made = tmp_path / "made"
    made.mkdir()
    by_statements = sqlite3.connect(made / "db", isolation_level=None)
    by_statements.execute("PRAGMA journal_mode=WAL")
    by_statements.execute("BEGIN")
    store_mod._make_schema(by_statements)
    by_statements.execute("COMMIT")

    def shape(db: sqlite3.Connection) -> Any:
        return (
            sorted(db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")),
            [db.execute(f"PRAGMA table_info({t})").fetchall() for t in ("meta", "blobs", "entries", "baseline")],
            db.execute("PRAGMA journal_mode").fetchall(),
            db.execute("PRAGMA page_size").fetchall(),
            db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchall(),
        )

    path = tmp_path / "changelog.sqlite3"
    store = Store(path)
    assert store.query("PRAGMA quick_check") == [("ok",)]
    assert shape(store._db.raw) == shape(by_statements)
    assert store.meta("schema") == SCHEMA_VERSION
    store.close()
    by_statements.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changelog.sqlite3", "changelog.sqlite3.created", "made"]

    ws = tmp_path / "ws"
    ws.mkdir()
    core = Changelog.open(tmp_path / "data", ws)._core
    try:
        assert core.store.meta("workspace") == str(ws.resolve())
    finally:
        core.store.close()


def test_a_new_history_never_replaces_a_file_another_process_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template is linked into place, never renamed over it: a database another process
    made meanwhile (the link finds its file) is the one opened, and nothing is left aside."""
    import os
    import sqlite3

    from worker.changelog.store import Store

    path = tmp_path / "changelog.sqlite3"
    link = os.link

    def theirs_first(src: Any, dst: Any) -> None:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("CREATE TABLE theirs(x)")
        other.execute("INSERT INTO theirs VALUES (1)")
        other.close()
        link(src, dst)

    monkeypatch.setattr(os, "link", theirs_first)
    store = Store(path)
    assert store.query("SELECT x FROM theirs") == [(1,)]
    assert store.query("PRAGMA quick_check") == [("ok",)]
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changelog.sqlite3", "changelog.sqlite3.created"]
