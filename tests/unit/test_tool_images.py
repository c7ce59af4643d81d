"""A tool's images on every surface, end to end without Docker (a stand-in tool that
returns a chart, registered beside the built-ins on the local backend): MCP's official
client over streamable HTTP gets an ``ImageContent`` block, Anthropic's ``tool_result``
an image block, HTTP ``/execute`` the ``images`` list, an OpenAI tool message the text
naming it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel, ConfigDict

from tests.servers import serve_app
from worker.http import create_app
from worker.http.execute import ToolResultOut
from worker.native import run_anthropic
from worker.registry import ToolRegistry
from worker.result import ToolImage, ToolResult
from worker.settings import Settings
from worker.tool import Tool, ToolContext

try:  # tests/unit may or may not be a package
    from .test_code_results import CHART
except ImportError:
    from test_code_results import CHART  # type: ignore[no-redef]

TOKEN = "images-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEXT = "<Figure size 640x480 with 1 Axes>\n[image 1: image/png 640x480]"


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


async def chart(args: NoArgs, ctx: ToolContext) -> ToolResult:
    return ToolResult.ok(TEXT, {"results": []}, images=[ToolImage("image/png", CHART, 640, 480)])


def registry(backend: Any) -> ToolRegistry:
    reg = ToolRegistry(backend=backend)
    reg.register(Tool("chart", "Draws a chart.", NoArgs, chart, needs_workspace=False))
    return reg


@pytest.fixture
async def base_url(tmp_path: Path, local_backend: Any) -> AsyncIterator[str]:
    settings = Settings(workspace_root=tmp_path / "root", api_token=TOKEN)
    async with serve_app(create_app(settings, registry(local_backend))) as url:
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as c:
            assert (await c.post("/v1/workspaces", json={"name": "img"})).status_code == 201
        yield url


async def test_mcp_client_gets_an_image_content_block(base_url: str) -> None:
    async with httpx2.AsyncClient(headers=AUTH, timeout=30) as http:
        async with Client(streamable_http_client(f"{base_url}/v1/workspaces/img/mcp", http_client=http)) as client:
            r = await client.call_tool("chart", {})
    assert r.is_error is False
    text, image = r.content
    assert isinstance(text, types.TextContent) and text.text == TEXT
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png" and image.data == CHART
    assert r.structured_content is not None
    # named in the structured result, the bytes sent once
    assert r.structured_content["images"] == [{"mime_type": "image/png", "width": 640, "height": 480}]


async def test_http_execute_returns_the_images_and_tool_calls_the_text(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH) as c:
        r = await c.post("/v1/workspaces/img/execute", json={"tool": "chart"})
        assert r.status_code == 200
        body = ToolResultOut.model_validate(r.json())
        assert body.images is not None and body.images[0].data == CHART and body.images[0].width == 640
        calls = [{"id": "call_1", "type": "function", "function": {"name": "chart", "arguments": "{}"}}]
        r = await c.post("/v1/workspaces/img/tool_calls", json=calls)
        assert r.json() == [{"role": "tool", "tool_call_id": "call_1", "content": TEXT}]
        r = await c.post("/v1/workspaces/img/execute", json={"tool": "read_file", "arguments": {"path": "x"}})
        assert "images" not in r.json()


async def test_run_anthropic_answers_a_registry_tool_with_image_blocks(tmp_path: Path, local_backend: Any) -> None:
    reg = registry(local_backend)
    block = {"type": "tool_use", "id": "toolu_1", "name": "chart", "input": {}}
    answer = await run_anthropic(reg, block, workspace=tmp_path)
    assert answer["tool_use_id"] == "toolu_1" and answer["is_error"] is False
    assert answer["content"] == [
        {"type": "text", "text": TEXT},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": CHART}},
    ]
    unknown = await run_anthropic(reg, {**block, "name": "nope"}, workspace=tmp_path)
    assert unknown["is_error"] is True and "Unknown tool 'nope'" in unknown["content"][0]["text"]
