"""A scripted MCP session shared by the stdio and streamable-HTTP tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types as types

SIX = {"read_file", "write_file", "edit_file", "shell_execute", "search_files", "list_directory"}


def text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def play(client: Any, workspace: Path) -> None:
    """List the tools, call each one, and see failures as tool errors."""
    listed = await client.list_tools()
    tools = {t.name: t for t in listed.tools}
    assert set(tools) >= SIX
    assert tools["read_file"].input_schema["properties"]["path"]["type"] == "string"
    assert "path" in tools["read_file"].input_schema["required"]
    assert tools["read_file"].annotations is not None and tools["read_file"].annotations.read_only_hint is True

    r = await client.call_tool("write_file", {"path": "src/app.py", "content": "print('hi')\n"})
    assert r.is_error is False, text(r)
    assert (workspace / "src/app.py").read_text() == "print('hi')\n"
    assert r.structured_content is not None and r.structured_content["files_changed"] == ["src/app.py"]

    r = await client.call_tool("read_file", {"path": "src/app.py"})
    assert r.is_error is False and "print('hi')" in text(r)

    r = await client.call_tool("edit_file", {"path": "src/app.py", "old_str": "hi", "new_str": "hello"})
    assert r.is_error is False, text(r)
    assert (workspace / "src/app.py").read_text() == "print('hello')\n"

    r = await client.call_tool("list_directory", {"path": "."})
    assert r.is_error is False and "src/" in text(r)

    r = await client.call_tool("search_files", {"pattern": "hel+o"})
    assert r.is_error is False and "src/app.py:1:" in text(r)

    r = await client.call_tool("shell_execute", {"command": "python3 src/app.py"})
    assert r.is_error is False and "hello" in text(r)

    # Failures are tool errors the model can read, not protocol errors.
    r = await client.call_tool("read_file", {"path": "missing.txt"})
    assert r.is_error is True and "not found" in text(r).lower()
    r = await client.call_tool("read_file", {"paht": "x"})
    assert r.is_error is True and "'path'" in text(r)
    # Strict types (issue 24): a boolean or a numeric string for a number is refused by name.
    r = await client.call_tool("read_file", {"path": "src/app.py", "max_bytes": True})
    assert r.is_error is True and "'max_bytes': wrong type (boolean true)" in text(r)
    r = await client.call_tool("shell_execute", {"command": "true", "timeout": "10"})
    assert r.is_error is True and "'timeout': wrong type (string '10')" in text(r)
    r = await client.call_tool("read_file", {"path": "../outside"})
    assert r.is_error is True and "Safety violation" in text(r)
    r = await client.call_tool("shell_execute", {"command": "exit 4"})
    assert r.is_error is True and "4" in text(r)
    r = await client.call_tool("no_such_tool", {})
    assert r.is_error is True and "Unknown tool" in text(r)
