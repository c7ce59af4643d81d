"""The HTTP API in process: the real registry and tools on ``LocalProcessBackend``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from worker.http import UnsafeBindError, check_bind, create_app
from worker.registry import ToolRegistry
from worker.result import ToolResult
from worker.settings import Settings

TOKEN = "test-token-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Service:
    def __init__(self, client: httpx.AsyncClient, app: Any, root: Path) -> None:
        self.client = client
        self.app = app
        self.root = root

    async def workspace(self, name: str = "w1") -> Path:
        r = await self.client.post("/v1/workspaces", json={"name": name})
        assert r.status_code == 201, r.text
        return Path(r.json()["path"])

    async def execute(self, ws: str, tool: str, **arguments: Any) -> dict[str, Any]:
        r = await self.client.post(f"/v1/workspaces/{ws}/execute", json={"tool": tool, "arguments": arguments})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


@asynccontextmanager
async def lifespan_task(app: Any) -> AsyncIterator[None]:
    """Run the app's lifespan in a task of its own: it holds anyio cancel scopes, which
    must be exited by the task that entered them (fixture teardown may run elsewhere)."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def run() -> None:
        async with app.router.lifespan_context(app):
            started.set()
            await stop.wait()

    task = asyncio.create_task(run())
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()  # raises the startup error
    try:
        yield
    finally:
        stop.set()
        await task


@asynccontextmanager
async def running(root: Path, registry: Any, *, routes: Sequence[Any] = (), **overrides: Any) -> AsyncIterator[Service]:
    settings = Settings(workspace_root=root, api_token=TOKEN, **overrides)
    app = create_app(settings, registry, routes=routes)
    async with lifespan_task(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=AUTH) as client:
            yield Service(client, app, root)


@asynccontextmanager
async def recording_service(tmp_path: Path, backend: Any) -> AsyncIterator[Service]:
    """The service with the real changelog (one per workspace, under ``tmp_path/data``)."""
    from worker.http.changelog import ChangelogPool

    pool = ChangelogPool(tmp_path / "data")
    try:
        async with running(tmp_path / "r", ToolRegistry(backend=backend, recorder_factory=pool.recorder)) as s:
            yield s
    finally:
        await pool.aclose()


@pytest.fixture
async def svc(tmp_path: Path, local_backend: Any) -> AsyncIterator[Service]:
    async with running(tmp_path / "root", ToolRegistry(backend=local_backend)) as s:
        yield s


async def test_healthz_needs_no_token(svc: Service) -> None:
    r = await svc.client.get("/healthz", headers={"Authorization": ""})
    assert r.status_code == 200
    assert r.json()["status"] == "ok"


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic " + TOKEN, TOKEN, "Bearer"])
async def test_auth_refused_without_or_with_wrong_token(svc: Service, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=svc.app), base_url="http://127.0.0.1") as c:
        for method, url in [("GET", "/v1/tools"), ("GET", "/v1/workspaces"), ("GET", "/metrics")]:
            r = await c.request(method, url, headers=headers)
            assert r.status_code == 401, (url, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
        r = await c.post("/v1/workspaces", json={"name": "x"}, headers=headers)
        assert r.status_code == 401
    assert not (svc.root / "x").exists()


async def test_auth_accepted_with_right_token(svc: Service) -> None:
    r = await svc.client.get("/v1/tools")
    assert r.status_code == 200


def test_refuses_non_loopback_bind_without_token(tmp_path: Path) -> None:
    with pytest.raises(UnsafeBindError, match="LOOM_API_TOKEN"):
        check_bind(Settings(host="0.0.0.0", api_token=None, workspace_root=tmp_path))
    check_bind(Settings(host="0.0.0.0", api_token="t", workspace_root=tmp_path))
    check_bind(Settings(host="127.0.0.1", api_token=None, workspace_root=tmp_path))


@pytest.mark.parametrize(
    ("fmt", "key"), [("openai", "function"), ("anthropic", "input_schema"), ("mcp", "inputSchema")]
)
async def test_tools_in_each_format(svc: Service, fmt: str, key: str) -> None:
    r = await svc.client.get("/v1/tools", params={"format": fmt})
    assert r.status_code == 200
    tools = r.json()
    assert all(key in t for t in tools)
    names = [t["function"]["name"] if fmt == "openai" else t["name"] for t in tools]
    assert {"read_file", "write_file", "edit_file", "shell_execute", "search_files", "list_directory"} <= set(names)


async def test_tools_unknown_format_is_422_naming_the_field(svc: Service) -> None:
    r = await svc.client.get("/v1/tools", params={"format": "xml"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "format"]


async def test_workspace_crud(svc: Service) -> None:
    path = await svc.workspace("proj")
    assert path == (svc.root / "proj").resolve() and path.is_dir()
    r = await svc.client.post("/v1/workspaces", json={"name": "proj"})
    assert r.status_code == 409
    r = await svc.client.post("/v1/workspaces")
    assert r.status_code == 201
    anon = r.json()["id"]
    r = await svc.client.get("/v1/workspaces")
    assert sorted(w["id"] for w in r.json()) == sorted(["proj", anon])
    (path / "keep.txt").write_text("x")
    r = await svc.client.delete("/v1/workspaces/proj")
    assert r.status_code == 200 and r.json()["files_deleted"] is False
    assert (path / "keep.txt").exists()
    r = await svc.client.delete("/v1/workspaces/proj", params={"delete_files": "true"})
    assert r.status_code == 200
    assert not path.exists()
    r = await svc.client.delete("/v1/workspaces/proj")
    assert r.status_code == 404


@pytest.mark.parametrize("name", ["../evil", ".hidden", "a/b", "", "x" * 65, "..", "a\x00b"])
async def test_workspace_names_that_could_escape_are_422(svc: Service, name: str) -> None:
    r = await svc.client.post("/v1/workspaces", json={"name": name})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "name"]
    assert [p.name for p in svc.root.iterdir()] == []


@pytest.mark.parametrize("ws", ["..", "%2e%2e", "..%2F..%2Fetc", ".git", "nope"])
async def test_unknown_or_traversing_workspace_ids_never_reach_a_tool(svc: Service, ws: str) -> None:
    r = await svc.client.post(f"/v1/workspaces/{ws}/execute", json={"tool": "list_directory", "arguments": {}})
    assert r.status_code in (404, 422), r.text


async def test_symlinked_workspace_is_not_a_workspace(svc: Service, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (svc.root / "link").symlink_to(outside)
    r = await svc.client.post("/v1/workspaces/link/execute", json={"tool": "list_directory", "arguments": {}})
    assert r.status_code == 404
    assert "link" not in [w["id"] for w in (await svc.client.get("/v1/workspaces")).json()]


async def test_a_file_or_missing_entry_under_the_root_is_not_a_workspace(svc: Service) -> None:
    await svc.workspace()
    (svc.root / "plain").write_text("not a directory")
    for ws in ("plain", "absent"):
        r = await svc.client.post(f"/v1/workspaces/{ws}/execute", json={"tool": "list_directory", "arguments": {}})
        assert r.status_code == 404, r.text


async def test_execute_answers_the_result_as_utf8_json(svc: Service) -> None:
    await svc.workspace()
    await svc.execute("w1", "write_file", path="u.txt", content="héllo ✓\n")
    r = await svc.client.post("/v1/workspaces/w1/execute", json={"tool": "read_file", "arguments": {"path": "u.txt"}})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert "héllo ✓".encode() in r.content
    body = r.json()
    assert set(body) == {"success", "output", "data", "files_changed", "error"}
    assert body["success"] is True and body["error"] is None and "héllo ✓" in body["output"]


async def test_execute_write_then_read(svc: Service) -> None:
    path = await svc.workspace()
    res = await svc.execute("w1", "write_file", path="pkg/mod.py", content="x = 1\n")
    assert res["success"] is True and res["files_changed"] == ["pkg/mod.py"]
    assert (path / "pkg/mod.py").read_text() == "x = 1\n"
    res = await svc.execute("w1", "read_file", path="pkg/mod.py")
    assert res["success"] is True and "x = 1" in res["output"]


async def test_tool_failures_are_results_not_http_errors(svc: Service) -> None:
    await svc.workspace()
    res = await svc.execute("w1", "no_such_tool")
    assert res["success"] is False and "Unknown tool" in res["error"]
    res = await svc.execute("w1", "read_file", paht="x")
    assert res["success"] is False and "'path'" in res["error"] and "'paht'" in res["error"]
    res = await svc.execute("w1", "read_file", path="../../etc/passwd")
    assert res["success"] is False and res["error"].startswith("Safety violation")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"arguments": {}}, ["body", "tool"]),
        ({"tool": "read_file", "arguments": []}, ["body", "arguments"]),
        ({"tool": "read_file", "extra": 1}, ["body", "extra"]),
        ({"tool": 5}, ["body", "tool"]),
    ],
)
async def test_malformed_execute_body_is_422_naming_the_field(
    svc: Service, body: dict[str, Any], field: list[str]
) -> None:
    await svc.workspace()
    r = await svc.client.post("/v1/workspaces/w1/execute", json=body)
    assert r.status_code == 422
    assert field in [d["loc"] for d in r.json()["detail"]]


async def test_invalid_json_body_is_422(svc: Service) -> None:
    await svc.workspace()
    r = await svc.client.post(
        "/v1/workspaces/w1/execute", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422


async def test_tool_calls_returns_messages_in_order(svc: Service) -> None:
    path = await svc.workspace()
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "write_file", "arguments": '{"path": "a.txt", "content": "one"}'},
        },
        {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"'}},
        {"id": "c3", "type": "function", "function": {"name": "read_file", "arguments": "[1, 2]"}},
        {"id": "c4", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}},
        {"id": "c5", "type": "function", "function": {"name": "bogus", "arguments": "{}"}},
    ]
    r = await svc.client.post("/v1/workspaces/w1/tool_calls", json=calls)
    assert r.status_code == 200, r.text
    msgs = r.json()
    assert [m["tool_call_id"] for m in msgs] == ["c1", "c2", "c3", "c4", "c5"]
    assert all(m["role"] == "tool" for m in msgs)
    assert "not valid JSON" in msgs[1]["content"]
    assert "JSON object" in msgs[2]["content"]
    assert msgs[3]["content"] == "one"
    assert "Unknown tool" in msgs[4]["content"]
    assert (path / "a.txt").read_text() == "one"


async def test_oversized_body_is_413(tmp_path: Path, local_backend: Any) -> None:
    async with running(tmp_path / "r", ToolRegistry(backend=local_backend), max_body_bytes=4096) as svc:
        path = await svc.workspace()
        big = {"tool": "write_file", "arguments": {"path": "big.txt", "content": "x" * 10_000}}
        r = await svc.client.post("/v1/workspaces/w1/execute", json=big)
        assert r.status_code == 413
        assert not (path / "big.txt").exists()

        # Without a Content-Length (chunked), the limit still holds while streaming.
        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"tool": "write_file", "arguments": {"path": "big.txt", "content": "'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}}'

        r = await svc.client.post(
            "/v1/workspaces/w1/execute", content=chunks(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        assert not (path / "big.txt").exists()
        metrics = (await svc.client.get("/metrics")).text
        assert 'loom_http_rejected_total{reason="too_large"} 2.0' in metrics


async def test_concurrent_edits_to_one_workspace_are_all_applied(svc: Service) -> None:
    path = await svc.workspace()
    n = 24
    original = "".join(f"line-{i}\n" for i in range(n))
    await svc.execute("w1", "write_file", path="f.txt", content=original)

    async def edit(i: int) -> dict[str, Any]:
        return await svc.execute("w1", "edit_file", path="f.txt", old_str=f"line-{i}\n", new_str=f"done-{i}\n")

    results = await asyncio.gather(*(edit(i) for i in range(n)))
    assert all(r["success"] for r in results), [r["error"] for r in results if not r["success"]]
    assert (path / "f.txt").read_text() == "".join(f"done-{i}\n" for i in range(n))


async def test_concurrent_writes_leave_one_whole_version(svc: Service) -> None:
    path = await svc.workspace()
    contents = [chr(ord("a") + i) * 50_000 for i in range(8)]
    results = await asyncio.gather(*(svc.execute("w1", "write_file", path="same.txt", content=c) for c in contents))
    assert all(r["success"] for r in results)
    # Serialized in arrival order: the last request sent wins, whole.
    assert (path / "same.txt").read_text() in contents


class GatedRegistry:
    """The real registry, except that calls wait for ``gate`` (to hold slots open)."""

    def __init__(self, inner: ToolRegistry) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.waiting = 0
        self.two_waiting = asyncio.Event()
        self.backend = inner.backend

    def all_schemas(self, fmt: str = "openai") -> list[dict[str, Any]]:
        return self.inner.all_schemas(fmt)

    def names(self) -> list[str]:
        return self.inner.names()

    @property
    def tools_version(self) -> int:
        return self.inner.tools_version

    def subscribe_tools(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self.inner.subscribe_tools(callback)

    async def stop(self, path: Path) -> bool:
        return await self.inner.stop(path)

    async def execute(self, name: str, arguments: Any, workspace: Any = None, **kw: Any) -> ToolResult:
        self.waiting += 1
        if self.waiting >= 2:
            self.two_waiting.set()
        await self.gate.wait()
        return await self.inner.execute(name, arguments, workspace, **kw)


async def test_429_when_the_global_limit_is_full(tmp_path: Path, local_backend: Any) -> None:
    reg = GatedRegistry(ToolRegistry(backend=local_backend))
    async with running(tmp_path / "r", reg, max_concurrent_calls=2) as svc:
        await svc.workspace("a")
        await svc.workspace("b")
        body = {"tool": "list_directory", "arguments": {}}
        held = [
            asyncio.create_task(svc.client.post("/v1/workspaces/a/execute", json=body)),
            asyncio.create_task(svc.client.post("/v1/workspaces/b/execute", json=body)),
        ]
        await reg.two_waiting.wait()
        r = await svc.client.post("/v1/workspaces/a/execute", json=body)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        r = await svc.client.post("/v1/workspaces/b/tool_calls", json=[])
        assert r.status_code == 429
        reg.gate.set()
        assert [(await t).status_code for t in held] == [200, 200]
        r = await svc.client.post("/v1/workspaces/a/execute", json=body)
        assert r.status_code == 200
        assert 'loom_http_rejected_total{reason="busy"} 2.0' in (await svc.client.get("/metrics")).text


async def test_metrics_count_calls_by_tool_and_outcome(svc: Service) -> None:
    await svc.workspace()
    await svc.execute("w1", "write_file", path="a.txt", content="a")
    await svc.execute("w1", "read_file", path="a.txt")
    await svc.execute("w1", "read_file", path="missing.txt")
    await svc.execute("w1", "made_up_tool_name")
    r = await svc.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'loom_tool_calls_total{outcome="ok",tool="read_file"} 1.0' in text
    assert 'loom_tool_calls_total{outcome="error",tool="read_file"} 1.0' in text
    assert 'loom_tool_calls_total{outcome="error",tool="unknown"} 1.0' in text
    assert "made_up_tool_name" not in text
    assert 'loom_tool_call_duration_seconds_count{tool="write_file"} 1.0' in text
    assert "loom_sandboxes_live 1.0" in text
    assert "loom_sandbox_restarts_total 0.0" in text


async def test_delete_stops_the_sandbox(svc: Service) -> None:
    await svc.workspace()
    await svc.execute("w1", "list_directory")
    assert "loom_sandboxes_live 1.0" in (await svc.client.get("/metrics")).text
    r = await svc.client.delete("/v1/workspaces/w1")
    assert r.json()["sandbox_stopped"] is True
    assert "loom_sandboxes_live 0.0" in (await svc.client.get("/metrics")).text


async def test_openapi_document_describes_the_api(svc: Service) -> None:
    doc = (await svc.client.get("/openapi.json")).json()
    paths = doc["paths"]
    for p in [
        "/healthz",
        "/v1/tools",
        "/v1/workspaces",
        "/v1/workspaces/{workspace_id}/execute",
        "/v1/workspaces/{workspace_id}/tool_calls",
    ]:
        assert p in paths
    assert "429" in paths["/v1/workspaces/{workspace_id}/execute"]["post"]["responses"]


async def test_changelog_diff_and_undo(tmp_path: Path, local_backend: Any) -> None:
    async with recording_service(tmp_path, local_backend) as svc:
        path = await svc.workspace()
        c = svc.client
        body = {
            "tool": "write_file",
            "arguments": {"path": "m.py", "content": "a = 1\n"},
            "call_id": "w1",
        }
        assert (await c.post("/v1/workspaces/w1/execute", json=body)).json()["success"]
        body = {
            "tool": "edit_file",
            "arguments": {"path": "m.py", "old_str": "1", "new_str": "2"},
            "call_id": "e1",
        }
        assert (await c.post("/v1/workspaces/w1/execute", json=body)).json()["success"]
        body = {"tool": "shell_execute", "arguments": {"command": "echo x > made.txt"}, "call_id": "s1"}
        assert (await c.post("/v1/workspaces/w1/execute", json=body)).json()["files_changed"] == ["made.txt"]

        entries = (await c.get("/v1/workspaces/w1/changelog")).json()
        assert [(e["call_id"], e["path"]) for e in entries] == [
            ("w1", "m.py"),
            ("e1", "m.py"),
            ("s1", "made.txt"),
        ]
        only = (await c.get("/v1/workspaces/w1/changelog", params={"call_id": "e1"})).json()
        assert [e["call_id"] for e in only] == ["e1"]
        diff = (await c.get("/v1/workspaces/w1/diff", params={"path": "m.py"})).json()["diff"]
        assert "+a = 2" in diff
        summary = (await c.get("/v1/workspaces/w1/diff", params={"summary": "true"})).json()
        assert sorted(summary["created"]) == ["m.py", "made.txt"]

        r = await c.post("/v1/workspaces/w1/undo", json={"call_id": "e1", "all": True})
        assert r.status_code == 422
        r = await c.post("/v1/workspaces/w1/undo", json={"call_id": "e1", "dry_run": True})
        assert r.status_code == 200 and r.json()["dry_run"] is True
        assert (path / "m.py").read_text() == "a = 2\n"
        r = await c.post("/v1/workspaces/w1/undo", json={"call_id": "e1"})
        assert r.status_code == 200, r.text
        assert [s["status"] for s in r.json()["steps"]] == ["reverted"]
        assert (path / "m.py").read_text() == "a = 1\n"
        r = await c.post("/v1/workspaces/w1/undo", json={"call_id": "s1"})
        assert r.status_code == 200 and not (path / "made.txt").exists()
        r = await c.post("/v1/workspaces/w1/undo", json={"entry": 999})
        assert r.status_code == 404


async def test_changelog_shows_trees_groups_and_modes_readably(tmp_path: Path, local_backend: Any) -> None:
    """A made tree, a group of creations under an existing ignored directory and a chmod:
    each entry says what it stands for (``detail``), the group's paths are listed by the
    members route, the diff names the tree, and undo gives the tree back as it was."""
    async with recording_service(tmp_path, local_backend) as svc:
        path = await svc.workspace()
        (path / "node_modules").mkdir()
        (path / "run.sh").write_text("#!/bin/sh\n")
        (path / "run.sh").chmod(0o644)
        c = svc.client
        command = "mkdir -p .venv/bin && echo x > .venv/bin/py && echo 1 > node_modules/a.js && chmod 755 run.sh"
        body = {"tool": "shell_execute", "arguments": {"command": command}, "call_id": "s1"}
        r = (await c.post("/v1/workspaces/w1/execute", json=body)).json()
        assert sorted(r["files_changed"]) == [".venv/", "node_modules/a.js", "run.sh"]
        entries = {e["path"]: e for e in (await c.get("/v1/workspaces/w1/changelog")).json()}
        assert entries[".venv"]["detail"] == "tree: 1 file, 2 bytes" and entries[".venv"]["tree_files"] == 1
        assert entries["node_modules"]["detail"].startswith("group: 1 file")
        assert entries["run.sh"]["detail"] == "mode 644 -> 755"
        group = entries["node_modules"]["id"]
        members = (await c.get(f"/v1/workspaces/w1/changelog/{group}/members")).json()
        assert members == ["node_modules/a.js"]
        assert (await c.get("/v1/workspaces/w1/changelog/99999/members")).status_code == 404
        diff = (await c.get("/v1/workspaces/w1/diff")).json()["diff"]
        assert "Only in b: .venv/ (tree: 1 file" in diff
        r = await c.post("/v1/workspaces/w1/undo", json={"call_id": "s1"})
        assert r.status_code == 200 and {s["status"] for s in r.json()["steps"]} == {"reverted"}
        assert sorted(p.name for p in path.iterdir()) == ["node_modules", "run.sh"]
        assert (path / "run.sh").stat().st_mode & 0o777 == 0o644 and not any((path / "node_modules").iterdir())


async def test_changelog_routes_say_when_nothing_is_recorded(svc: Service) -> None:
    await svc.workspace()
    r = await svc.client.get("/v1/workspaces/w1/changelog")
    assert r.status_code == 409 and "no changelog" in r.json()["detail"]


async def test_odd_file_names_over_http(tmp_path: Path, local_backend: Any) -> None:
    """A command that creates a file whose name is not UTF-8: every route answers strict
    UTF-8 JSON with the name quoted as git does, and takes the quoted name back."""
    async with recording_service(tmp_path, local_backend) as svc:
        path = await svc.workspace()
        c = svc.client
        body = {"tool": "shell_execute", "arguments": {"command": "true"}}
        assert (await c.post("/v1/workspaces/w1/execute", json=body)).status_code == 200
        cmd = "printf 'a\\n' > \"$(printf 'bad\\377.txt')\""
        r = await c.post("/v1/workspaces/w1/execute", json={"tool": "shell_execute", "arguments": {"command": cmd}})
        assert r.status_code == 200, r.text
        r.content.decode("utf-8")  # strict
        assert r.json()["files_changed"] == ['"bad\\377.txt"']
        body = {"tool": "list_directory", "arguments": {"path": "."}}
        listing = (await c.post("/v1/workspaces/w1/execute", json=body)).json()
        assert '"bad\\377.txt"' in listing["output"].splitlines()[1]
        body = {"tool": "read_file", "arguments": {"path": '"bad\\377.txt"'}}
        assert (await c.post("/v1/workspaces/w1/execute", json=body)).json()["success"]

        r = await c.get("/v1/workspaces/w1/changelog")
        assert r.status_code == 200, r.text
        assert [e["path"] for e in r.json()] == ['"bad\\377.txt"']
        r = await c.get("/v1/workspaces/w1/changelog", params={"path": '"bad\\377.txt"'})
        assert len(r.json()) == 1
        r = await c.get("/v1/workspaces/w1/diff")
        assert r.status_code == 200 and '+++ "b/bad\\377.txt"' in r.json()["diff"]
        r = await c.get("/v1/workspaces/w1/diff", params={"summary": "true"})
        assert r.json()["created"] == ['"bad\\377.txt"']
        r = await c.post("/v1/workspaces/w1/undo", json={"all": True})
        assert r.status_code == 200, r.text
        assert [s["path"] for s in r.json()["steps"]] == ['"bad\\377.txt"']
        assert os.listdir(os.fsencode(path)) == []
