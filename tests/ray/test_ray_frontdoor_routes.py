"""Every route of the service through the front door (``loom-worker serve --ray``), for a
workspace on a node of the cluster: each route of the app's table (``worker.http.app``'s
ROUTERS, the documentation and the dashboard) has a probe here that checks it works as
the local service's does (several compare the two answers), or is in the front door's
list of refusals (``forward.REFUSED``), answered 501 with its reason. A route added to the
app without a probe here fails the test."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import WebSocketRoute

from tests import wsclient
from tests.conftest import SANDBOX_IMAGE
from tests.servers import serve_app
from tests.unit.test_http_stream_ports import sse
from tests.unit.test_http_terminals import next_text, read_until

from .conftest import NAMESPACE, RayCluster

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

TOKEN = "ray-routes-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WS = "/v1/workspaces/{workspace_id}"


@dataclass
class Ctx:
    front: httpx.AsyncClient  # the front door
    local: httpx.AsyncClient  # the local service, same settings (for the answers compared)
    cluster: RayCluster
    ws: dict[str, Any]  # a workspace of the front door (on a node)
    lws: dict[str, Any]  # the local service's twin of it
    seen: dict[str, Any] = field(default_factory=dict)

    def url(self, path: str, *, local: bool = False, **params: Any) -> str:
        return path.format(workspace_id=(self.lws if local else self.ws)["id"], **params)


Probe = Callable[[Ctx], Awaitable[None]]
PROBES: dict[tuple[str, str], Probe] = {}


def probe(method: str, path: str) -> Callable[[Probe], Probe]:
    def add(fn: Probe) -> Probe:
        PROBES[(method, path)] = fn
        return fn

    return add


async def both(ctx: Ctx, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, httpx.Response]:
    """The same request to the front door and to the local service."""
    a = await ctx.front.request(method, ctx.url(path), **kwargs)
    b = await ctx.local.request(method, ctx.url(path, local=True), **kwargs)
    return a, b


def norm(ctx: Ctx, value: Any, drop: frozenset[str] = frozenset()) -> Any:
    """``value`` with each side's workspace named alike and ``drop``'s keys left out."""
    text = json.dumps(value)
    for w in (ctx.ws, ctx.lws):
        text = text.replace(w["path"], "<ws-path>")
    text = text.replace(ctx.ws["id"], "<ws>")  # (the two have one id)
    out = json.loads(text)

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items() if k not in drop}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(out)


async def call(ctx: Ctx, tool: str, *, local: bool = False, **args: Any) -> dict[str, Any]:
    client = ctx.local if local else ctx.front
    r = await client.post(ctx.url(f"{WS}/execute", local=local), json={"tool": tool, "arguments": args})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


# -- the front door's own ---------------------------------------------------------------------


@probe("GET", "/healthz")
async def _healthz(ctx: Ctx) -> None:
    r = await ctx.front.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@probe("GET", "/metrics")
async def _metrics(ctx: Ctx) -> None:
    r = await ctx.front.get("/metrics")
    assert r.status_code == 200 and "loom_tool_calls_total" in r.text, r.text[:500]


@probe("GET", "/openapi.json")
async def _openapi(ctx: Ctx) -> None:
    a, b = await both(ctx, "GET", "/openapi.json")
    assert a.status_code == 200 and a.json() == b.json()  # the same API, documented alike


@probe("GET", "/docs")
@probe("GET", "/docs/oauth2-redirect")
@probe("GET", "/redoc")
async def _docs(ctx: Ctx) -> None:
    for path in ("/docs", "/docs/oauth2-redirect", "/redoc"):
        r = await ctx.front.get(path)
        assert r.status_code == 200 and "<html" in r.text.lower(), path


@probe("GET", "/")
@probe("*", "/ui")
async def _dashboard(ctx: Ctx) -> None:
    r = await ctx.front.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    r = await ctx.front.get("/ui/app.css")
    assert r.status_code == 200 and "text/css" in r.headers["content-type"]


# -- tools: what the nodes run, the catalog's custom tool and tool_search included -------------


@probe("GET", "/v1/tools")
async def _tools(ctx: Ctx) -> None:
    for fmt in ("openai", "anthropic", "mcp"):
        a, b = await both(ctx, "GET", "/v1/tools", params={"format": fmt})
        assert a.status_code == 200 and a.json() == b.json(), fmt
    names = {t["function"]["name"] for t in (await ctx.front.get("/v1/tools")).json()}
    assert {"shout", "tool_search", "read_file"} <= names, names


@probe("GET", "/v1/tools/search")
async def _search(ctx: Ctx) -> None:
    a, b = await both(ctx, "GET", "/v1/tools/search", params={"query": "print text in capitals"})
    timing = frozenset({"search_time_ms"})
    assert a.status_code == 200 and norm(ctx, a.json(), timing) == norm(ctx, b.json(), timing), (a.text, b.text)
    assert "shout" in a.text
    a, b = await both(ctx, "GET", "/v1/tools/search", params={"query": " "})
    assert a.status_code == b.status_code == 422 and a.json() == b.json()


@probe("GET", "/v1/native/tools")
async def _native_tools(ctx: Ctx) -> None:
    for vendor in ("anthropic", "openai"):
        a, b = await both(ctx, "GET", "/v1/native/tools", params={"vendor": vendor})
        assert a.status_code == 200 and a.json() == b.json()


# -- images: every node's engine ----------------------------------------------------------------


@probe("POST", "/v1/images/pull")
@probe("GET", "/v1/images/pulls")
async def _images(ctx: Ctx) -> None:
    import asyncio

    async def watch() -> list[tuple[str, Any]]:
        seen = []
        async with ctx.front.stream("GET", "/v1/images/pulls") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            async for event, data in sse(r):
                seen.append((event, json.loads(data)))
                if seen[-1][1]["state"] == "failed":
                    return seen
        return seen

    # An image the nodes have: nothing to pull, on any node.
    async with ctx.front.stream("POST", "/v1/images/pull", json={"image": SANDBOX_IMAGE}) as r:
        events = [(e, json.loads(d)) async for e, d in sse(r)]
    assert events == [("result", {"image": SANDBOX_IMAGE, "pulled": False})], events
    # One no registry serves: each node tries, fails; the watchers see it.
    watcher = asyncio.create_task(watch())
    await asyncio.sleep(1.0)  # (the watch is open on every node)
    bad = "127.0.0.1:9/loom-nothing:1"
    async with ctx.front.stream("POST", "/v1/images/pull", json={"image": bad}) as r:
        events = [(e, json.loads(d)) async for e, d in sse(r)]
    assert events[-1][0] == "error" and events[-1][1]["image"] == bad, events
    seen = await asyncio.wait_for(watcher, 60)
    assert seen[-1][1]["image"] == bad and seen[-1][1]["state"] == "failed", seen


# -- workspaces ---------------------------------------------------------------------------------


@probe("POST", "/v1/workspaces")
@probe("GET", "/v1/workspaces")
async def _workspaces(ctx: Ctx) -> None:
    # (ctx.ws was made by this route; here its JSON as listed)
    listed = {w["id"]: w for w in (await ctx.front.get("/v1/workspaces")).json()}
    assert listed[ctx.ws["id"]] == ctx.ws
    assert ctx.ws["state"] == "ready" and Path(ctx.ws["path"]).parent == ctx.cluster.roots[ctx.ws["node"]]
    r = await ctx.front.post("/v1/workspaces", json={"name": ctx.ws["id"]})
    assert r.status_code == 409, r.text


@probe("POST", f"{WS}/execute")
@probe("POST", f"{WS}/tool_calls")
async def _execute(ctx: Ctx) -> None:
    for local in (False, True):
        r = await call(ctx, "write_file", local=local, path="a.txt", content="one\n")
        assert r["success"], r
    a, b = await both(ctx, "POST", f"{WS}/execute", json={"tool": "shout", "arguments": {"text": "hi"}})
    assert a.json()["output"] == "HI\n" and norm(ctx, a.json(), frozenset({"duration_ms"})) == norm(
        ctx, b.json(), frozenset({"duration_ms"})
    )
    calls = [{"id": "t1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}]
    a, b = await both(ctx, "POST", f"{WS}/tool_calls", json=calls)
    assert a.status_code == 200 and a.json() == b.json() and "one" in a.json()[0]["content"]


@probe("POST", f"{WS}/execute/stream")
async def _stream(ctx: Ctx) -> None:
    body = {"tool": "shell_execute", "arguments": {"command": "echo one; echo two >&2"}}
    async with ctx.front.stream("POST", ctx.url(f"{WS}/execute/stream"), json=body) as r:
        events = [(e, json.loads(d)) async for e, d in sse(r)]
    assert events[-1][0] == "result" and events[-1][1]["data"]["stdout"] == "one\n", events
    assert [d["text"] for e, d in events if e == "output" and d["stream"] == "stdout"] == ["one\n"]


@probe("GET", f"{WS}/changelog")
@probe("GET", f"{WS}/changelog/{{entry_id}}/members")
@probe("GET", f"{WS}/diff")
@probe("GET", f"{WS}/changelog/diff")
@probe("POST", f"{WS}/undo")
async def _changelog(ctx: Ctx) -> None:
    a, b = await both(ctx, "GET", f"{WS}/changelog")
    drop = frozenset({"ts", "id", "call_id"})
    assert a.status_code == 200 and norm(ctx, a.json(), drop) == norm(ctx, b.json(), drop), (a.text, b.text)
    entry = a.json()[0]["id"]
    r = await ctx.front.get(ctx.url(f"{WS}/changelog/{{entry}}/members", entry=entry))
    assert r.status_code == 200 and r.json() == []
    r = await ctx.front.get(ctx.url(f"{WS}/changelog/{{entry}}/members", entry=10**9))
    assert r.status_code == 404
    a, b = await both(ctx, "GET", f"{WS}/diff")
    assert a.status_code == 200 and a.json() == b.json() and "+one" in a.json()["diff"]
    r = await ctx.front.get(ctx.url(f"{WS}/changelog/diff"), params={"entry": entry})
    assert r.status_code == 200 and "+one" in r.json()["diff"], r.text
    a, b = await both(ctx, "POST", f"{WS}/undo", json={"all": True, "dry_run": True})
    assert a.status_code == 200 and norm(ctx, a.json(), drop) == norm(ctx, b.json(), drop)


@probe("GET", WS)
@probe("PATCH", WS)
@probe("GET", f"{WS}/egress")
async def _settings(ctx: Ctx) -> None:
    a, b = await both(ctx, "PATCH", WS, json={"pids": 300})
    assert a.status_code == 200 and norm(ctx, a.json()) == norm(ctx, b.json())
    a, b = await both(ctx, "PATCH", WS, json={"memory": "lots"})
    assert a.status_code == 422 and a.json() == b.json()  # a refusal on the node answers as here
    a, b = await both(ctx, "GET", WS)
    assert a.status_code == 200 and norm(ctx, a.json()) == norm(ctx, b.json())
    a, b = await both(ctx, "GET", f"{WS}/egress")
    assert a.status_code == 200 and norm(ctx, a.json()) == norm(ctx, b.json())


# -- forwarded to the node's own service -----------------------------------------------------------


@probe("GET", f"{WS}/processes")
@probe("GET", f"{WS}/processes/{{process_id}}/output")
@probe("POST", f"{WS}/processes/{{process_id}}/input")
@probe("POST", f"{WS}/processes/{{process_id}}/kill")
async def _processes(ctx: Ctx) -> None:
    r = await call(ctx, "shell_execute", command="cat; echo done", background=True)
    pid = r["data"]["process_id"]
    listed = (await ctx.front.get(ctx.url(f"{WS}/processes"))).json()["processes"]
    assert [p["id"] for p in listed if p["running"]] == [pid], listed
    r2 = await ctx.front.post(ctx.url(f"{WS}/processes/{{pid}}/input", pid=pid), json={"text": "typed\n", "eof": True})
    assert r2.status_code == 200 and r2.json()["success"], r2.text
    async with ctx.front.stream("GET", ctx.url(f"{WS}/processes/{{pid}}/output", pid=pid), params={"follow": 1}) as s:
        events = [(e, json.loads(d)) async for e, d in sse(s)]
    out = "".join(d["text"] for e, d in events if e == "output")
    assert out == "typed\ndone\n" and events[-1][0] == "exit", events
    r2 = await ctx.front.get(ctx.url(f"{WS}/processes/{{pid}}/output", pid=pid))
    assert r2.status_code == 200 and r2.json()["stdout"] == "typed\ndone\n" and r2.json()["done"]
    r = await call(ctx, "shell_execute", command="sleep 300", background=True)
    r2 = await ctx.front.post(ctx.url(f"{WS}/processes/{{pid}}/kill", pid=r["data"]["process_id"]), json={})
    assert r2.status_code == 200 and r2.json()["success"], r2.text
    r2 = await ctx.front.post(ctx.url(f"{WS}/processes/{{pid}}/kill", pid="nope"), json={})
    assert r2.status_code == 404


@probe("GET", f"{WS}/sandbox")
async def _sandbox(ctx: Ctx) -> None:
    r = await ctx.front.get(ctx.url(f"{WS}/sandbox"))
    body = r.json()
    assert r.status_code == 200 and body["backend"] == "docker" and body["running"] and body["exists"], body
    assert body["image"] == SANDBOX_IMAGE


@probe("POST", f"{WS}/sandbox/exec")
@probe("GET", f"{WS}/sandbox/files")
@probe("PUT", f"{WS}/sandbox/files")
async def _harness(ctx: Ctx) -> None:
    data = bytes(range(256)) * 64  # every byte value, raw both ways
    a, b = await both(ctx, "PUT", f"{WS}/sandbox/files", params={"path": "/tmp/h.bin"}, content=data)
    assert a.status_code == 200 and a.json()["recorded"] is False, a.text
    assert norm(ctx, a.json(), frozenset({"call_id"})) == norm(ctx, b.json(), frozenset({"call_id"}))
    a, b = await both(ctx, "GET", f"{WS}/sandbox/files", params={"path": "/tmp/h.bin"})
    assert a.status_code == 200 and a.content == data == b.content
    body = {"cmd": ["sh", "-c", "wc -c; echo $K; pwd"], "stdin": "aGVsbG8=", "stdin_encoding": "base64"}
    body |= {"env": {"K": "v"}, "cwd": "/tmp"}
    a, b = await both(ctx, "POST", f"{WS}/sandbox/exec", json=body)
    assert a.status_code == 200 and a.json()["stdout"] == "5\nv\n/tmp\n" == b.json()["stdout"], a.text
    a, b = await both(ctx, "GET", f"{WS}/sandbox/files", params={"path": "/nonexistent"})
    assert a.status_code == b.status_code == 404 and a.json() == b.json(), a.text


@probe("GET", f"{WS}/calls")
@probe("GET", f"{WS}/calls/stream")
async def _calls(ctx: Ctx) -> None:
    await both(ctx, "POST", f"{WS}/execute", json={"tool": "read_file", "arguments": {"path": "a.txt"}})
    a, b = await both(ctx, "GET", f"{WS}/calls", params={"limit": 1})
    assert a.status_code == 200, a.text
    drop = frozenset({"cursor", "ts", "started", "duration_ms", "pid", "next", "call_id"})
    assert a.json()["calls"][0]["tool"] == "read_file" and norm(ctx, a.json(), drop) == norm(ctx, b.json(), drop)
    # The live stream: what was, then a call made while it is open; leaving it ends the node's side.
    async with ctx.front.stream("GET", ctx.url(f"{WS}/calls/stream"), params={"after": -1}) as s:
        assert s.status_code == 200
        seen: list[str] = []
        async for _event, data in sse(s):
            tool = json.loads(data)["tool"]
            seen.append(tool)
            if tool == "write_file" and "list_directory" not in seen:
                await call(ctx, "list_directory", path=".")
            if tool == "list_directory":
                break
    assert seen[0] == "write_file" and seen[-1] == "list_directory", seen


@probe("GET", f"{WS}/secrets")
@probe("PUT", f"{WS}/secrets/{{name}}")
@probe("DELETE", f"{WS}/secrets/{{name}}")
async def _secrets(ctx: Ctx) -> None:
    value = "s3cr3t-value-never-shown"
    body = {"value": value, "hosts": ["api.example.com"], "header": "Authorization: Bearer {value}"}
    random = frozenset({"placeholder", "updated"})  # made anew for each secret; when
    a, b = await both(ctx, "PUT", f"{WS}/secrets/API_TOKEN", json=body)
    assert a.status_code == 200 and value not in a.text, a.text
    assert norm(ctx, a.json(), random) == norm(ctx, b.json(), random), (a.json(), b.json())
    a, b = await both(ctx, "GET", f"{WS}/secrets")
    assert a.status_code == 200 and value not in a.text and norm(ctx, a.json(), random) == norm(ctx, b.json(), random)
    assert [s["name"] for s in a.json()["secrets"]] == ["API_TOKEN"]
    a, b = await both(ctx, "PUT", f"{WS}/secrets/OTHER", json={"value": value})
    assert a.status_code == 422 and value not in a.text and a.json() == b.json()
    # The sandbox never sees the value (as on one machine: a placeholder once egress is allowed).
    env = {"tool": "shell_execute", "arguments": {"command": "env"}}
    a, b = await both(ctx, "POST", f"{WS}/execute", json=env)
    assert a.json()["success"] == b.json()["success"] and value not in a.text and value not in b.text
    a, b = await both(ctx, "DELETE", f"{WS}/secrets/API_TOKEN")
    assert a.status_code == 200 and a.json() == b.json()
    r2 = await ctx.front.delete(ctx.url(f"{WS}/secrets/API_TOKEN"))
    assert r2.status_code == 404


@probe("POST", f"{WS}/snapshots")
@probe("GET", f"{WS}/snapshots")
@probe("GET", f"{WS}/snapshots/{{ref}}")
@probe("POST", f"{WS}/fork")
@probe("DELETE", f"{WS}/snapshots/{{ref}}")
@probe("POST", f"{WS}/restore")
@probe("DELETE", WS)
async def _snapshots(ctx: Ctx) -> None:
    r = await ctx.front.post(ctx.url(f"{WS}/snapshots"), json={"name": "first"})
    assert r.status_code == 201, r.text
    snap = r.json()
    assert snap["name"] == "first" and snap["workspace"] == ctx.ws["path"] and snap["files"] >= 1
    listed = (await ctx.front.get(ctx.url(f"{WS}/snapshots"))).json()
    assert [s["id"] for s in listed["snapshots"]] == [snap["id"]] and listed["origin"] is None
    r = await ctx.front.get(ctx.url(f"{WS}/snapshots/first"))
    assert r.status_code == 200 and r.json()["id"] == snap["id"]
    assert (await ctx.front.get(ctx.url(f"{WS}/snapshots/nope"))).status_code == 404

    # A fork: on the source workspace's node (two slots a node: one left for it), a
    # workspace of the cluster.
    r = await ctx.front.post(ctx.url(f"{WS}/fork"), json={"snapshot": "first", "count": 1})
    assert r.status_code == 201, r.text
    forked = r.json()
    assert forked["snapshot"] == snap["id"] and len(forked["workspaces"]) == 1
    listed_ws = {w["id"]: w for w in (await ctx.front.get("/v1/workspaces")).json()}
    for f in forked["workspaces"]:
        assert re.fullmatch(re.escape(ctx.ws["id"]) + r"-[0-9a-f]{6}", f["id"]), f
        assert listed_ws[f["id"]]["node"] == ctx.ws["node"] and listed_ws[f["id"]]["path"] == f["path"]
        assert (Path(f["path"]) / "a.txt").read_text() == "one\n"
        r2 = await ctx.front.get(f"/v1/workspaces/{f['id']}/snapshots")
        assert r2.json()["origin"]["snapshot"] == snap["id"], r2.text
    fork_id = forked["workspaces"][0]["id"]
    r = await ctx.front.post(
        f"/v1/workspaces/{fork_id}/execute", json={"tool": "read_file", "arguments": {"path": "a.txt"}}
    )
    assert r.json()["output"] == "one\n", r.text
    # A full node refuses a fork at once, naming why.
    r = await ctx.front.post(ctx.url(f"{WS}/fork"), json={"snapshot": "first", "count": 1})
    assert r.status_code == 503 and "0 free loom_sandboxes slot(s) for 1 fork(s)" in r.json()["detail"], r.text

    r = await ctx.front.delete(ctx.url(f"{WS}/snapshots/first"))
    assert r.status_code == 409 and sorted(r.json()["forks"]) == sorted(f["path"] for f in forked["workspaces"])
    for f in forked["workspaces"]:
        r = await ctx.front.delete(f"/v1/workspaces/{f['id']}", params={"delete_files": "true"})
        assert r.status_code == 200 and not Path(f["path"]).exists(), r.text

    # Restore: back to the snapshot, recorded; undo reverts it.
    await call(ctx, "write_file", path="a.txt", content="changed\n")
    r = await ctx.front.post(ctx.url(f"{WS}/restore"), json={"snapshot": snap["id"]})
    assert r.status_code == 200 and r.json()["modified"] == ["a.txt"], r.text
    assert (Path(ctx.ws["path"]) / "a.txt").read_text() == "one\n"
    r2 = await ctx.front.post(ctx.url(f"{WS}/undo"), json={"call_id": r.json()["call_id"]})
    assert r2.status_code == 200 and (Path(ctx.ws["path"]) / "a.txt").read_text() == "changed\n"
    r = await ctx.front.delete(ctx.url(f"{WS}/snapshots/{{ref}}", ref=snap["id"]))
    assert r.status_code == 200 and r.json()["deleted"] is True, r.text


@probe("POST", f"{WS}/native/anthropic")
@probe("POST", f"{WS}/native/openai")
async def _native(ctx: Ctx) -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "echo native"}}
    a, b = await both(ctx, "POST", f"{WS}/native/anthropic", json=block)
    assert a.status_code == 200 and a.json() == b.json() and "native" in a.text, a.text
    write = {"tool": "write_file", "arguments": {"path": "b.txt", "content": "b\n"}}
    await both(ctx, "POST", f"{WS}/execute", json=write)
    edit = {"type": "tool_use", "id": "toolu_2", "name": "str_replace_based_edit_tool"}
    edit["input"] = {"command": "view", "path": "b.txt"}
    a, b = await both(ctx, "POST", f"{WS}/native/anthropic", json=edit)
    assert a.status_code == 200 and a.json() == b.json(), a.text
    item = {"type": "shell_call", "call_id": "call_1", "action": {"commands": ["echo hi"]}}
    a, b = await both(ctx, "POST", f"{WS}/native/openai", json=item)
    assert a.status_code == 200 and a.json() == b.json() and a.json()["output"][0]["stdout"] == "hi\n", a.text


@probe("POST", f"{WS}/terminals")
@probe("GET", f"{WS}/terminals")
@probe("GET", f"{WS}/terminals/{{terminal_id}}")
@probe("DELETE", f"{WS}/terminals/{{terminal_id}}")
async def _terminals(ctx: Ctx) -> None:
    r = await ctx.front.post(ctx.url(f"{WS}/terminals"), json={"command": ["sh"], "cols": 90, "rows": 20})
    assert r.status_code == 201 and r.json()["running"] and r.json()["cols"] == 90, r.text
    tid = r.json()["id"]
    listed = (await ctx.front.get(ctx.url(f"{WS}/terminals"))).json()["terminals"]
    assert [t["id"] for t in listed] == [tid], listed
    r = await ctx.front.get(ctx.url(f"{WS}/terminals/{{tid}}", tid=tid))
    assert r.status_code == 200 and r.json()["id"] == tid, r.text
    a, b = await both(ctx, "POST", f"{WS}/terminals", json={"cols": 0})
    assert a.status_code == 422 and a.json() == b.json()
    a, b = await both(ctx, "GET", f"{WS}/terminals/term-000000000000")
    assert a.status_code == 404 and a.json() == b.json()
    r = await ctx.front.delete(ctx.url(f"{WS}/terminals/{{tid}}", tid=tid))
    assert r.status_code == 200 and r.json()["running"] is False, r.text


@probe("POST", f"{WS}/code/contexts")
@probe("GET", f"{WS}/code/contexts")
@probe("POST", f"{WS}/code/contexts/{{context_id}}/restart")
@probe("DELETE", f"{WS}/code/contexts/{{context_id}}")
@probe("POST", f"{WS}/code/execute")
async def _code(ctx: Ctx) -> None:
    # A kernel on the workspace's node: its state kept between executions, the stream whole.
    r = await ctx.front.post(ctx.url(f"{WS}/code/contexts"), json={"language": "python"})
    assert r.status_code == 201 and r.json()["id"].startswith("ctx-"), r.text
    cid = r.json()["id"]
    listed = (await ctx.front.get(ctx.url(f"{WS}/code/contexts"))).json()["contexts"]
    assert cid in [c["id"] for c in listed], listed
    for code, want in (("x = 41", None), ("x + 1", "42")):
        r = await ctx.front.post(ctx.url(f"{WS}/code/execute"), json={"code": code, "context": cid, "timeout": 120})
        assert r.status_code == 200, r.text
        last = json.loads(r.text.strip().splitlines()[-1])
        assert last["type"] == "execution" and last.get("error") is None, last
        if want is not None:
            assert [x.get("text") for x in last["results"] if x.get("is_main_result")] == [want], last
    r = await ctx.front.post(ctx.url(f"{WS}/code/contexts/{{cid}}/restart", cid=cid))
    assert r.status_code == 200 and r.json()["id"] == cid, r.text
    a, b = await both(ctx, "POST", f"{WS}/code/execute", json={"code": 1})
    assert a.status_code == 422 and a.json() == b.json()
    a, b = await both(ctx, "DELETE", f"{WS}/code/contexts/ctx-nope")
    assert a.status_code == 404 and a.json() == b.json()
    r = await ctx.front.delete(ctx.url(f"{WS}/code/contexts/{{cid}}", cid=cid))
    assert r.status_code == 204, r.text


@probe("WEBSOCKET", f"{WS}/terminals/{{terminal_id}}/ws")
async def _terminal_screen(ctx: Ctx) -> None:
    # The WebSocket relayed to the node, message for message: typed into, resized, exited.
    r = await ctx.front.post(ctx.url(f"{WS}/terminals"), json={"command": ["sh"], "cols": 80, "rows": 24})
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    base = str(ctx.front.base_url).rstrip("/").replace("http", "ws", 1)
    url = base + ctx.url(f"{WS}/terminals/{{tid}}/ws", tid=tid)
    async with await wsclient.connect(url, subprotocols=["loom.bearer.eA", "loom.terminal.v1"], headers=AUTH) as ws:
        assert ws.subprotocol == "loom.terminal.v1"
        attached = await ws.receive_json()
        assert attached == {"type": "attached", "id": tid, "cursor": 0, "dropped": 0, "cols": 80, "rows": 24}
        await ws.send_bytes(b"echo h''i\r")
        await read_until(ws, b"hi\r\n")
        await ws.send_json({"type": "resize", "cols": 90, "rows": 30})
        await ws.send_bytes(b"stty size\r")
        await read_until(ws, b"30 90\r\n")
        await ws.send_text("not json")
        assert (await next_text(ws))["type"] == "error"
        await ws.send_bytes(b"exit 3\r")
        assert await next_text(ws) == {"type": "exit", "exit_code": 3, "outcome": "exit", "signal": None}
        with pytest.raises(wsclient.Closed) as closed:
            await ws.receive()
        assert closed.value.code == 1000
    # Reattached through the front door: the scrollback replayed.
    async with await wsclient.connect(url, subprotocols=["loom.terminal.v1"], headers=AUTH) as ws:
        assert (await ws.receive_json())["type"] == "attached"
        assert b"hi\r\n" in await read_until(ws, b"30 90")
    # Refusals are the route's own: closed 4404 with why.
    for gone in (ctx.url(f"{WS}/terminals/term-000000000000/ws"), "/v1/workspaces/nope/terminals/t/ws"):
        async with await wsclient.connect(base + gone, subprotocols=["loom.terminal.v1"], headers=AUTH) as ws:
            with pytest.raises(wsclient.Closed) as closed:
                await ws.receive()
            assert closed.value.code == 4404 and closed.value.reason, gone


@probe("*", f"{WS}/ports/{{port:int}}")
@probe("*", f"{WS}/ports/{{port:int}}/{{path:path}}")
async def _ports(ctx: Ctx) -> None:
    r = await call(ctx, "shell_execute", command="python3 -m http.server 8777 --bind 127.0.0.1", background=True)
    assert r["success"], r
    ready = "for i in $(seq 100); do curl -sf http://127.0.0.1:8777/ >/dev/null && exit 0; sleep 0.1; done; exit 1"
    assert (await call(ctx, "shell_execute", command=ready))["success"]
    r2 = await ctx.front.get(ctx.url(f"{WS}/ports/8777"))
    assert r2.status_code == 308, r2.text
    r2 = await ctx.front.get(ctx.url(f"{WS}/ports/8777/a.txt"))
    assert r2.status_code == 200 and r2.text == "changed\n", r2.text


@probe("WEBSOCKET", f"{WS}/ports/{{port:int}}")
@probe("WEBSOCKET", f"{WS}/ports/{{port:int}}/{{path:path}}")
async def _ports_websocket(ctx: Ctx) -> None:
    # The port proxy's WebSockets stay at the front door, through a tunnel to the sandbox.
    echo = (Path(__file__).parents[1] / "wsecho.py").read_text()
    assert (await call(ctx, "write_file", path="wsecho.py", content=echo))["success"]
    r = await call(ctx, "shell_execute", command="python3 wsecho.py 8778", background=True)
    assert r["success"], r
    ready = "for i in $(seq 100); do curl -sf http://127.0.0.1:8778/ >/dev/null && exit 0; sleep 0.1; done; exit 1"
    assert (await call(ctx, "shell_execute", command=ready))["success"]
    base = str(ctx.front.base_url).rstrip("/").replace("http", "ws", 1)
    for path in (f"{WS}/ports/8778", f"{WS}/ports/8778/chat"):
        async with await wsclient.connect(base + ctx.url(path), subprotocols=["echo.v1"], headers=AUTH) as ws:
            assert ws.subprotocol == "echo.v1"
            await ws.send_text("hello")
            assert await ws.receive() == "hello", path


@probe("*", f"{WS}/mcp")
async def _mcp(ctx: Ctx) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    url = str(ctx.front.base_url).rstrip("/") + ctx.url(f"{WS}/mcp")
    async with (
        httpx2.AsyncClient(headers=AUTH, timeout=120) as http,
        Client(streamable_http_client(url, http_client=http)) as c,
    ):
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"shout", "tool_search", "read_file"} <= names, names
        r = await c.call_tool("shout", {"text": "mcp"})
        assert r.is_error is False and "MCP" in str(r.content)


# -- refused, by name ------------------------------------------------------------------------------


@pytest.fixture
async def ctx(ray_cluster: RayCluster, tmp_path: Path) -> AsyncIterator[Ctx]:
    from worker.http import create_app
    from worker.integrations.ray.cli import front_door
    from worker.settings import Settings

    common = {
        "api_token": TOKEN,
        "catalog": True,
        "tools_dir": ray_cluster.root / "tools",
        "image": SANDBOX_IMAGE,
    }
    door = front_door(Settings(data_dir=tmp_path / "front", **common), ray_cluster.address, NAMESPACE)
    root = tmp_path / "local-ws"
    root.mkdir()
    local = create_app(Settings(data_dir=tmp_path / "local", workspace_root=root, uid=1000, gid=1000, **common))
    async with (
        serve_app(door) as front_url,
        serve_app(local) as local_url,
        httpx.AsyncClient(base_url=front_url, headers=AUTH, timeout=120) as front,
        httpx.AsyncClient(base_url=local_url, headers=AUTH, timeout=120) as loc,
    ):
        r = await front.post("/v1/workspaces", json={})
        assert r.status_code == 201, r.text
        r2 = await loc.post("/v1/workspaces", json={"name": r.json()["id"]})
        assert r2.status_code == 201, r2.text
        c = Ctx(front, loc, ray_cluster, r.json(), r2.json())
        try:
            yield c
        finally:
            await front.delete(f"/v1/workspaces/{c.ws['id']}", params={"delete_files": "true"})
            await loc.delete(f"/v1/workspaces/{c.lws['id']}", params={"delete_files": "true"})


async def test_every_route_works_through_the_front_door_or_is_refused_by_name(ctx: Ctx) -> None:
    from worker.http import create_app
    from worker.http.app import route_table
    from worker.integrations.ray.forward import REFUSED
    from worker.settings import Settings

    routes = set()
    for route in route_table(create_app(Settings())):
        if isinstance(route, WebSocketRoute):
            routes.add(("WEBSOCKET", route.path))
            continue
        methods = sorted(getattr(route, "methods", None) or ["*"])
        for m in methods:
            if m != "HEAD":
                routes.add((m, str(getattr(route, "path", route))))
    assert routes - set(PROBES) - set(REFUSED) == set(), "routes without a probe (or a refusal) here"
    assert set(PROBES) & set(REFUSED) == set()

    for (method, path), why in REFUSED.items():
        r = await ctx.front.request(method, path.format(name="X"), json={"value": "v", "hosts": ["h"]})
        assert r.status_code == 501 and r.json()["detail"] == f"Not served by a cluster's front door: {why}"

    done: set[Probe] = set()
    for key, fn in PROBES.items():  # in the order written above (later probes build on earlier ones)
        if fn not in done:
            done.add(fn)
            try:
                await fn(ctx)
            except AssertionError as e:
                raise AssertionError(f"{key}: {e}") from e
