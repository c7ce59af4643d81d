"""The catalog inside the registry (issue 6), on ``LocalProcessBackend``: ``tool_search`` as
a builtin, custom YAML tools and MCP tools as registered tools, ``GET /v1/tools/search``,
and the CLI. The same flows on the real Docker sandbox are in tests/docker/test_catalog_docker.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from worker.catalog.custom import parse_custom_file
from worker.catalog.index import ToolDescriptor
from worker.catalog.mcp_source import MCPServerConfig
from worker.catalog.search import Catalog
from worker.changelog import Changelog
from worker.cli import main
from worker.http import create_app
from worker.registry import ToolRegistry
from worker.settings import Settings
from worker.tools.catalog_tools import CatalogTools, mcp_tool_name

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
HOSTILE = "; rm -rf / $(touch pwned) `id` \"' && | * $HOME \\"

ECHO_TOOL = """
name: echo_args
description: Print the given words as a JSON list, one argument each
parameters:
  type: object
  properties:
    words: {type: array, items: {type: string}, description: Words to print}
  required: [words]
command: [python3, -c, "import json,sys;print(json.dumps(sys.argv[1:]))", "{words}"]
capabilities: [transform]
"""

NOTE_TOOL = """
name: save_note
description: Save a note to a text file in the workspace
parameters:
  type: object
  properties:
    path: {type: string}
    text: {type: string}
  required: [path, text]
script: 'printf "%s" "$ARG_text" > "$ARG_path"'
capabilities: [file_io]
"""


def _custom(*texts: str) -> list[Any]:
    return [t for i, text in enumerate(texts) for t in parse_custom_file(text, f"f{i}.yaml")]


@pytest.fixture
async def catalog(tmp_path: Path) -> AsyncIterator[Catalog]:
    c = Catalog.open(tmp_path / "catalog.db")
    yield c
    await c.aclose()


def _stdio_server(name: str = "fx") -> MCPServerConfig:
    return MCPServerConfig(name=name, command=["python3", "server.py"], timeout=20)


# -- tool_search ----------------------------------------------------------------------


async def test_tool_search_is_a_builtin_that_needs_no_workspace(
    local_backend: Any, catalog: Catalog, workspace: Path
) -> None:
    reg = ToolRegistry(backend=local_backend, catalog_tools=CatalogTools(catalog))
    assert reg.names()[-1] == "tool_search" and not reg.get("tool_search").needs_workspace  # type: ignore[union-attr]

    r = await reg.execute("tool_search", {"query": "read the contents of a file"}, workspace)
    assert r.success, r.error
    out = json.loads(r.output)
    assert out == r.data
    assert out["results"][0]["name"] == "read_file" and out["results"][0]["source"] == "BUILTIN"
    assert set(out) >= {"query", "results_count", "results", "search_mode", "search_time_ms", "total_tools_indexed"}
    assert out["results"][0]["parameters"]["path"].endswith("(string, required)")

    # Without a workspace, tools that need one could not run: they are not offered.
    r = await reg.execute("tool_search", {"query": "read the contents of a file"})
    assert r.success and all(x["name"] == "tool_search" for x in r.data["results"])  # type: ignore[index]


async def test_tool_search_never_returns_tools_the_registry_cannot_run(
    local_backend: Any, catalog: Catalog, workspace: Path
) -> None:
    # Another registry (or an old config) left tools in the shared catalog.
    ghost = ToolDescriptor(
        id="mcp:ghost:send_slack",
        name="send_slack",
        description="Send a message to Slack",
        source="mcp",
        mcp_server="ghost",
    )
    await catalog.index_tools("mcp", [ghost], mcp_server="ghost")
    reg = ToolRegistry(backend=local_backend, catalog_tools=CatalogTools(catalog))
    r = await reg.execute("tool_search", {"query": "send a message to Slack", "max_results": 10}, workspace)
    assert r.success and "send_slack" not in {x["name"] for x in r.data["results"]}  # type: ignore[index]
    assert await catalog.get_tool("mcp:ghost:send_slack") is not None  # still indexed, just not offered


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
async def test_empty_query_is_invalid_query(local_backend: Any, catalog: Catalog, query: str) -> None:
    reg = ToolRegistry(backend=local_backend, catalog_tools=CatalogTools(catalog))
    r = await reg.execute("tool_search", {"query": query})
    assert not r.success and r.error is not None and r.error.startswith("INVALID_QUERY")
    assert r.data == {"error_code": "INVALID_QUERY"}


async def test_ten_concurrent_first_searches(local_backend: Any, catalog: Catalog, workspace: Path) -> None:
    reg = ToolRegistry(backend=local_backend, catalog_tools=CatalogTools(catalog, custom_tools=_custom(ECHO_TOOL)))
    queries = ["read a file", "run a shell command", 'NEAR( "', "* OR", "list directory"] * 2
    results = await asyncio.gather(*(reg.execute("tool_search", {"query": q}, workspace) for q in queries))
    assert all(r.success for r in results), [r.error for r in results]
    assert (await catalog.list_sources())[0].name == "builtin"
    assert catalog.index.integrity_check()


# -- custom tools ----------------------------------------------------------------------


async def test_custom_tools_are_registered_searchable_and_run_literally(
    local_backend: Any, catalog: Catalog, workspace: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    tools = CatalogTools(catalog, custom_tools=_custom(ECHO_TOOL, NOTE_TOOL))
    reg = ToolRegistry(
        backend=local_backend, recorder_factory=lambda root: Changelog.open(data, root), catalog_tools=tools
    )
    assert {"echo_args", "save_note"} <= set(reg.names())
    assert tools.ids["echo_args"] == "custom:echo_args"
    schema = next(s for s in reg.all_schemas() if s["function"]["name"] == "save_note")
    assert schema["function"]["parameters"]["required"] == ["path", "text"]
    mcp = next(s for s in reg.all_schemas("mcp") if s["name"] == "save_note")
    assert mcp["annotations"]["destructiveHint"] is True

    found = await reg.execute("tool_search", {"query": "save a note to a text file"}, workspace)
    top = found.data["results"][0]  # type: ignore[index]
    assert top["name"] == "save_note" and top["id"] == "custom:save_note" and top["source"] == "CUSTOM"

    r = await reg.execute("echo_args", {"words": [HOSTILE, "$(id)"]}, workspace)
    assert r.success, r.output
    assert json.loads(r.output) == [HOSTILE, "$(id)"] and r.files_changed == []

    r = await reg.execute("save_note", {"path": "notes.txt", "text": HOSTILE}, workspace, call_id="c1")
    assert r.success, r.output
    assert r.files_changed == ["notes.txt"]
    assert (workspace / "notes.txt").read_text() == HOSTILE
    assert sorted(p.name for p in workspace.iterdir()) == ["notes.txt"]  # nothing else: no injection
    cl = Changelog.open(data, workspace)
    try:
        (entry,) = await cl.log(call_id="c1")
        assert entry.tool == "save_note" and entry.path == "notes.txt" and entry.op == "create"
    finally:
        await cl.aclose()
    await reg.aclose()


async def test_custom_tool_arguments_are_checked_and_failures_reported(
    local_backend: Any, catalog: Catalog, workspace: Path
) -> None:
    fails = "name: nope\ndescription: exits 3\nscript: 'echo oops >&2; exit 3'\n"
    reg = ToolRegistry(
        backend=local_backend, catalog_tools=CatalogTools(catalog, custom_tools=_custom(ECHO_TOOL, fails))
    )
    r = await reg.execute("echo_args", {"words": "not a list"}, workspace)
    assert not r.success and r.error is not None and r.error.startswith("Invalid arguments for echo_args")
    r = await reg.execute("echo_args", {"words": ["a"], "extra": 1}, workspace)
    assert not r.success and "extra" in (r.error or "")
    r = await reg.execute("echo_args", {"words": ["a"]})
    assert not r.success and "No workspace" in (r.error or "")
    r = await reg.execute("nope", {}, workspace)
    assert not r.success and r.error == "nope failed (exit, exit code 3)" and "oops" in r.output


def test_bad_files_and_name_clashes_are_reported_and_do_not_stop_the_others(tmp_path: Path) -> None:
    tools_dir = tmp_path / "tools"
    tools_dir.mkdir()
    (tools_dir / "a_bad.yaml").write_text("name: [unclosed\n")
    (tools_dir / "b_clash.yaml").write_text("name: read_file\ndescription: shadows a builtin\ncommand: [cat]\n")
    (tools_dir / "c_ok.yaml").write_text(ECHO_TOOL)
    (tmp_path / "mcp.yaml").write_text("servers:\n  bad: {url: 'ftp://x'}\n")
    settings = Settings(data_dir=tmp_path / "data", tools_dir=tools_dir, mcp_servers_file=tmp_path / "mcp.yaml")
    tools = CatalogTools.from_settings(settings)
    reg = ToolRegistry(catalog_tools=tools)
    assert "echo_args" in reg.names() and reg.get("read_file").description != "shadows a builtin"  # type: ignore[union-attr]
    assert set(tools.errors) == {"custom:a_bad.yaml", "custom:read_file", "mcp:bad"}
    assert "already taken" in tools.errors["custom:read_file"]
    assert not (tmp_path / "data").exists()  # the catalog opens on first search, not before


# -- MCP: a stdio server inside the sandbox ----------------------------------------------


async def test_stdio_mcp_server_indexed_and_called_through_the_registry(
    local_backend: Any, catalog: Catalog, workspace: Path, tmp_path: Path
) -> None:
    shutil.copy(FIXTURES / "mcp_stdio_server.py", workspace / "server.py")
    data = tmp_path / "data"
    tools = CatalogTools(catalog, mcp_servers=[_stdio_server()])
    reg = ToolRegistry(
        backend=local_backend, recorder_factory=lambda root: Changelog.open(data, root), catalog_tools=tools
    )
    name = mcp_tool_name("fx", "shout")
    assert name == "mcp__fx__shout" and name not in reg.names()  # not indexed yet

    # Without a workspace there is no sandbox to run it: not indexed, not offered.
    r = await reg.execute("tool_search", {"query": "convert text to upper case"})
    assert r.success and name not in {x["name"] for x in r.data["results"]}  # type: ignore[index]

    r = await reg.execute("tool_search", {"query": "convert text to upper case"}, workspace)
    assert r.success, r.error
    top = r.data["results"][0]  # type: ignore[index]
    assert top["name"] == name and top["source"] == "MCP" and top["mcp_server"] == "fx"
    assert tools.ids[name] == "mcp:fx:shout" and reg.get(name).needs_workspace  # type: ignore[union-attr]

    r = await reg.execute(name, {"text": "hi $(id) `x`"}, workspace)
    assert r.success and r.output == "HI $(ID) `X`", r.output
    r = await reg.execute(name, {"text": 3}, workspace)
    assert not r.success and "Invalid arguments" in (r.error or "")
    r = await reg.execute(name, {"text": "x"})
    assert not r.success and "No workspace" in (r.error or "")

    r = await reg.execute("mcp__fx__leave_note", {"path": "note.txt", "text": "from mcp"}, workspace, call_id="m1")
    assert r.success and r.files_changed == ["note.txt"]
    cl = Changelog.open(data, workspace)
    try:
        (entry,) = await cl.log(call_id="m1")
        assert entry.tool == "mcp__fx__leave_note" and entry.op == "create"
    finally:
        await cl.aclose()

    r = await reg.execute("mcp__fx__fail", {}, workspace)
    assert not r.success and "always fails" in (r.error or "")
    await reg.aclose()


async def test_stdio_server_that_dies_is_infrastructure(local_backend: Any, catalog: Catalog, workspace: Path) -> None:
    (workspace / "server.py").write_text("import sys\nprint('broken server', file=sys.stderr)\nsys.exit(4)\n")
    tools = CatalogTools(catalog, mcp_servers=[_stdio_server("dead")])
    reg = ToolRegistry(backend=local_backend, catalog_tools=tools)
    report = await tools.refresh(reg, await reg.workspace(workspace))
    assert "exited with code 4" in report.errors["mcp:dead"] and "broken server" in report.errors["mcp:dead"]
    (src,) = [s for s in await catalog.list_sources() if s.name == "mcp:dead"]
    assert not src.available


async def test_cli_index_with_workspace_runs_stdio_servers_in_its_sandbox(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(FIXTURES / "mcp_stdio_server.py", workspace / "server.py")
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LOOM_MCP_SERVERS_FILE", str(tmp_path / "mcp.yaml"))
    monkeypatch.delenv("LOOM_TOOLS_DIR", raising=False)
    (tmp_path / "mcp.yaml").write_text("servers:\n  fx: {command: [python3, server.py]}\n")

    code = await asyncio.to_thread(main, ["tools", "index"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and "--workspace" in out["errors"]["mcp:fx"]

    args = ["tools", "index", "--workspace", str(workspace), "--backend", "local"]
    code = await asyncio.to_thread(main, args)
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["sources"]["mcp:fx"]["total"] == 4, out

    code = await asyncio.to_thread(main, ["tools", "search", "convert text to upper case"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["results"][0]["name"] == "mcp__fx__shout"
    code = await asyncio.to_thread(main, ["tools"])
    names = [s["function"]["name"] for s in json.loads(capsys.readouterr().out)]
    assert "tool_search" in names and "mcp__fx__shout" in names


def test_cli_tools_lists_custom_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("LOOM_TOOLS_DIR", raising=False)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "echo.yaml").write_text(ECHO_TOOL)
    assert main(["tools", "--format", "anthropic"]) == 0
    schemas = {s["name"]: s for s in json.loads(capsys.readouterr().out)}
    assert schemas["echo_args"]["input_schema"]["required"] == ["words"] and "tool_search" in schemas
    monkeypatch.setenv("LOOM_CATALOG", "false")
    assert main(["tools"]) == 0
    assert "echo_args" not in {s["function"]["name"] for s in json.loads(capsys.readouterr().out)}


def test_default_registry_has_the_catalog(tmp_path: Path) -> None:
    from worker import default_registry

    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "echo.yaml").write_text(ECHO_TOOL)
    reg = default_registry(data_dir=tmp_path, docker_host="unix:///nonexistent.sock")
    assert reg.names()[-2:] == ["tool_search", "echo_args"] and reg.catalog_tools is not None
    assert default_registry(data_dir=tmp_path, catalog=False).catalog_tools is None


# -- HTTP -------------------------------------------------------------------------------


async def _http(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            yield c


async def test_http_search(local_backend: Any, catalog: Catalog, tmp_path: Path) -> None:
    reg = ToolRegistry(backend=local_backend, catalog_tools=CatalogTools(catalog, custom_tools=_custom(ECHO_TOOL)))
    app = create_app(Settings(workspace_root=tmp_path / "root"), reg)
    async for c in _http(app):
        r = await c.get("/v1/tools/search", params={"query": "read a file", "max_results": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["results_count"] == 2 and body["results"][0]["name"] == "read_file"
        r = await c.get("/v1/tools/search", params=[("query", "print words"), ("capability", "transform")])
        assert r.status_code == 200 and [x["name"] for x in r.json()["results"]] == ["echo_args"]
        r = await c.get("/v1/tools/search", params={"query": "  "})
        assert r.status_code == 422 and r.json()["code"] == "INVALID_QUERY"
        bad_params: list[dict[str, str | int]] = [{}, {"query": "x", "max_results": 11}, {"query": "x", "mode": "slow"}]
        for bad in bad_params:
            assert (await c.get("/v1/tools/search", params=bad)).status_code == 422
        for hostile in ['"', "*", "NEAR(", "OR", 'a "b', "\x00"]:
            assert (await c.get("/v1/tools/search", params={"query": hostile})).status_code in (200, 422)
        assert "/v1/tools/search" in (await c.get("/openapi.json")).json()["paths"]
    await reg.aclose()


async def test_http_search_without_a_catalog_is_404(local_backend: Any, tmp_path: Path) -> None:
    app = create_app(Settings(workspace_root=tmp_path / "root"), ToolRegistry(backend=local_backend))
    async for c in _http(app):
        r = await c.get("/v1/tools/search", params={"query": "read"})
        assert r.status_code == 404 and "not enabled" in r.json()["detail"]


async def test_the_index_leaves_the_native_tools_out_as_tool_lists_do(
    local_backend: Any, catalog: Catalog, workspace: Path
) -> None:
    """A native call registers the vendors' tools; the index (and its count) must not
    change for it, as ``all_schemas`` does not."""
    from worker.native.calls import install

    reg = ToolRegistry(backend=local_backend, catalog_tools=CatalogTools(catalog))
    before = (await reg.execute("tool_search", {"query": "run a shell command"}, workspace)).data
    install(reg)
    assert {"bash", "str_replace_based_edit_tool"} <= set(reg.names())
    await reg.catalog_tools.refresh(reg, mcp=False)  # type: ignore[union-attr]
    after = (await reg.execute("tool_search", {"query": "run a shell command"}, workspace)).data
    assert before is not None and after is not None
    assert after["total_tools_indexed"] == before["total_tools_indexed"]
    assert not {"bash", "shell", "apply_patch", "str_replace_based_edit_tool"} & {x["name"] for x in after["results"]}
