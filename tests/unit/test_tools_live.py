"""A tool registered (or removed) while the worker runs appears everywhere at once: the
registry's names and schemas, ``GET /v1/tools``, the ``tools/list`` of an MCP session
already open, the metrics' known tools, and the session is told
(``notifications/tools/list_changed`` on a handshake-era session, a ``subscriptions/listen``
event on a 2026-07-28 one). Two kinds of run-time tools: one registered by the embedding
code, and an MCP server's (tests/fixtures/mcp_stdio_server.py, run in the workspace's
sandbox), which the catalog registers when ``tool_search`` first indexes it."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field
from structlog.testing import capture_logs

from tests.servers import serve_app
from worker.catalog.mcp_source import MCPServerConfig
from worker.catalog.search import Catalog
from worker.http import create_app
from worker.mcp_server import build_server
from worker.metrics import Metrics
from worker.registry import ToolRegistry, ToolTable
from worker.result import ToolResult
from worker.service import CallRunner
from worker.settings import Settings
from worker.tool import Tool, ToolContext
from worker.tools.catalog_tools import CatalogTools

FIXTURES = Path(__file__).parent.parent / "fixtures"
TOKEN = "live-tools-token"
SHOUT = "mcp__fx__shout"
WAIT = 30.0  # seconds for a notification to arrive: generous, the machine may be busy


class HelloArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Who to greet.")


async def _hello(args: HelloArgs, _ctx: ToolContext) -> ToolResult:
    return ToolResult.ok(f"hello, {args.name}")


HELLO = Tool(
    name="say_hello", description="Greet someone by name", args_model=HelloArgs, fn=_hello, needs_workspace=False
)


# -- the tool table ----------------------------------------------------------------------


def test_version_moves_and_subscribers_are_told_of_every_change() -> None:
    table = ToolTable()
    calls: list[int] = []
    unsubscribe = table.subscribe(lambda: calls.append(table.version))
    table.register(HELLO)
    assert table.version == 1 and calls == [1] and table.names() == ["say_hello"]
    with pytest.raises(ValueError, match="already registered"):
        table.register(HELLO)
    assert table.version == 1 and calls == [1]  # a refused registration changes nothing
    assert table.unregister("say_hello") is HELLO
    assert table.version == 2 and calls == [1, 2] and "say_hello" not in table
    with pytest.raises(KeyError, match="not registered"):
        table.unregister("say_hello")
    unsubscribe()
    unsubscribe()  # a second call does nothing
    table.register(HELLO)
    assert table.version == 3 and calls == [1, 2]


def test_a_failing_subscriber_neither_stops_the_change_nor_the_others() -> None:
    table = ToolTable()
    told: list[str] = []

    def broken() -> None:
        raise RuntimeError("subscriber bug")

    table.subscribe(broken)
    table.subscribe(lambda: told.append("second"))
    with capture_logs() as logs:
        table.register(HELLO)
    assert "say_hello" in table and told == ["second"]
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["tools.subscriber_failed"]


def test_the_registry_exposes_the_table_version_and_subscriptions() -> None:
    registry = ToolRegistry()
    seen: list[int] = []
    unsubscribe = registry.subscribe_tools(lambda: seen.append(registry.tools_version))
    start = registry.tools_version
    registry.register(HELLO)
    assert registry.tools_version == start + 1 and seen == [start + 1]
    assert "say_hello" in registry.names() and "say_hello" in _schema_names(registry.all_schemas())
    registry.unregister("say_hello")
    assert registry.tools_version == start + 2 and seen == [start + 1, start + 2]
    assert "say_hello" not in _schema_names(registry.all_schemas())
    unsubscribe()


def test_schemas_are_rendered_once_per_version_and_handed_out_as_copies() -> None:
    registry = ToolRegistry()
    first = registry.all_schemas("mcp")
    first[0]["name"] = "changed by the caller"
    assert registry.all_schemas("mcp")[0]["name"] == registry.names()[0]
    registry.register(HELLO)
    assert registry.all_schemas("mcp")[-1]["name"] == "say_hello"
    assert _schema_names(registry.all_schemas("anthropic")) == set(registry.names())


# -- every surface, one registry -----------------------------------------------------------


@dataclass
class Service:
    url: str
    registry: ToolRegistry
    workspace: Path

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


@pytest.fixture
async def service(tmp_path: Path, local_backend: Any) -> AsyncIterator[Service]:
    catalog = Catalog.open(tmp_path / "catalog.db")
    fx = MCPServerConfig(name="fx", command=["python3", "server.py"], timeout=30)
    registry = ToolRegistry(backend=local_backend, catalog_tools=CatalogTools(catalog, mcp_servers=[fx]))
    app = create_app(Settings(workspace_root=tmp_path / "root", api_token=TOKEN), registry)
    try:
        async with serve_app(app) as url:
            svc = Service(url, registry, Path())
            async with svc.http() as c:
                r = await c.post("/v1/workspaces", json={"name": "live"})
                assert r.status_code == 201, r.text
            svc.workspace = Path(r.json()["path"])
            shutil.copy(FIXTURES / "mcp_stdio_server.py", svc.workspace / "server.py")
            yield svc
    finally:
        await registry.aclose()
        await catalog.aclose()


def _schema_names(schemas: list[dict[str, Any]]) -> set[str]:
    return {s["function"]["name"] if "function" in s else s["name"] for s in schemas}


async def _listed_everywhere(svc: Service, client: Client) -> dict[str, set[str]]:
    """The tool names as each surface lists them now."""
    async with svc.http() as c:
        r = await c.get("/v1/tools")
        assert r.status_code == 200
        r_mcp = await c.get("/v1/tools", params={"format": "mcp"})
    listed = await client.list_tools()
    return {
        "names": set(svc.registry.names()),
        "schemas": _schema_names(svc.registry.all_schemas()),
        "http": _schema_names(r.json()),
        "http_mcp": _schema_names(r_mcp.json()),
        "mcp": {t.name for t in listed.tools},
    }


def _everywhere(listed: dict[str, set[str]], name: str) -> bool:
    return all(name in names for names in listed.values())


def _nowhere(listed: dict[str, set[str]], name: str) -> bool:
    return all(name not in names for names in listed.values())


async def _called_counted(svc: Service, tool: str) -> bool:
    """Whether the service's metrics counted a call of ``tool`` under its own name (a name
    outside the known-tool set is counted as ``unknown``)."""
    async with svc.http() as c:
        text = (await c.get("/metrics")).text
    return f'tool="{tool}"' in text


async def test_an_open_2026_session_sees_tools_added_and_removed(service: Service) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{service.url}/v1/workspaces/live/mcp"
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
            tools_cap = client.server_capabilities.tools
            assert tools_cap is not None and tools_cap.list_changed is True
            before = await _listed_everywhere(service, client)
            assert _nowhere(before, "say_hello") and _nowhere(before, SHOUT)

            async with client.listen(tools_list_changed=True) as sub:
                assert sub.honored.tools_list_changed is True
                events: asyncio.Queue[object] = asyncio.Queue()

                async def collect() -> None:
                    async for event in sub:
                        events.put_nowait(event)

                collector = asyncio.create_task(collect())
                try:
                    # 1. A tool the embedding code registers.
                    service.registry.register(HELLO)
                    assert isinstance(await asyncio.wait_for(events.get(), WAIT), ToolsListChanged)
                    assert _everywhere(await _listed_everywhere(service, client), "say_hello")
                    r = await client.call_tool("say_hello", {"name": "ada"})
                    assert r.is_error is False and "hello, ada" in "".join(
                        c.text for c in r.content if isinstance(c, types.TextContent)
                    )
                    assert await _called_counted(service, "say_hello")

                    # 2. An MCP server's tools, registered by the catalog during this call.
                    r = await client.call_tool("tool_search", {"query": "convert text to upper case"})
                    assert r.is_error is False
                    assert isinstance(await asyncio.wait_for(events.get(), WAIT), ToolsListChanged)
                    assert _everywhere(await _listed_everywhere(service, client), SHOUT)
                    r = await client.call_tool(SHOUT, {"text": "quiet"})
                    assert r.is_error is False and "QUIET" in "".join(
                        c.text for c in r.content if isinstance(c, types.TextContent)
                    )
                    assert await _called_counted(service, SHOUT)

                    # 3. A tool removed.
                    while not events.empty():  # anything still in flight from step 2
                        events.get_nowait()
                    service.registry.unregister("say_hello")
                    assert isinstance(await asyncio.wait_for(events.get(), WAIT), ToolsListChanged)
                    after = await _listed_everywhere(service, client)
                    assert _nowhere(after, "say_hello") and _everywhere(after, SHOUT)
                finally:
                    collector.cancel()


async def test_an_open_handshake_session_is_sent_tools_list_changed(local_backend: Any, workspace: Path) -> None:
    registry = ToolRegistry(backend=local_backend)
    server = build_server(registry, CallRunner(registry, Metrics()), lambda _ctx: workspace)
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            changed.set()

    async with Client(server, mode="legacy", message_handler=on_message) as client:
        assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
        tools_cap = client.server_capabilities.tools
        assert tools_cap is not None and tools_cap.list_changed is True
        assert "say_hello" not in {t.name for t in (await client.list_tools()).tools}

        registry.register(HELLO)
        await asyncio.wait_for(changed.wait(), WAIT)
        assert "say_hello" in {t.name for t in (await client.list_tools()).tools}

        changed.clear()
        registry.unregister("say_hello")
        await asyncio.wait_for(changed.wait(), WAIT)
        assert "say_hello" not in {t.name for t in (await client.list_tools()).tools}
    await registry.aclose()


async def test_a_handshake_session_over_http_is_sent_tools_list_changed(service: Service) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{service.url}/v1/workspaces/live/mcp"
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            changed.set()

    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", message_handler=on_message) as client:
            assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            tools_cap = client.server_capabilities.tools
            assert tools_cap is not None and tools_cap.list_changed is True
            # Server notifications travel on the session's GET stream, which the client
            # opens in the background after the handshake; one sent before it is open is
            # lost (no event store). Change the list until one arrives: then it is open.
            for _ in range(100):
                service.registry.register(HELLO)
                service.registry.unregister("say_hello")
                try:
                    await asyncio.wait_for(changed.wait(), 0.2)
                    break
                except TimeoutError:
                    continue
            assert changed.is_set(), "no tools/list_changed reached the session"

            changed.clear()
            r = await client.call_tool("tool_search", {"query": "convert text to upper case"})
            assert r.is_error is False
            await asyncio.wait_for(changed.wait(), WAIT)
            listed = await _listed_everywhere(service, client)
            assert _everywhere(listed, SHOUT) and _nowhere(listed, "say_hello")


async def test_closed_and_idle_http_sessions_are_forgotten(
    tmp_path: Path, local_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A handshake-era session ends without telling the server's handlers: the service
    # forgets it as the SDK's session manager does (DELETE, or idle without a request).
    monkeypatch.setattr("worker.mcp_server.SESSION_IDLE_TIMEOUT", 0.5)
    registry = ToolRegistry(backend=local_backend)
    app = create_app(Settings(workspace_root=tmp_path / "root"), registry)
    async with serve_app(app) as url:
        async with httpx.AsyncClient(base_url=url) as c:
            assert (await c.post("/v1/workspaces", json={"name": "w"})).status_code == 201
        tool_list = app.state.service.mcp.tool_list
        mcp_url = f"{url}/v1/workspaces/w/mcp"
        async with httpx2.AsyncClient(timeout=30) as http:
            async with Client(streamable_http_client(mcp_url, http_client=http), mode="legacy") as client:
                await client.list_tools()
                assert tool_list.sessions == 1
        assert tool_list.sessions == 0  # the client's DELETE

        async with httpx2.AsyncClient(timeout=30) as http:
            transport = streamable_http_client(mcp_url, http_client=http, terminate_on_close=False)
            async with Client(transport, mode="legacy") as client:
                await client.list_tools()
        assert tool_list.sessions == 1  # gone without a DELETE: kept until it is idle
        await asyncio.sleep(1.0)  # twice the idle timeout
        registry.register(HELLO)  # the next change (or session) prunes it
        for _ in range(100):
            if tool_list.sessions == 0:
                break
            await asyncio.sleep(0.05)
        assert tool_list.sessions == 0
    await registry.aclose()
