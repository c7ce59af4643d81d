"""MCP over streamable HTTP on the service (``/v1/workspaces/{id}/mcp``), driven by the
official client against a real uvicorn server on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.servers import serve_app
from worker.http import create_app
from worker.registry import ToolRegistry
from worker.settings import Settings

try:  # tests/unit may or may not be a package
    from .mcp_session import play
except ImportError:
    from mcp_session import play  # type: ignore[no-redef]

TOKEN = "mcp-test-token"


@pytest.fixture
async def base_url(tmp_path: Path, local_backend: Any) -> AsyncIterator[str]:
    settings = Settings(workspace_root=tmp_path / "root", api_token=TOKEN)
    app = create_app(settings, ToolRegistry(backend=local_backend))
    async with serve_app(app) as url:
        yield url


async def test_streamable_http_session_per_workspace(base_url: str, tmp_path: Path) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers) as c:
        r = await c.post("/v1/workspaces", json={"name": "m1"})
        assert r.status_code == 201
        workspace = Path(r.json()["path"])
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(f"{base_url}/v1/workspaces/m1/mcp", http_client=http)) as client:
            await play(client, workspace)


async def test_mcp_endpoint_needs_the_token_and_a_workspace(base_url: str) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    async with httpx.AsyncClient(base_url=base_url) as c:
        r = await c.post("/v1/workspaces/m1/mcp", json=init)
        assert r.status_code == 401
        r = await c.post("/v1/workspaces/nope/mcp", json=init, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 404
        r = await c.post("/v1/workspaces/..%2F/mcp", json=init, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 404


async def test_a_write_as_large_as_the_tool_takes_goes_through(base_url: str) -> None:
    """The MCP SDK refuses bodies over 4 MiB by default; the service gives it its own
    limit (LOOM_MAX_BODY_BYTES), so a ``write_file`` of 8 MiB (the tool takes 10) arrives."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers) as c:
        r = await c.post("/v1/workspaces", json={"name": "big"})
        assert r.status_code == 201
        workspace = Path(r.json()["path"])
    content = "x" * (8 << 20)
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(f"{base_url}/v1/workspaces/big/mcp", http_client=http)) as client:
            result = await client.call_tool("write_file", {"path": "big.txt", "content": content})
    assert not result.is_error, result
    assert (workspace / "big.txt").stat().st_size == len(content)
