"""Protocol tests: BALANCED and ACCURATE search against a local OpenAI-compatible chat
server started by the test on 127.0.0.1 (no real model), including its failures and
timeouts, which must fall back to FAST and say so in the metadata."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.catalog.capabilities import make_descriptor
from worker.catalog.index import ToolDescriptor
from worker.catalog.llm import LLMError, LLMTimeoutError, OpenAICompatProvider
from worker.catalog.search import Catalog, SearchMode
from worker.catalog.tool_search import ToolSearchArgs, tool_search

FIXTURE = Path(__file__).parent.parent / "fixtures" / "catalog_tools.yaml"


async def load_fixture(catalog: Catalog) -> None:
    """The 50-tool fixture of test_catalog.py, indexed source by source."""
    groups: dict[tuple[str, str], list[ToolDescriptor]] = {}
    for t in yaml.safe_load(FIXTURE.read_text())["tools"]:
        props = {k: {"type": "string", "description": v} for k, v in (t.get("parameters") or {}).items()}
        d = make_descriptor(
            source=t["source"],
            name=t["name"],
            description=t["description"],
            mcp_server=t.get("mcp_server", ""),
            input_schema={"type": "object", "properties": props},
        )
        groups.setdefault((d.source, d.mcp_server), []).append(d)
    for (source, server), tools in groups.items():
        await catalog.index_tools(source, tools, mcp_server=server)  # type: ignore[arg-type]


class FakeChat:
    """State shared with the handler thread."""

    def __init__(self) -> None:
        self.behaviour = "ok"  # ok | http500 | garbage | slow | not_json
        self.favour = "email_send"
        self.expansion = ["pagerduty", "incident"]
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []


def _handler(state: FakeChat) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(body)
            state.headers.append(dict(self.headers))
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": "no"})
            if state.behaviour == "http500":
                return self._send(500, {"error": "boom"})
            if state.behaviour == "slow":
                time.sleep(1.5)
            if state.behaviour == "garbage":
                return self._send(200, {"unexpected": True})
            system = body["messages"][0]["content"]
            user = body["messages"][1]["content"]
            if state.behaviour == "not_json":
                content = "I think the best tool is probably the Slack one."
            elif "rank" in system:
                ids = re.findall(r"id=(\S+)", user)
                ranking = [{"id": i, "score": 1.0 if state.favour in i else 0.1} for i in ids]
                content = "```json\n" + json.dumps({"ranking": ranking}) + "\n```"
            else:
                content = json.dumps({"terms": state.expansion})
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}}]})

        def _send(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

    return H


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up is the point of the timeout test


@pytest.fixture
def chat_server() -> Iterator[tuple[str, FakeChat]]:
    state = FakeChat()
    srv = _QuietServer(("127.0.0.1", 0), _handler(state))
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1", state
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
async def llm_catalog(chat_server: tuple[str, FakeChat], tmp_path: Path) -> Any:
    url, state = chat_server
    c = Catalog.open(tmp_path / "t.db", OpenAICompatProvider(url, "test-model", api_key="k3y", timeout=0.5))
    await load_fixture(c)
    yield c, state
    await c.aclose()


async def test_protocol_balanced_reranks(llm_catalog: Any) -> None:
    c, state = llm_catalog
    fast = await c.search("send notification to Slack", mode="fast")
    assert fast.results[0].tool.name == "slack_send"
    resp = await c.search("send notification to Slack", mode="balanced", task_context="ops alert")
    assert resp.metadata.mode_used is SearchMode.BALANCED and resp.metadata.fallback_reason is None
    assert resp.results[0].tool.name == "email_send"  # the model's preference won
    assert [s["signal_type"] for s in resp.results[0].signals] == ["bm25_score", "llm_rerank"]
    confs = [h.confidence for h in resp.results]
    assert confs == sorted(confs, reverse=True)
    assert resp.metadata.llm_reranking_ms > 0
    req = state.requests[-1]
    assert req["model"] == "test-model" and req["temperature"] == 0
    assert "ops alert" in req["messages"][1]["content"]
    assert state.headers[-1]["Authorization"] == "Bearer k3y"


async def test_protocol_accurate_expands_query(llm_catalog: Any) -> None:
    c, state = llm_catalog
    state.favour = "pagerduty"
    assert (await c.search("wake somebody up", mode="fast")).results == []
    resp = await c.search("wake somebody up", mode="accurate")
    m = resp.metadata
    assert m.mode_used is SearchMode.ACCURATE and m.expanded_terms == ["pagerduty", "incident"]
    assert resp.results[0].tool.name == "pagerduty_trigger"
    assert "expanded: pagerduty" in resp.results[0].match_reason
    assert m.query_understanding_ms > 0 and m.candidates_retrieved >= 1


@pytest.mark.parametrize("behaviour", ["http500", "garbage", "not_json", "slow"])
async def test_protocol_failures_fall_back_to_fast(llm_catalog: Any, behaviour: str) -> None:
    c, state = llm_catalog
    state.behaviour = behaviour
    for mode in ("balanced", "accurate"):
        resp = await c.search("send notification to Slack", mode=mode)
        assert resp.metadata.mode_used is SearchMode.FAST
        assert resp.metadata.mode_requested.value == mode
        assert resp.metadata.fallback_reason
        if behaviour == "slow":
            assert "timed out" in resp.metadata.fallback_reason
        assert resp.results[0].tool.name == "slack_send"  # FAST ranking, unaffected


async def test_protocol_provider_errors_directly(chat_server: tuple[str, FakeChat]) -> None:
    url, state = chat_server
    p = OpenAICompatProvider(url, "m", timeout=0.3)
    state.behaviour = "slow"
    with pytest.raises(LLMTimeoutError):
        await p.complete([{"role": "user", "content": "hi"}])
    state.behaviour = "http500"
    with pytest.raises(LLMError, match="HTTP 500"):
        await p.complete([{"role": "user", "content": "hi"}])
    await p.aclose()
    dead = OpenAICompatProvider("http://127.0.0.1:9/v1", "m", timeout=0.3)  # nothing listens on port 9
    with pytest.raises(LLMError):
        await dead.complete([{"role": "user", "content": "hi"}])
    await dead.aclose()


async def test_no_provider_configured_says_so(tmp_path: Path) -> None:
    c = Catalog.open(tmp_path / "t.db")
    await load_fixture(c)
    resp = await c.search("send notification to Slack", mode="accurate")
    assert resp.metadata.mode_used is SearchMode.FAST
    assert "no LLM provider configured" in (resp.metadata.fallback_reason or "")
    out = await tool_search(c, ToolSearchArgs(query="slack", mode="balanced"), allowed_ids=None)
    assert out["search_mode"] == "FAST" and "no LLM provider" in out["note"]
    await c.aclose()
