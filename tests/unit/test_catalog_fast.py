"""FAST search internals: match reasons from stored FTS terms, the on-loop and threaded
paths, the allowed-ids table, and upgrading a database written before ``stems``."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_catalog import fixture_doc, load_fixture

from worker.catalog.capabilities import make_descriptor
from worker.catalog.index import SCHEMA_VERSION
from worker.catalog.search import Catalog


@pytest.fixture
async def catalog(tmp_path: Path) -> Any:
    c = Catalog.open(tmp_path / "tools.db")
    await load_fixture(c)
    yield c
    await c.aclose()


def summary(resp: Any) -> list[tuple[str, float, str]]:
    return [(h.tool.id, h.confidence, h.match_reason) for h in resp.results]


async def test_match_reason_follows_stemming(catalog: Catalog) -> None:
    top = (await catalog.search("sending notifications to slack")).results[0]
    assert top.tool.id == "mcp:slack:slack_send"
    assert top.match_reason == "name: sending, slack; capabilities: notifications"
    # Each query word is checked on its own: two forms of one stem both match.
    hit = (await catalog.search("convert converting")).results[0]
    assert hit.match_reason == "description: convert, converting" and hit.confidence == 0.75
    miss = (await catalog.search("uploaded files")).results
    assert miss[0].tool.id == "mcp:slack:slack_upload_file" and miss[0].match_reason == "name: uploaded, files"
    assert "unmatched: uploaded" in next(h.match_reason for h in miss if h.tool.id == "builtin:search_files")


async def test_candidates_are_counted_but_only_results_returned(catalog: Catalog) -> None:
    resp = await catalog.search("file", max_results=2)
    assert len(resp.results) == 2 and resp.metadata.candidates_retrieved > 2
    assert all(h.tool.input_schema.get("type") == "object" for h in resp.results)


async def test_loop_and_thread_paths_agree(catalog: Catalog) -> None:
    queries = [q["query"] for q in fixture_doc()["queries"]]
    filters: list[dict[str, Any]] = [
        {},
        {"capabilities": ["notification"]},
        {"sources": ["mcp"]},
        {"allowed_ids": {"builtin:read_file", "mcp:slack:slack_send", "custom:csv_to_json"}},
    ]
    for kw in filters:
        catalog.inline_max_tools = 2000
        inline = [summary(await catalog.search(q, max_results=10, **kw)) for q in queries]
        catalog.inline_max_tools = 0
        threaded = [summary(await catalog.search(q, max_results=10, **kw)) for q in queries]
        assert inline == threaded
        assert any(inline)


async def test_a_held_index_is_waited_for_on_a_thread_not_on_the_loop(catalog: Catalog) -> None:
    await catalog.total()
    with catalog.index._lock:  # what a writer on another thread does
        task = asyncio.create_task(catalog.search("send notification to Slack"))
        for _ in range(5):
            await asyncio.sleep(0)  # the loop keeps running: the search is not blocking it
        assert not task.done()
    resp = await task
    assert resp.results[0].tool.id == "mcp:slack:slack_send"


class BusyOnce:
    """A connection stand-in that reports SQLITE_BUSY to the first query made with no
    busy timeout (the on-loop attempt), and records the busy timeouts set."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.timeouts: list[str] = []
        self.busy_sent = False

    def execute(self, sql: str, params: Any = ()) -> Any:
        if sql.startswith("PRAGMA busy_timeout="):
            self.timeouts.append(sql.split("=")[1])
        elif "MATCH" in sql and self.timeouts and self.timeouts[-1] == "0" and not self.busy_sent:
            self.busy_sent = True
            e = sqlite3.OperationalError("database is locked")
            e.sqlite_errorcode = sqlite3.SQLITE_BUSY
            raise e
        return self.db.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_a_busy_database_sends_the_search_to_a_thread(catalog: Catalog) -> None:
    await catalog.total()
    fake = BusyOnce(catalog.index._db)
    catalog.index._db = fake  # type: ignore[assignment]
    try:
        resp = await catalog.search("send notification to Slack")
    finally:
        catalog.index._db = fake.db
    assert fake.busy_sent and resp.results[0].tool.id == "mcp:slack:slack_send"
    assert fake.timeouts == ["0", "5000"]  # restored after the attempt; the thread waits as usual


async def test_allowed_ids_follow_every_call(catalog: Catalog) -> None:
    a = {"mcp:slack:slack_send"}
    b = {"mcp:slack:slack_list_channels", "mcp:slack:slack_upload_file"}

    async def ids(allowed: set[str] | None) -> set[str]:
        return {h.tool.id for h in (await catalog.search("slack", allowed_ids=allowed, max_results=10)).results}

    assert await ids(a) == a
    assert await ids(b) == b
    assert await ids(a) == a
    assert await ids(None) >= a | b
    assert await ids(set()) == set()
    b.add("mcp:slack:slack_send")  # the same set object, changed in place
    assert await ids(b) == b
    # A tool indexed later is not allowed until the caller says so.
    new = make_descriptor(source="custom", name="slack_archive", description="Archive a Slack channel")
    await catalog.index_tools("custom", [new])
    assert await ids(a) == a
    assert "custom:slack_archive" in await ids(a | {"custom:slack_archive"})


OLD_SCHEMA = """
CREATE TABLE tools (
    rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, name TEXT NOT NULL, description TEXT NOT NULL,
    source TEXT NOT NULL, mcp_server TEXT NOT NULL DEFAULT '', input_schema TEXT, output_schema TEXT,
    capabilities TEXT NOT NULL, keywords TEXT NOT NULL, examples TEXT NOT NULL, indexed_at TEXT NOT NULL,
    version TEXT, requires_approval INTEGER NOT NULL DEFAULT 0, content_hash TEXT NOT NULL
);
CREATE VIRTUAL TABLE tools_fts USING fts5(
    name, description, capabilities, keywords, content='tools', content_rowid='rowid', tokenize='porter unicode61'
);
CREATE TRIGGER tools_ai AFTER INSERT ON tools BEGIN
    INSERT INTO tools_fts(rowid, name, description, capabilities, keywords)
    VALUES (new.rowid, new.name, new.description, new.capabilities, new.keywords);
END;
CREATE TRIGGER tools_ad AFTER DELETE ON tools BEGIN
    INSERT INTO tools_fts(tools_fts, rowid, name, description, capabilities, keywords)
    VALUES ('delete', old.rowid, old.name, old.description, old.capabilities, old.keywords);
END;
CREATE TRIGGER tools_au AFTER UPDATE ON tools BEGIN
    INSERT INTO tools_fts(tools_fts, rowid, name, description, capabilities, keywords)
    VALUES ('delete', old.rowid, old.name, old.description, old.capabilities, old.keywords);
    INSERT INTO tools_fts(rowid, name, description, capabilities, keywords)
    VALUES (new.rowid, new.name, new.description, new.capabilities, new.keywords);
END;
"""


async def test_a_database_from_before_stems_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    for name, desc in [("slack_send", "Send messages to Slack channels"), ("email_send", "Send an email message")]:
        d = make_descriptor(source="custom", name=name, description=desc)
        db.execute(
            "INSERT INTO tools (id, name, description, source, input_schema, capabilities, keywords, examples,"
            " indexed_at, content_hash) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (d.id, d.name, d.description, d.source, json.dumps(d.input_schema), json.dumps(d.capabilities),
             json.dumps(d.keywords), "[]", "2024-01-01T00:00:00Z", "old"),
        )  # fmt: skip
    db.commit()
    db.close()

    c = Catalog.open(path)
    try:
        top = (await c.search("send notification to slack")).results[0]
        assert top.tool.id == "custom:slack_send"
        assert top.match_reason == "name: send, slack; capabilities: notification"
        assert c.index.integrity_check()
    finally:
        await c.aclose()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT count(*) FROM tools WHERE stems = ''").fetchone()[0] == 0
    db.close()


async def test_allowed_rows_follow_writes_by_another_connection(tmp_path: Path) -> None:
    c = Catalog.open(tmp_path / "t.db")
    zep = make_descriptor(source="custom", name="zeppelin_polish", description="Polish the zeppelin hull")
    other = make_descriptor(source="custom", name="other", description="Unrelated zeppelin helper")
    await c.index_tools("custom", [zep, other])
    allowed = {zep.id}

    async def found() -> list[str]:
        return [h.tool.id for h in (await c.search("zeppelin", allowed_ids=allowed, max_results=10)).results]

    assert await found() == [zep.id]
    # Another process rewrites the allowed tool under a new rowid and gives its old rowid
    # to a tool the caller may not run.
    db = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    cols = (
        "id, name, description, source, mcp_server, input_schema, output_schema, capabilities, keywords, examples,"
        " indexed_at, version, requires_approval, content_hash, stems"
    )
    old_rowid = db.execute("SELECT rowid FROM tools WHERE id=?", (zep.id,)).fetchone()[0]
    db.execute("BEGIN")
    db.execute(f"CREATE TEMP TABLE keep AS SELECT {cols} FROM tools WHERE id=?", (zep.id,))
    db.execute("DELETE FROM tools WHERE id=?", (zep.id,))
    db.execute(
        f"INSERT INTO tools (rowid, {cols}) SELECT ?, 'custom:intruder', 'intruder', description, source,"
        " mcp_server, input_schema, output_schema, capabilities, keywords, examples, indexed_at, version,"
        " requires_approval, content_hash, stems FROM keep",
        (old_rowid,),
    )
    db.execute(f"INSERT INTO tools ({cols}) SELECT {cols} FROM keep")
    db.execute("COMMIT")
    db.close()
    assert await found() == [zep.id]
    await c.aclose()
