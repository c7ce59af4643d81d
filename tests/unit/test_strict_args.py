"""Strict argument types on every surface (issue 24, item 2).

The table (:mod:`strict_cases`) is generated from the tools' own schemas: every integer,
number and boolean field of every tool (built-ins, process tools, ``tool_search``, a
custom YAML tool) with non-finite numbers, booleans for numbers, numbers for booleans,
numeric strings and values past the stated bounds. Each case must be refused naming the
tool and the field, never run, on every surface: ``ToolRegistry.execute`` (arguments as a
dict and as the JSON string a model sends), HTTP ``execute``, ``execute/stream`` and
``tool_calls``, MCP over streamable HTTP and over stdio (raw JSON-RPC: the official client
turns a non-finite number into ``null`` before sending it), and ``loom-worker call`` /
``batch``. The tools run on ``LocalProcessBackend``; a refused call never reaches it.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import serve_app
from worker.calls import CallJournal
from worker.catalog.custom import parse_custom_file
from worker.catalog.search import Catalog
from worker.cli import main
from worker.http import create_app
from worker.registry import ToolRegistry
from worker.settings import Settings
from worker.tool import ToolArgs
from worker.tools import TOOL_NAMES
from worker.tools.catalog_tools import CatalogTools

try:  # tests/unit may or may not be a package
    from .strict_cases import BASE, CUSTOM_TOOL, Case, cases, expected, typed_fields
except ImportError:
    from strict_cases import BASE, CUSTOM_TOOL, Case, cases, expected, typed_fields  # type: ignore[no-redef]

TOKEN = "strict-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LOOM = str(Path(sys.executable).with_name("loom-worker"))


def _registry(backend: Any = None, catalog_file: Path | None = None) -> ToolRegistry:
    """The built-ins, ``tool_search`` and the custom tool (the catalog opens on first search)."""
    where = catalog_file or Path("/nonexistent/catalog.db")
    catalog = CatalogTools(lambda: Catalog.open(where), custom_tools=parse_custom_file(CUSTOM_TOOL, "typed.yaml"))
    return ToolRegistry(backend=backend, catalog_tools=catalog)


_SCHEMAS = [(t.name, t.parameters()) for t in _registry().tools]
CASES = cases(_SCHEMAS)
BUILTIN_CASES = [c for c in CASES if c.tool in TOOL_NAMES]


def _fail_all(results: list[tuple[Case, str | None]]) -> None:
    wrong = [f"{c.id}: {err!r}" for c, err in results if not expected(c, err)]
    assert not wrong, f"{len(wrong)} of {len(results)} not refused naming the field:\n" + "\n".join(wrong[:40])


# -- the table and the schemas --------------------------------------------------------------


def test_the_table_covers_every_typed_field() -> None:
    fields = {(c.tool, c.field) for c in CASES}
    assert fields >= {
        ("read_file", "max_bytes"),
        ("read_file", "line_range.0"),
        ("edit_file", "edits.0.replace_all"),
        ("shell_execute", "timeout"),
        ("shell_execute", "background"),
        ("shell_execute", "yield_ms"),
        ("list_directory", "depth"),
        ("process_output", "wait_ms"),
        ("process_input", "eof"),
        ("tool_search", "max_results"),
        ("typed_args", "count"),
        ("typed_args", "ratio"),
        ("typed_args", "flag"),
        ("typed_args", "sizes.0"),
    }
    # Every field of a number type found in the schemas is in the table.
    assert fields == {(t, ".".join(p)) for t, s in _SCHEMAS for p, _ in typed_fields(s)}
    assert len(CASES) > 150


def test_every_builtin_model_is_strict_and_its_schema_bounds_its_numbers() -> None:
    reg = _registry()
    for tool in reg.tools:
        if tool.name == "typed_args":
            continue
        assert issubclass(tool.args_model, ToolArgs), tool.name
        for path, node in typed_fields(tool.parameters()):
            assert node["type"] in ("integer", "number", "boolean"), (tool.name, path)
            if node["type"] != "boolean":  # a count, a size or a time: never negative
                assert "minimum" in node or "exclusiveMinimum" in node, (tool.name, path, node)


def test_the_base_arguments_and_good_values_are_accepted() -> None:
    """The refusals are about the bad value: the same arguments with a good one validate
    (an int for a number too: strictness is not about that)."""
    reg = _registry()
    for name, schema in _SCHEMAS:
        tool = reg.get(name)
        assert tool is not None
        tool.validate(json.loads(json.dumps(BASE[name])))
        for path, node in typed_fields(schema):
            if node["type"] == "boolean":
                good: list[Any] = [True, False]
            else:
                low = node.get("minimum", node.get("exclusiveMinimum", 0) + 1)
                good = [low] if node["type"] == "integer" else [low, float(low) + 0.5]
            for value in good:
                args = json.loads(json.dumps(BASE[name]))
                target = args
                for key in path[:-1]:
                    target = target[int(key)] if isinstance(target, list) else target.setdefault(key, {})
                if isinstance(target, list):
                    target[int(path[-1])] = value
                else:
                    target[path[-1]] = value
                tool.validate(args)


def test_json_schema_tools_refuse_non_finite_numbers_anywhere() -> None:
    """A custom or MCP tool's JSON Schema admits inf as a "number"; we do not."""
    tool = _registry().get("typed_args")
    assert tool is not None
    for bad in ({"count": 1, "ratio": math.inf}, {"count": 1, "sizes": [1, math.nan]}):
        with pytest.raises(Exception, match=r"Invalid arguments for typed_args: '(ratio|sizes\.1)': wrong value"):
            tool.validate(bad)


# -- Python: ToolRegistry.execute ----------------------------------------------------------


async def test_registry_refuses_every_case(local_backend: Any, workspace: Path, tmp_path: Path) -> None:
    reg = _registry(local_backend, tmp_path / "catalog.db")
    results: list[tuple[Case, str | None]] = []
    for case in CASES:
        r = await reg.execute(case.tool, case.args, workspace)  # the model's JSON string
        results.append((case, r.error))
        r = await reg.execute(case.tool, json.loads(case.args), workspace)  # Python values
        results.append((case, r.error))
    _fail_all(results)
    assert list(workspace.iterdir()) == []  # nothing ran
    await reg.aclose()


# -- HTTP: execute, execute/stream, tool_calls, and MCP over streamable HTTP ------------------


@pytest.fixture
async def service(tmp_path: Path, local_backend: Any) -> AsyncIterator[str]:
    settings = Settings(workspace_root=tmp_path / "root", api_token=TOKEN, data_dir=tmp_path / "data")
    registry = _registry(local_backend, tmp_path / "catalog.db")
    registry.journal = CallJournal(tmp_path / "data")
    app = create_app(settings, registry)
    async with serve_app(app) as url:
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as c:
            assert (await c.post("/v1/workspaces", json={"name": "w"})).status_code == 201
        yield url


def _json_body(text: str) -> dict[str, str]:
    return {"content": text, "headers": {"content-type": "application/json"}}  # type: ignore[dict-item]


async def test_http_execute_stream_and_tool_calls_refuse_every_case(service: str, tmp_path: Path) -> None:
    results: list[tuple[Case, str | None]] = []
    async with httpx.AsyncClient(base_url=service, headers=AUTH, timeout=60) as c:
        for case in CASES:
            body = f'{{"tool": {json.dumps(case.tool)}, "arguments": {case.args}}}'
            r = await c.post("/v1/workspaces/w/execute", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 200, (case.id, r.text)
            results.append((case, r.json()["error"]))
            r = await c.post(
                "/v1/workspaces/w/execute/stream", content=body, headers={"content-type": "application/json"}
            )
            assert r.status_code == 200, (case.id, r.text)
            (data,) = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
            results.append((case, json.loads(data)["error"]))
        # tool_calls: the arguments as the model's JSON string, and as an object.
        calls = [
            {"id": f"c{i}", "type": "function", "function": {"name": c_.tool, "arguments": c_.args}}
            for i, c_ in enumerate(CASES)
        ]
        as_objects = ", ".join(
            f'{{"id": "o{i}", "type": "function", "function": {{"name": "{c_.tool}", "arguments": {c_.args}}}}}'
            for i, c_ in enumerate(CASES)
        )
        for text in (json.dumps(calls), f"[{as_objects}]"):
            r = await c.post("/v1/workspaces/w/tool_calls", content=text, headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
            messages = r.json()
            assert len(messages) == len(CASES)
            results += [(case, m["content"].removeprefix("Error: ")) for case, m in zip(CASES, messages, strict=True)]
        # The refused calls are in the journal, and its page is JSON a browser can parse
        # (no bare Infinity or NaN in it).
        r = await c.get("/v1/workspaces/w/calls", params={"limit": 500})
        assert r.status_code == 200
        json.loads(r.text, parse_constant=lambda name: pytest.fail(f"{name} in GET .../calls"))
        assert r.json()["calls"]
    _fail_all(results)
    assert list((tmp_path / "root" / "w").iterdir()) == []


async def test_http_request_models_and_query_parameters(service: str) -> None:
    async with httpx.AsyncClient(base_url=service, headers=AUTH, timeout=60) as c:
        # process_input's own route: its body is the tool's arguments, as strict.
        for bad in ('"true"', "1", "Infinity"):
            r = await c.post("/v1/workspaces/w/processes/p1/input", **_json_body(f'{{"text": "x", "eof": {bad}}}'))
            assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "eof", (bad, r.text)
        # Query parameters are strings by nature: they are still parsed as before.
        r = await c.get("/v1/tools/search", params={"query": "read a file", "max_results": "2"})
        assert r.status_code == 200 and r.json()["results_count"] <= 2
        r = await c.get("/v1/tools/search", params={"query": "read a file", "max_results": "0"})
        assert r.status_code == 422
        r = await c.get("/v1/workspaces/w/processes/p1/output", params={"wait_ms": "10"})
        assert r.status_code == 404  # no such process (not a 422: the query is fine)


async def _mcp_post(c: httpx.AsyncClient, url: str, message: str, session: str | None) -> httpx.Response:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if session is not None:
        headers["mcp-session-id"] = session
    return await c.post(url, content=message, headers=headers)


def _mcp_answer(r: httpx.Response) -> dict[str, Any]:
    if r.headers["content-type"].startswith("text/event-stream"):
        (data,) = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        out: dict[str, Any] = json.loads(data)
        return out
    return dict(r.json())


def _tool_error(answer: dict[str, Any]) -> str | None:
    result = answer["result"]
    assert result["isError"] is True, answer
    return str(result["structuredContent"]["error"])


INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


async def test_mcp_streamable_http_refuses_every_case(service: str) -> None:
    url = f"{service}/v1/workspaces/w/mcp"
    async with httpx.AsyncClient(headers=AUTH, timeout=60) as c:
        r = await _mcp_post(c, url, json.dumps(INIT), None)
        assert r.status_code == 200, r.text
        session = r.headers["mcp-session-id"]
        r = await _mcp_post(c, url, '{"jsonrpc": "2.0", "method": "notifications/initialized"}', session)
        assert r.status_code == 202
        results = []
        for i, case in enumerate(CASES, 1):
            params = f'{{"name": {json.dumps(case.tool)}, "arguments": {case.args}}}'
            r = await _mcp_post(
                c, url, f'{{"jsonrpc": "2.0", "id": {i}, "method": "tools/call", "params": {params}}}', session
            )
            assert r.status_code == 200, (case.id, r.text)
            results.append((case, _tool_error(_mcp_answer(r))))
    _fail_all(results)


# -- MCP over stdio (`loom-worker mcp`) ---------------------------------------------------------


async def test_mcp_stdio_refuses_every_case(workspace: Path, tmp_path: Path) -> None:
    """The stdio server of ``--backend local`` has the built-in tools (no catalog)."""
    proc = await asyncio.create_subprocess_exec(
        LOOM,
        "mcp",
        "--workspace",
        str(workspace),
        "--backend",
        "local",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={"LOOM_ALLOW_UNSAFE_LOCAL": "1", "LOOM_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"},
        limit=1 << 22,
    )
    assert proc.stdin is not None and proc.stdout is not None

    async def ask(message: str, want: int | None) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(message.encode() + b"\n")
        await proc.stdin.drain()
        while want is not None:
            answer: dict[str, Any] = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
            if answer.get("id") == want:
                return answer
        return {}

    try:
        await ask(json.dumps(INIT), 0)
        await ask('{"jsonrpc": "2.0", "method": "notifications/initialized"}', None)
        results = []
        for i, case in enumerate(BUILTIN_CASES, 1):
            params = f'{{"name": {json.dumps(case.tool)}, "arguments": {case.args}}}'
            answer = await ask(f'{{"jsonrpc": "2.0", "id": {i}, "method": "tools/call", "params": {params}}}', i)
            results.append((case, _tool_error(answer)))
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 60)
    _fail_all(results)
    assert list(workspace.iterdir()) == []


# -- CLI: loom-worker call / batch ------------------------------------------------------------


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOOM_ALLOW_UNSAFE_LOCAL", "1")
    monkeypatch.setenv("LOOM_LOG_LEVEL", "warning")
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    # `--backend local` registers the built-ins only; give it the catalog's tools too.
    import worker.localworker.calls as calls

    monkeypatch.setattr(calls, "ToolRegistry", lambda **kw: _registry(kw["backend"], tmp_path / "catalog.db"))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out, _err = capsys.readouterr()
    return code, out


def test_cli_call_and_batch_refuse_every_case(
    cli_env: None, capsys: pytest.CaptureFixture[str], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results: list[tuple[Case, str | None]] = []
    for case in CASES:
        code, out = _run(
            capsys, "call", case.tool, "--workspace", str(workspace), "--args", case.args, "--backend", "local"
        )
        result = json.loads(out)
        assert code == 2 and result["success"] is False, (case.id, out)  # a usage error: --args the schema refuses
        results.append((case, result["error"]))
    lines = "".join(
        f'{{"tool": {json.dumps(c.tool)}, "arguments": {c.args}, "id": {i}}}\n' for i, c in enumerate(CASES)
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    code, out = _run(capsys, "batch", "--workspace", str(workspace), "--backend", "local")
    answers = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and [a["id"] for a in answers] == list(range(len(CASES)))
    results += [(case, a["error"]) for case, a in zip(CASES, answers, strict=True)]
    _fail_all(results)
    assert list(workspace.iterdir()) == []
