"""The ``tool_search`` builtin: schema, output shape, and never returning tools the caller
cannot run."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.catalog.capabilities import make_descriptor
from worker.catalog.search import Catalog, InvalidQueryError
from worker.catalog.tool_search import ToolSearchArgs, openai_schema, simplify_parameters, tool_search

SLACK_SCHEMA = {
    "type": "object",
    "properties": {
        "channel": {"type": "string", "description": "Slack channel ID"},
        "message": {"type": "string", "description": "Message content"},
        "urgent": {"type": "boolean"},
    },
    "required": ["channel", "message"],
}


async def small_catalog() -> Catalog:
    c = Catalog.open(":memory:")
    await c.index_tools(
        "mcp",
        [
            make_descriptor(
                source="mcp",
                mcp_server="slack",
                name="slack_send",
                description="Send messages to Slack channels",
                input_schema=SLACK_SCHEMA,
            )
        ],
        mcp_server="slack",
    )
    await c.index_tools(
        "custom",
        [make_descriptor(source="custom", name="webhook_post", description="POST a notification to webhook endpoints")],
    )
    await c.index_builtin([{"type": "function", "function": {"name": "read_file", "description": "Read a file"}}])
    return c


def test_schema_matches_go_registry() -> None:
    s = openai_schema()
    assert s["type"] == "function" and s["function"]["name"] == "tool_search"
    p = s["function"]["parameters"]
    assert p["required"] == ["query"] and p["additionalProperties"] is False
    assert set(p["properties"]) == {"query", "mode", "capabilities", "max_results", "task_context"}
    assert p["properties"]["mode"]["enum"] == ["fast", "balanced", "accurate"]
    assert p["properties"]["max_results"]["maximum"] == 10 and p["properties"]["max_results"]["default"] == 5


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"query": "x", "max_results": 11},
        {"query": "x", "max_results": 0},
        {"query": "x", "mode": "slow"},
        {"query": "x", "extra": 1},
    ],
)
def test_args_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ToolSearchArgs.model_validate(bad)


async def test_output_shape() -> None:
    c = await small_catalog()
    out = await tool_search(c, ToolSearchArgs(query="send notification to Slack"), allowed_ids=None)
    assert set(out) == {
        "query",
        "results_count",
        "results",
        "search_mode",
        "search_time_ms",
        "total_tools_indexed",
    }
    assert out["query"] == "send notification to Slack" and out["search_mode"] == "FAST"
    assert out["total_tools_indexed"] == 3 and out["results_count"] == len(out["results"]) == 2
    top = out["results"][0]
    assert top == {
        "name": "slack_send",
        "id": "mcp:slack:slack_send",
        "description": "Send messages to Slack channels",
        "confidence": top["confidence"],
        "source": "MCP",
        "mcp_server": "slack",
        "match_reason": "name: send, slack; capabilities: notification",
        "capabilities": ["notification"],
        "parameters": {
            "channel": "Slack channel ID (string, required)",
            "message": "Message content (string, required)",
            "urgent": "(boolean)",
        },
    }
    assert top["confidence"].endswith("%") and 0 < int(top["confidence"][:-1]) <= 100
    assert out["results"][1]["source"] == "CUSTOM" and out["results"][1]["mcp_server"] is None
    await c.aclose()


async def test_never_returns_tools_the_caller_cannot_run() -> None:
    c = await small_catalog()
    out = await tool_search(
        c,
        ToolSearchArgs(query="send notification to Slack", max_results=10),
        allowed_ids={"custom:webhook_post", "builtin:read_file"},
    )
    assert [r["id"] for r in out["results"]] == ["custom:webhook_post"]
    out = await tool_search(c, ToolSearchArgs(query="slack"), allowed_ids=set())
    assert out["results"] == [] and out["results_count"] == 0
    await c.aclose()


async def test_capabilities_and_max_results() -> None:
    c = await small_catalog()
    out = await tool_search(c, ToolSearchArgs(query="send notification", capabilities=["http"]), allowed_ids=None)
    assert [r["name"] for r in out["results"]] == ["webhook_post"]
    out = await tool_search(c, ToolSearchArgs(query="send notification", max_results=1), allowed_ids=None)
    assert out["results_count"] == 1
    out = await tool_search(c, ToolSearchArgs(query="send", capabilities=["nonsense"]), allowed_ids=None)
    assert out["results"] == [] and "unknown capabilities ['nonsense']" in out["note"]
    with pytest.raises(InvalidQueryError):
        await tool_search(c, ToolSearchArgs(query="  "), allowed_ids=None)
    await c.aclose()


def test_simplify_parameters_edge_cases() -> None:
    assert simplify_parameters({}) == {}
    assert simplify_parameters({"properties": "nope"}) == {}
    s = {
        "properties": {
            "a": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "b": {"type": ["integer", "null"]},
            "c": {},
        }
    }
    assert simplify_parameters(s) == {"a": "(string|null)", "b": "(integer|null)", "c": "(any)"}
