"""The ``run_code`` tool's contract with a model, without a kernel: its schema in every
format (from the argument model, as every tool's), its arguments checked strictly, its
deadline beyond the code's own timeout, and the tool catalog finding it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.catalog.search import Catalog
from worker.registry import ToolRegistry
from worker.tools.catalog_tools import CatalogTools
from worker.tools.code import DEADLINE_SLACK, MAX_TIMEOUT, TOOLS

TOOL = TOOLS[0]


def test_the_schema_in_every_format_comes_from_the_argument_model() -> None:
    params = TOOL.parameters()
    assert params["required"] == ["code"] and params["additionalProperties"] is False
    assert set(params["properties"]) == {"code", "language", "context_id", "timeout"}
    assert params["properties"]["timeout"] == {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": params["properties"]["timeout"]["description"],
    }
    reg = ToolRegistry()
    schemas = {
        fmt: next(s for s in reg.all_schemas(fmt) if "run_code" in str(s)[:200])
        for fmt in ("openai", "anthropic", "mcp")
    }
    assert schemas["openai"]["function"]["parameters"] == params
    assert schemas["anthropic"]["input_schema"] == params and schemas["anthropic"]["name"] == "run_code"
    assert schemas["mcp"]["inputSchema"] == params
    assert schemas["mcp"]["annotations"] == {"readOnlyHint": False, "destructiveHint": True, "openWorldHint": False}


async def test_arguments_are_checked_before_anything_runs(tmp_path: Path) -> None:
    reg = ToolRegistry()  # no backend: a call that got past validation would fail as infrastructure
    r = await reg.execute("run_code", {"code": "1", "timeout": "10"}, tmp_path)
    assert not r.success and "'timeout': wrong type (string '10')" in (r.error or "")
    r = await reg.execute("run_code", {"cod": "1"}, tmp_path)
    assert not r.success and "'code': missing required field" in (r.error or "")
    r = await reg.execute("run_code", {"code": "1", "language": "Python 3"}, tmp_path)
    assert not r.success and "'language'" in (r.error or "")
    r = await reg.execute("run_code", {"code": "1"})
    assert not r.success and "No workspace" in (r.error or "")


def test_the_deadline_waits_for_the_interrupt_and_a_restart() -> None:
    assert TOOL.deadline(TOOL.validate({"code": "1"})) == 60 + DEADLINE_SLACK
    assert TOOL.deadline(TOOL.validate({"code": "1", "timeout": 2})) == 2 + DEADLINE_SLACK
    assert TOOL.deadline(TOOL.validate({"code": "1", "timeout": 10_000})) == MAX_TIMEOUT + DEADLINE_SLACK


async def test_tool_search_finds_it(tmp_path: Path, workspace: Path, local_backend: Any) -> None:
    catalog = CatalogTools(lambda: Catalog.open(tmp_path / "tools.db"))
    async with ToolRegistry(backend=local_backend, catalog_tools=catalog) as reg:
        found = {}
        for query in ("run python code", "plot a chart", "jupyter kernel", "code interpreter"):
            r = await reg.execute("tool_search", {"query": query}, workspace)
            assert r.success, r.error
            found[query] = [hit["name"] for hit in json.loads(r.output)["results"]]
    assert all(names[:1] == ["run_code"] for names in found.values()), found
