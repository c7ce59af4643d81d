"""Catalog index and FAST search: quality on a 50-tool fixture, confidence, re-indexing,
pruning, capability tagging, hostile queries, concurrency."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.catalog.capabilities import extract_capabilities, extract_keywords, make_descriptor
from worker.catalog.index import ToolDescriptor
from worker.catalog.search import Catalog, InvalidQueryError, SearchMode, fts_query, query_terms

FIXTURE = Path(__file__).parent.parent / "fixtures" / "catalog_tools.yaml"


def fixture_doc() -> dict[str, Any]:
    return yaml.safe_load(FIXTURE.read_text())


def descriptor(t: dict[str, Any]) -> ToolDescriptor:
    props = {k: {"type": "string", "description": v} for k, v in (t.get("parameters") or {}).items()}
    return make_descriptor(
        source=t["source"],
        name=t["name"],
        description=t["description"],
        mcp_server=t.get("mcp_server", ""),
        input_schema={"type": "object", "properties": props, "required": list(props)[:1]},
    )


async def load_fixture(catalog: Catalog) -> int:
    groups: dict[tuple[str, str], list[ToolDescriptor]] = {}
    for t in fixture_doc()["tools"]:
        d = descriptor(t)
        groups.setdefault((d.source, d.mcp_server), []).append(d)
    for (source, server), tools in groups.items():
        await catalog.index_tools(source, tools, mcp_server=server)  # type: ignore[arg-type]
    return sum(len(v) for v in groups.values())


@pytest.fixture
async def catalog(tmp_path: Path) -> Any:
    c = Catalog.open(tmp_path / "tools.db")
    await load_fixture(c)
    yield c
    await c.aclose()


def test_fixture_is_large_and_varied() -> None:
    doc = fixture_doc()
    assert len(doc["tools"]) >= 40
    assert {t["source"] for t in doc["tools"]} == {"builtin", "custom", "mcp"}
    assert len(doc["queries"]) >= 20


async def test_expected_top_results(catalog: Catalog) -> None:
    misses = []
    for q in fixture_doc()["queries"]:
        resp = await catalog.search(q["query"], max_results=5)
        ids = [h.tool.id for h in resp.results]
        if q["top"] not in ids[: q.get("within", 1)]:
            misses.append((q["query"], q["top"], ids[:3]))
    assert misses == []


async def test_slack_example_output_shape(catalog: Catalog) -> None:
    resp = await catalog.search("send notification to Slack")
    top = resp.results[0]
    assert top.tool.id == "mcp:slack:slack_send" and top.tool.mcp_server == "slack"
    assert top.match_reason == "name: send, slack; capabilities: notification"
    assert top.signals[0]["signal_type"] == "bm25_score" and top.signals[0]["weight"] > 0
    m = resp.metadata
    assert m.mode_used is SearchMode.FAST and m.total_indexed == 50 and m.candidates_retrieved >= 3
    assert m.terms == ["send", "notification", "slack"] and m.fallback_reason is None
    assert "input_schema" not in top.to_dict()["tool"] and "input_schema" in top.to_dict(True)["tool"]


async def test_confidence_monotonic_and_absolute(catalog: Catalog) -> None:
    for q in fixture_doc()["queries"]:
        confs = [h.confidence for h in (await catalog.search(q["query"], max_results=10)).results]
        assert confs == sorted(confs, reverse=True), q["query"]
        assert all(0 < c <= 1 for c in confs)
    # Comparable across queries: an exact name is 1.0 whatever the query, a one-word
    # description-only match is far lower.
    assert (await catalog.search("read_file")).results[0].confidence == 1.0
    assert (await catalog.search("git_diff")).results[0].confidence == 1.0
    weak = (await catalog.search("city")).results[0]
    assert weak.tool.name == "get_weather_forecast" and weak.confidence < 0.8


@pytest.mark.parametrize(
    "query",
    [
        '"',
        "*",
        "NEAR(",
        "NEAR(a b",
        "OR",
        "AND OR NOT",
        '"unbalanced',
        "a*b",
        "col:foo",
        "^x",
        "-x +y",
        "(((",
        "'; DROP TABLE tools; --",
        "slack\x00send",
        "{}[]",
        "名前 ファイル",
    ],
)
async def test_hostile_queries_never_reach_fts_syntax(catalog: Catalog, query: str) -> None:
    resp = await catalog.search(query)  # must not raise sqlite3.OperationalError
    assert isinstance(resp.results, list)
    assert catalog.index.integrity_check() and await catalog.total() == 50


async def test_hostile_words_still_search() -> None:
    assert query_terms('"slack" NEAR( send*') == ["slack", "near", "send"]
    assert fts_query(["a", 'b"c']) == '"a" OR "b""c"'
    c = Catalog.open(":memory:")
    await load_fixture(c)
    assert (await c.search('"slack* OR')).results[0].tool.name.startswith("slack")


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
async def test_empty_query_is_invalid_query(catalog: Catalog, query: str) -> None:
    with pytest.raises(InvalidQueryError) as e:
        await catalog.search(query)
    assert e.value.code == "INVALID_QUERY"


async def test_reindex_changed_description_leaves_no_stale_tokens(tmp_path: Path) -> None:
    c = Catalog.open(tmp_path / "t.db")
    old = make_descriptor(source="custom", name="frobnicate", description="Polish the zeppelin hull")
    other = make_descriptor(source="custom", name="other", description="Unrelated helper")
    await c.index_tools("custom", [old, other])
    assert [h.tool.name for h in (await c.search("zeppelin")).results] == ["frobnicate"]
    new = make_descriptor(source="custom", name="frobnicate", description="Wash the submarine deck")
    stats = await c.index_tools("custom", [new, other])
    assert stats.written == 1 and stats.pruned == 0  # the unchanged tool is not rewritten
    assert c.index.integrity_check()
    assert (await c.search("zeppelin")).results == []
    assert [h.tool.name for h in (await c.search("submarine")).results] == ["frobnicate"]
    # The FTS vocabulary holds no trace of the old words.
    db = sqlite3.connect(tmp_path / "t.db")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(tools_fts, 'row')")
    terms = {r[0] for r in db.execute("SELECT term FROM v")}
    assert "zeppelin" not in terms and "hull" not in terms and "submarin" in terms
    db.close()
    await c.aclose()


async def test_integrity_check_detects_a_stale_index(tmp_path: Path) -> None:
    c = Catalog.open(tmp_path / "t.db")
    await c.index_tools("custom", [make_descriptor(source="custom", name="a", description="alpha tool")])
    # What INSERT OR REPLACE does: the row changes without the FTS index hearing about it.
    with c.index._lock:
        c.index._db.execute("DROP TRIGGER tools_au")
        c.index._db.execute("UPDATE tools SET description='beta tool'")
    assert not c.index.integrity_check()
    await c.aclose()


async def test_tools_gone_from_a_source_are_pruned(catalog: Catalog) -> None:
    before = await catalog.total()
    keep = [descriptor(t) for t in fixture_doc()["tools"] if t.get("mcp_server") == "git"][:2]
    stats = await catalog.index_tools("mcp", keep, mcp_server="git")
    assert stats.pruned == 2 and stats.total == 2
    assert await catalog.total() == before - 2
    assert await catalog.get_tool("mcp:git:git_log") is None
    assert (await catalog.get_tool("mcp:git:git_status")) is not None
    assert all(h.tool.name != "git_log" for h in (await catalog.search("commit history")).results)
    # Other sources are untouched by a source's re-index.
    assert await catalog.get_tool("builtin:read_file") is not None
    src = {s.name: s for s in await catalog.list_sources()}
    assert src["mcp:git"].tool_count == 2 and src["mcp:git"].available and src["builtin"].tool_count == 8
    assert catalog.index.integrity_check()


async def test_source_mismatch_is_refused(catalog: Catalog) -> None:
    d = make_descriptor(source="custom", name="x", description="y")
    with pytest.raises(ValueError):
        await catalog.index_tools("builtin", [d])


def test_capabilities_whole_words() -> None:
    assert "file_io" not in extract_capabilities("thread_dump", "Capture thread stacks")
    assert "file_io" in extract_capabilities("read_file", "Read a file")
    assert "file_io" in extract_capabilities("readFile", "")  # camelCase split
    assert "git" not in extract_capabilities("digitize", "Turn legitimate images into digits")
    assert "aws" not in extract_capabilities("laws_lookup", "Find laws")
    assert extract_capabilities("web_search", "Search the web with a search engine") == [
        "search",
        "web_search",
    ]
    assert extract_capabilities("x", "y", extra=["visualization", "bogus"]) == ["visualization"]
    assert extract_capabilities("kubectl_get_pods", "List Kubernetes pods") == ["kubernetes"]


def test_keywords() -> None:
    kws = extract_keywords("slack_send", "Send the messages to a Slack channel of the team", ["channel_id"])
    assert kws == ["slack", "send", "messages", "channel", "team", "id"]
    long = extract_keywords("x_tool", " ".join(f"word{i}" for i in range(50)))
    assert len(long) == 20 and "the" not in long


def test_requires_approval_and_ids() -> None:
    assert make_descriptor(source="builtin", name="shell_execute", description="Run a command").requires_approval
    assert make_descriptor(source="builtin", name="write_file", description="Write a file").requires_approval
    r = make_descriptor(source="builtin", name="read_file", description="Read a file")
    assert not r.requires_approval and r.id == "builtin:read_file"
    assert make_descriptor(source="mcp", mcp_server="s", name="t", description="d").id == "mcp:s:t"


async def test_capability_filter_matches_whole_tags(catalog: Catalog) -> None:
    resp = await catalog.search("send", capabilities=["notification"], max_results=10)
    assert resp.results and all("notification" in h.tool.capabilities for h in resp.results)
    # "web_search" is one tag: filtering on "search" must not match it by substring and
    # "web" is no tag at all.
    assert (await catalog.search("web", capabilities=["web"])).results == []
    git = await catalog.tools_by_capability("git")
    assert {t.mcp_server for t in git} >= {"git"} and all("git" in t.capabilities for t in git)
    only_custom = await catalog.tools_by_capability("transform", sources=["custom"])
    assert only_custom and all(t.source == "custom" for t in only_custom)
    assert await catalog.tools_by_capability("git", sources=["mcp:github"], max_results=1)


async def test_source_and_allowed_filters(catalog: Catalog) -> None:
    r = await catalog.search("file", sources=["builtin"], max_results=10)
    assert r.results and all(h.tool.source == "builtin" for h in r.results)
    r = await catalog.search("send notification to Slack", allowed_ids={"mcp:email:email_send"})
    assert [h.tool.id for h in r.results] == ["mcp:email:email_send"]
    assert (await catalog.search("slack", allowed_ids=set())).results == []


async def test_ten_concurrent_searches(catalog: Catalog) -> None:
    queries = [q["query"] for q in fixture_doc()["queries"][:10]]
    results = await asyncio.gather(*(catalog.search(q) for q in queries))
    assert all(r.results for r in results)
    expected = [q["top"] for q in fixture_doc()["queries"][:10]]
    assert [r.results[0].tool.id for r in results] == expected


async def test_index_builtin_from_openai_schemas(tmp_path: Path) -> None:
    c = Catalog.open(tmp_path / "t.db")
    schemas = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "shell_execute", "description": "Run a shell command"}},
    ]
    stats = await c.index_builtin(schemas)
    assert stats.total == 2 and stats.written == 2
    again = await c.index_builtin(schemas)
    assert again.written == 0  # unchanged content is not rewritten
    t = await c.get_tool("builtin:read_file")
    assert t is not None and t.input_schema["properties"]["path"]["type"] == "string"
    assert (await c.search("run command")).results[0].tool.name == "shell_execute"
    await c.aclose()
