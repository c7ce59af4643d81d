"""The native tools' definitions on each surface, no Docker: the MCP server lists bash and
str_replace_based_edit_tool under exactly those names with Anthropic's input schemas (the
adapters' own fields hidden), and the CLI prints the vendors' tool definitions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from worker.mcp_server import ToolList
from worker.metrics import Metrics
from worker.native import install
from worker.registry import ToolRegistry
from worker.service import CallRunner

ROOT = Path(__file__).resolve().parents[2]


def test_mcp_lists_anthropic_s_two_tools_only_when_asked() -> None:
    registry = ToolRegistry()
    default = {t.name for t in ToolList(registry).tools()}
    assert not default & {"bash", "str_replace_based_edit_tool", "shell", "apply_patch"}
    tools: dict[str, Any] = {t.name: t.input_schema for t in ToolList(registry, native_tools=True).tools()}
    assert {"bash", "str_replace_based_edit_tool"} <= set(tools)
    assert "shell" not in tools and "apply_patch" not in tools
    bash = tools["bash"]
    assert set(bash["properties"]) == {"command", "restart"} and bash["properties"]["restart"]["type"] == "boolean"
    edit = tools["str_replace_based_edit_tool"]
    assert edit["required"] == ["command", "path"]
    assert edit["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert"]
    assert set(edit["properties"]) == {
        "command",
        "path",
        "file_text",
        "view_range",
        "old_str",
        "new_str",
        "insert_line",
        "insert_text",
    }


def test_native_tools_run_through_the_registry_but_never_join_its_listings() -> None:
    registry = ToolRegistry()
    before = {fmt: registry.all_schemas(fmt) for fmt in ("openai", "anthropic", "mcp")}
    install(registry)  # what the first registry.anthropic()/openai() call does
    assert {"bash", "str_replace_based_edit_tool", "shell", "apply_patch"} <= set(registry.names())
    assert {fmt: registry.all_schemas(fmt) for fmt in before} == before
    listed = {s["name"] for s in registry.all_schemas("mcp", native=True)}
    assert {"bash", "str_replace_based_edit_tool", "shell", "apply_patch"} <= listed
    # (CallRunner and Metrics: the runner counts them as known tools, not "unknown")
    assert "bash" in CallRunner(registry, Metrics(), max_concurrent=1).known_tools


def test_the_cli_prints_each_vendor_s_tool_definitions() -> None:
    def run(fmt: str) -> Any:
        p = subprocess.run(
            [sys.executable, "-m", "worker.cli", "tools", "--format", fmt], cwd=ROOT, capture_output=True, text=True
        )
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    assert run("anthropic-native") == [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
    assert run("openai-native") == [{"type": "shell"}, {"type": "apply_patch"}]
