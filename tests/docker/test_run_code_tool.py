"""The ``run_code`` tool on the real engine (the default image's IPython kernel), under
runc and gVisor: state between calls, a matplotlib chart as a PNG image of the figure's
size, an error with its traceback (no ANSI), output streamed as it is printed, a file the
code wrote in ``files_changed`` and undoable by the call's id, the call's outputs in the
journal; and through the surfaces: MCP's official client over the service's streamable
HTTP gets an ``ImageContent`` for a chart, Anthropic's ``tool_result`` an image block."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import MINIMAL_IMAGE, SANDBOX_IMAGE, TEST_OWNER
from tests.docker.conftest import own_registry, require_runtime
from tests.servers import serve_app
from worker.calls import page
from worker.http import create_app
from worker.native import run_anthropic
from worker.owner import OWNER_FILE
from worker.settings import Settings
from worker.streaming import ToolOutput

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.gvisor)]
TOKEN = "run-code-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A figure of exactly 400x300 pixels: the inline backend crops to the drawing by default.
CHART = (
    "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
    "import matplotlib.pyplot as plt\n"
    "fig = plt.figure(figsize=(4, 3), dpi=100)\n"
    "_ = plt.plot([1, 3, 2])\n"
)


def png_size(data: str) -> tuple[int, int]:
    raw = base64.b64decode(data, validate=True)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


@pytest.fixture(params=RUNTIMES)
async def env(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[tuple[Any, Path]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with own_registry(tmp_path, str(request.param)) as reg:
        yield reg, ws


async def test_state_a_chart_an_error_and_a_file(env: tuple[Any, Path]) -> None:
    reg, ws = env
    r = await reg.execute("run_code", {"code": "x = 41"}, ws)
    assert r.success and r.output == "(no output)", r.output
    r = await reg.execute("run_code", {"code": "x + 1"}, ws)
    assert r.success and r.output.endswith(": 42") and r.output.startswith("Out["), r.output
    assert r.data["results"][0]["is_main_result"] is True and r.data["results"][0]["text"] == "42"

    r = await reg.execute("run_code", {"code": CHART}, ws, call_id="chart-1")
    assert r.success, r.output
    assert "[image 1: image/png 400x300]" in r.output
    [image] = r.images
    assert image.mime_type == "image/png" and (image.width, image.height) == (400, 300)
    assert png_size(image.data) == (400, 300)

    r = await reg.execute("run_code", {"code": "def f():\n    return 1/0\nf()"}, ws)
    assert not r.success and r.error == "ZeroDivisionError: division by zero"
    assert "Traceback" in r.output and "----> 3 f()" in r.output and "\x1b[" not in r.output
    assert r.data["error"]["name"] == "ZeroDivisionError" and r.data["outcome"] == "error"
    r = await reg.execute("run_code", {"code": "x"}, ws)  # the error left the state alone
    assert r.success and r.output.endswith(": 41")

    r = await reg.execute("run_code", {"code": "open('out.txt', 'w').write('hi')"}, ws, call_id="writes-1")
    assert r.success and r.files_changed == ["out.txt"] and (ws / "out.txt").read_text() == "hi"
    workspace = await reg.workspace(ws)
    undone = await workspace.recorder.undo(workspace.sandbox, call_id="writes-1")
    assert not (ws / "out.txt").exists(), undone

    # the journal keeps what the chart call showed, for the timeline
    reg.journal.flush()
    calls, _ = page(reg.journal.directory(ws))
    chart = next(c for c in calls if c["call_id"] == "chart-1")
    assert chart["tool"] == "run_code" and chart["args"]["code"].startswith("%config")
    [shown] = [o for o in chart["outputs"] if o.get("mime_type") == "image/png"]
    assert (shown["width"], shown["height"]) == (400, 300) and png_size(shown["data"]) == (400, 300)


async def test_output_is_streamed_as_it_is_printed(env: tuple[Any, Path]) -> None:
    reg, ws = env
    code = "import time\nfor i in range(3):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.2)\n'done'"
    chunks: list[str] = []
    result = None
    async for item in reg.execute_stream("run_code", {"code": code}, ws):
        if isinstance(item, ToolOutput):
            chunks.append(item.text)
        else:
            result = item
    assert result is not None and result.success, result
    assert "".join(chunks) == "tick 0\ntick 1\ntick 2\n" and len(chunks) >= 2
    assert result.output == "tick 0\ntick 1\ntick 2\nOut[1]: 'done'"


async def test_a_timeout_interrupts_and_the_state_survives(env: tuple[Any, Path]) -> None:
    reg, ws = env
    assert (await reg.execute("run_code", {"code": "y = 7"}, ws)).success
    r = await reg.execute("run_code", {"code": "while True: pass", "timeout": 2}, ws)
    assert not r.success and r.data["outcome"] == "interrupted", r.output
    assert "state" in (r.error or "") and "kept" in (r.error or "")
    r = await reg.execute("run_code", {"code": "y"}, ws)
    assert r.success and r.output.endswith(": 7")


async def test_an_image_without_a_kernel_is_the_tools_error_naming_what_is_missing(
    docker_ready: None, tmp_path: Path
) -> None:
    from worker.registry import default_registry

    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / OWNER_FILE).write_text(TEST_OWNER + "\n")
    settings = Settings(data_dir=tmp_path / "data", image=MINIMAL_IMAGE, catalog=False)  # type: ignore[call-arg]
    async with default_registry(settings) as reg:
        try:
            r = await reg.execute("run_code", {"code": "1"}, ws)
            bad = await reg.execute("run_code", {"code": "1", "language": "javascript"}, ws)
        finally:
            await reg.stop(ws)
    assert not r.success and r.data["error_code"] == "kernel_unavailable" and "ipykernel" in r.data["missing"]
    assert "ipykernel" in (r.error or "") and "pip install" in (r.error or "")
    assert r.data.get("error_kind") is None  # the tool's error, not an infrastructure failure
    assert not bad.success and (bad.error or "").startswith("Invalid arguments for run_code: 'language': ")


async def test_an_anthropic_tool_result_has_the_chart_as_an_image_block(docker_ready: None, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with own_registry(tmp_path) as reg:
        block = {"type": "tool_use", "id": "toolu_chart", "name": "run_code", "input": {"code": CHART}}
        answer = await run_anthropic(reg, block, workspace=ws)
    assert answer["is_error"] is False and answer["tool_use_id"] == "toolu_chart"
    text, image = answer["content"]
    assert text["type"] == "text" and "[image 1: image/png 400x300]" in text["text"]
    assert image["type"] == "image" and image["source"]["type"] == "base64"
    assert image["source"]["media_type"] == "image/png" and png_size(image["source"]["data"]) == (400, 300)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_mcp_client_gets_an_image_content_block_for_a_chart(
    runtime: str, docker_ready: None, tmp_path: Path
) -> None:
    require_runtime(runtime)
    root, data = tmp_path / "root", tmp_path / "data"
    (root / "m").mkdir(parents=True)
    data.mkdir()
    (data / OWNER_FILE).write_text(TEST_OWNER + "\n")  # the run's sandboxes are the run's
    settings = Settings(
        workspace_root=root, data_dir=data, image=SANDBOX_IMAGE, runtime=runtime, catalog=False, api_token=TOKEN
    )  # type: ignore[arg-type]
    async with serve_app(create_app(settings)) as url, httpx2.AsyncClient(headers=AUTH, timeout=120) as http:
        async with Client(streamable_http_client(f"{url}/v1/workspaces/m/mcp", http_client=http)) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert listed["run_code"].input_schema["required"] == ["code"]
            r = await client.call_tool("run_code", {"code": CHART})
            failed = await client.call_tool("run_code", {"code": "1/0"})
    assert r.is_error is False, r.content
    text, image = r.content
    assert isinstance(text, types.TextContent) and "[image 1: image/png 400x300]" in text.text
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
    assert png_size(image.data) == (400, 300)
    assert r.structured_content is not None
    assert r.structured_content["images"] == [{"mime_type": "image/png", "width": 400, "height": 300}]
    assert failed.is_error is True and isinstance(failed.content[0], types.TextContent)
    assert "ZeroDivisionError: division by zero" in failed.content[0].text
