"""MCP servers as a tool source, against a real MCP server (the SDK's MCPServer) served over
streamable HTTP on 127.0.0.1 by the test: tools indexed, one called end to end."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from worker.catalog.mcp_source import (
    MCPServerConfig,
    MCPSource,
    MCPUnavailableError,
    index_mcp_sources,
    load_mcp_config,
)
from worker.catalog.search import Catalog


def make_server() -> MCPServer:
    srv = MCPServer("notes")

    @srv.tool(description="Send a notification message to a Slack channel")
    def slack_notify(channel: str, message: str) -> str:
        return f"sent to {channel}: {message}"

    @srv.tool(description="Add two integers")
    def add(a: int, b: int) -> int:
        return a + b

    @srv.tool(description="Always fails")
    def broken() -> str:
        raise ToolError("kaput")

    return srv


@pytest.fixture
async def mcp_url() -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = make_server().streamable_http_app(host="127.0.0.1")
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(1000):  # uvicorn offers no started event
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def test_mcp_tools_indexed_and_called(mcp_url: str, tmp_path: Path) -> None:
    src = MCPSource(MCPServerConfig(name="notes", url=mcp_url, timeout=10))
    c = Catalog.open(tmp_path / "t.db")
    report = await index_mcp_sources(c, [src])
    stats = report["notes"]
    assert not isinstance(stats, str) and stats.total == 3
    top = (await c.search("send notification to Slack")).results[0].tool
    assert top.id == "mcp:notes:slack_notify" and top.mcp_server == "notes"
    assert set(top.input_schema["properties"]) == {"channel", "message"}
    (info,) = await c.list_sources()
    assert info.name == "mcp:notes" and info.available and info.tool_count == 3

    r = await src.call_tool("slack_notify", {"channel": "#ops", "message": "$(id); done"})
    assert r.success and r.text == "sent to #ops: $(id); done"
    r = await src.call_tool("add", {"a": 2, "b": 40})
    assert r.success and r.text == "42"
    r = await src.call_tool("broken", {})
    assert not r.success and "kaput" in r.text
    await c.aclose()


async def test_unreachable_server_is_marked_unavailable(tmp_path: Path) -> None:
    c = Catalog.open(tmp_path / "t.db")
    dead = MCPSource(MCPServerConfig(name="dead", url="http://127.0.0.1:9/mcp", timeout=2))
    report = await index_mcp_sources(c, [dead])
    assert isinstance(report["dead"], str)
    (info,) = await c.list_sources()
    assert info.name == "mcp:dead" and not info.available and info.status_message
    await c.aclose()


async def test_stdio_server_never_runs_on_the_host() -> None:
    src = MCPSource(MCPServerConfig(name="git", command=["mcp-server-git"]))
    with pytest.raises(MCPUnavailableError, match="inside the workspace sandbox"):
        await src.list_tools()


def test_config_loading(tmp_path: Path) -> None:
    assert load_mcp_config(tmp_path / "none.yaml") == ([], {})
    f = tmp_path / "mcp.yaml"
    f.write_text(
        "servers:\n  docs: {url: 'http://127.0.0.1:1/mcp'}\n  git: {command: [mcp-server-git]}\n"
        "  both: {url: 'http://x/mcp', command: [x]}\n  bad: {url: 'file:///etc/passwd'}\n"
        "  extra: {url: 'http://x', shell: 1}\n"
    )
    servers, errors = load_mcp_config(f)
    assert [s.name for s in servers] == ["docs", "git"]
    assert set(errors) == {"both", "bad", "extra"}
    f.write_text('{"servers": {"j": {"url": "https://example.test/mcp"}}}')
    assert [s.name for s in load_mcp_config(f)[0]] == ["j"]
    f.write_text("servers: [1, 2]")
    with pytest.raises(ValueError):
        load_mcp_config(f)
