"""The catalog end to end on the real Docker sandbox (issue 6):

- a stdio MCP server (stdlib only, tests/fixtures/mcp_stdio_server.py) copied into the
  workspace runs **inside the container**: its tools are indexed, found by ``tool_search``,
  and called through ``ToolRegistry.execute``; the tool reports where it runs;
- this project's own MCP endpoint (served by uvicorn on loopback) as a streamable HTTP
  source: indexed, one tool called;
- custom YAML tools through ``default_registry`` with shell metacharacters passed literally;
- an MCP server's tools registered at run time (the first ``tool_search`` in a workspace
  indexes it in the container) appear at once in ``GET /v1/tools`` and in the
  ``tools/list`` of an MCP session already open, which is told of the change.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged

from sandbox.base import ExecRequest
from tests.conftest import SANDBOX_IMAGE
from tests.servers import serve_app
from worker import default_registry
from worker.catalog.mcp_source import MCPServerConfig
from worker.catalog.search import Catalog
from worker.changelog import Changelog
from worker.http import create_app
from worker.registry import ToolRegistry
from worker.settings import Settings
from worker.tools.catalog_tools import CatalogTools

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TOKEN = "catalog-docker-token"
HOSTILE = "; rm -rf / $(touch pwned) `id` \"' && | * $HOME \\"


@pytest.fixture
async def catalog(tmp_path: Path) -> AsyncIterator[Catalog]:
    c = Catalog.open(tmp_path / "catalog.db")
    yield c
    await c.aclose()


async def test_stdio_mcp_server_runs_inside_the_container(
    docker_backend: Any, catalog: Catalog, workspace: Path, tmp_path: Path
) -> None:
    shutil.copy(FIXTURES / "mcp_stdio_server.py", workspace / "server.py")
    data = tmp_path / "data"
    server = MCPServerConfig(name="fixture", command=["python3", "server.py"], timeout=30)
    reg = ToolRegistry(
        backend=docker_backend,
        recorder_factory=lambda root: Changelog.open(data, root),
        catalog_tools=CatalogTools(catalog, mcp_servers=[server]),
    )

    found = await reg.execute("tool_search", {"query": "report the machine host name"}, workspace)
    assert found.success, found.error
    top = found.data["results"][0]  # type: ignore[index]
    assert top["name"] == "mcp__fixture__where_am_i" and top["source"] == "MCP"
    sources = {s.name: s for s in await catalog.list_sources()}
    assert sources["mcp:fixture"].available and sources["mcp:fixture"].tool_count == 4

    r = await reg.execute("mcp__fixture__where_am_i", {}, workspace)
    assert r.success, r.error
    where = json.loads(r.output)
    assert where["nodename"] == "sandbox"  # the container's host name, not this machine's
    assert "docker-init" in where["init"] or "tini" in where["init"], where
    assert where["nodename"] != socket.gethostname()

    r = await reg.execute("mcp__fixture__shout", {"text": HOSTILE}, workspace)
    assert r.success and r.output == HOSTILE.upper()

    r = await reg.execute("mcp__fixture__leave_note", {"path": "note.txt", "text": "hello"}, workspace, call_id="n1")
    assert r.success and r.files_changed == ["note.txt"]
    assert (workspace / "note.txt").read_text() == "hello"
    cl = Changelog.open(data, workspace)
    try:
        (entry,) = await cl.log(call_id="n1")
        assert entry.op == "create" and entry.tool == "mcp__fixture__leave_note"
    finally:
        await cl.aclose()
    # The server process ends with each call: nothing is left running in the sandbox.
    box = await docker_backend.get(workspace)
    ps = await box.exec(ExecRequest("ps -eo args | grep -c '^python3 server.py' || true"))
    assert ps.stdout.strip() == b"0"
    await reg.aclose()


@pytest.fixture
async def service_mcp_url(tmp_path: Path, docker_backend: Any) -> AsyncIterator[str]:
    """This project's own service (Docker sandboxes) on loopback; its MCP endpoint for workspace "w"."""
    root = tmp_path / "root"
    (root / "w").mkdir(parents=True)
    (root / "w" / "served.txt").write_text("served by the worker's own MCP endpoint\n")
    app = create_app(Settings(workspace_root=root, api_token=TOKEN), ToolRegistry(backend=docker_backend))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1/workspaces/w/mcp"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def test_http_mcp_source_is_indexed_and_called(service_mcp_url: str, catalog: Catalog) -> None:
    server = MCPServerConfig(name="self", url=service_mcp_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    tools = CatalogTools(catalog, mcp_servers=[server])
    reg = ToolRegistry(catalog_tools=tools)  # no sandbox of its own: an HTTP MCP tool runs on its server
    found = await reg.execute("tool_search", {"query": "read the contents of a file", "max_results": 10})
    assert found.success, found.error
    names = [x["name"] for x in found.data["results"]]  # type: ignore[index]
    # Without a workspace only tools that need none are offered: the remote ones.
    assert "mcp__self__read_file" in names and "read_file" not in names
    assert tools.ids["mcp__self__read_file"] == "mcp:self:read_file"
    assert not reg.get("mcp__self__read_file").needs_workspace  # type: ignore[union-attr]

    r = await reg.execute("mcp__self__read_file", {"path": "served.txt"})
    assert r.success, r.error
    assert "served by the worker's own MCP endpoint" in r.output
    r = await reg.execute("mcp__self__read_file", {"path": "missing.txt"})
    assert not r.success and "missing.txt" in (r.error or "")
    await reg.aclose()


async def test_custom_tools_in_default_registry(workspace: Path, tmp_path: Path, docker_ready: None) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "save.yaml").write_text(
        "name: save_note\ndescription: Save a note to a text file\n"
        "parameters: {type: object, properties: {path: {type: string}, text: {type: string}},"
        " required: [path, text]}\n"
        "command: [python3, -c, 'import sys; open(sys.argv[1], \"w\").write(sys.argv[2])', '{path}', '{text}']\n"
    )
    (tmp_path / "tools" / "broken.yaml").write_text("name: [oops\n")
    async with default_registry(image=SANDBOX_IMAGE, data_dir=tmp_path) as reg:
        try:
            assert reg.catalog_tools is not None and "custom:broken.yaml" in reg.catalog_tools.errors
            found = await reg.execute("tool_search", {"query": "save a note to a file"}, workspace)
            assert found.success and found.data["results"][0]["name"] == "save_note"  # type: ignore[index]
            r = await reg.execute("save_note", {"path": "n.txt", "text": HOSTILE}, workspace, call_id="s1")
            assert r.success, r.output
            assert r.files_changed == ["n.txt"] and (workspace / "n.txt").read_text() == HOSTILE
            assert sorted(p.name for p in workspace.iterdir()) == ["n.txt"]
            sources = {s.name: s for s in await reg.catalog_tools.catalog().list_sources()}
            assert "broken.yaml" in sources["custom"].status_message
        finally:
            await reg.stop(workspace)


async def test_mcp_tools_registered_at_run_time_reach_an_open_session(
    docker_backend: Any, catalog: Catalog, tmp_path: Path
) -> None:
    server = MCPServerConfig(name="fixture", command=["python3", "server.py"], timeout=30)
    reg = ToolRegistry(backend=docker_backend, catalog_tools=CatalogTools(catalog, mcp_servers=[server]))
    app = create_app(Settings(workspace_root=tmp_path / "root", api_token=TOKEN), reg)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    name = "mcp__fixture__shout"
    async with serve_app(app) as url:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
            r = await http.post("/v1/workspaces", json={"name": "w"})
            assert r.status_code == 201, r.text
            shutil.copy(FIXTURES / "mcp_stdio_server.py", Path(r.json()["path"]) / "server.py")
            assert name not in {s["function"]["name"] for s in (await http.get("/v1/tools")).json()}
            async with httpx2.AsyncClient(headers=headers, timeout=120) as h2:
                async with Client(streamable_http_client(f"{url}/v1/workspaces/w/mcp", http_client=h2)) as client:
                    assert name not in {t.name for t in (await client.list_tools()).tools}
                    async with client.listen(tools_list_changed=True) as sub:
                        events = aiter(sub)
                        found = await client.call_tool("tool_search", {"query": "convert text to upper case"})
                        assert found.is_error is False
                        assert isinstance(await asyncio.wait_for(anext(events), 60), ToolsListChanged)
                        assert name in {t.name for t in (await client.list_tools()).tools}
                        assert name in reg.names()
                        assert name in {s["function"]["name"] for s in (await http.get("/v1/tools")).json()}
                        shouted = await client.call_tool(name, {"text": "from the container"})
                        assert shouted.is_error is False
                        assert "FROM THE CONTAINER" in json.dumps(shouted.model_dump(mode="json"))
    await reg.aclose()
