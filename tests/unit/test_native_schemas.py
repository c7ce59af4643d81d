"""The native tools' definitions on each surface, no Docker: the MCP server lists bash and
str_replace_based_edit_tool under exactly those names with Anthropic's input schemas (the
adapters' own fields hidden), and the CLI prints the vendors' tool definitions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from worker.mcp_server import _mcp_tools, build_server
from worker.metrics import Metrics
from worker.registry import ToolRegistry
from worker.service import CallRunner

ROOT = Path(__file__).resolve().parents[2]


def test_mcp_lists_anthropic_s_two_tools_with_their_input_schemas() -> None:
    registry = ToolRegistry()
    build_server(registry, CallRunner(registry, Metrics(), max_concurrent=1), lambda _ctx: None)
    tools: dict[str, Any] = {t.name: t.input_schema for t in _mcp_tools(registry)}
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
