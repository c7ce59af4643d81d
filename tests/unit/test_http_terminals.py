"""The terminal routes and the WebSocket's protocol (``worker.http.terminals``), over a
real connection (uvicorn on a free port) to the agent run as a host process (the local
backend: the same agent and supervisor as in a container, no isolation). The same round
trip on the real engine, under runc and gVisor: tests/docker/test_http_terminals.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import wsclient
from tests.servers import serve_app
from worker.http import create_app
from worker.http.terminals import MAX_INPUT, PROTOCOL, _reason
from worker.registry import ToolRegistry
from worker.settings import Settings

pytestmark = pytest.mark.timeout(120)

TOKEN = "terminal-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "/v1/workspaces/w1/terminals"


@dataclass
class Svc:
    url: str
    api: httpx.AsyncClient

    async def open(self, **body: Any) -> dict[str, Any]:
        r = await self.api.post(BASE, json={"command": ["sh"], **body})
        assert r.status_code == 201, r.text
        out: dict[str, Any] = r.json()
        return out

    async def connect(self, tid: str, query: str = "", **kwargs: Any) -> wsclient.WebSocket:
        kwargs.setdefault("subprotocols", [PROTOCOL])
        kwargs.setdefault("headers", AUTH)
        return await wsclient.connect(f"{self.url.replace('http', 'ws', 1)}{BASE}/{tid}/ws{query}", **kwargs)


@pytest.fixture
async def svc(tmp_path: Path, local_backend: Any) -> AsyncIterator[Svc]:
    app = create_app(Settings(workspace_root=tmp_path / "root", api_token=TOKEN), ToolRegistry(backend=local_backend))
    async with serve_app(app) as url, httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as api:
        r = await api.post("/v1/workspaces", json={"name": "w1"})
        assert r.status_code == 201, r.text
        s = Svc(url, api)
        yield s
        for t in (await api.get(BASE)).json()["terminals"]:
            if t["running"]:
                await api.delete(f"{BASE}/{t['id']}")


async def read_until(ws: wsclient.WebSocket, needle: bytes, *, timeout: float = 20) -> bytes:
    """The output (binary frames) until it holds ``needle``; text frames are skipped (and
    shown if it never comes: an error frame says why)."""
    seen = b""
    texts: list[str] = []

    async def loop() -> bytes:
        nonlocal seen
        while needle not in seen:
            m = await ws.receive()
            if isinstance(m, bytes):
                seen += m
            else:
                texts.append(m)
        return seen

    try:
        return await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"{needle!r} never came; the output was {seen!r}; text frames: {texts!r}") from None


async def next_text(ws: wsclient.WebSocket, *, timeout: float = 20) -> dict[str, Any]:
    """The next text frame (output frames before it are skipped)."""

    async def loop() -> dict[str, Any]:
        while True:
            m = await ws.receive()
            if isinstance(m, str):
                out: dict[str, Any] = json.loads(m)
                return out

    return await asyncio.wait_for(loop(), timeout)


# -- the routes -----------------------------------------------------------------------------


async def test_open_list_get_and_kill(svc: Svc) -> None:
    t = await svc.open(cols=100, rows=30, env={"GREETING": "hello"})
    assert t["id"].startswith("term-") and t["running"] and (t["cols"], t["rows"]) == (100, 30)
    assert t["command"] == "sh" and t["exit_code"] is None
    shell = await svc.open(command=None)  # the login shell
    listed = (await svc.api.get(BASE)).json()["terminals"]
    assert [x["id"] for x in listed] == [t["id"], shell["id"]]  # oldest first
    one = (await svc.api.get(f"{BASE}/{t['id']}")).json()
    assert one["id"] == t["id"] and one["running"]
    r = await svc.api.delete(f"{BASE}/{t['id']}")
    assert r.status_code == 200 and not r.json()["running"] and r.json()["outcome"] == "signal", r.text
    assert (await svc.api.get(f"{BASE}/{t['id']}")).json()["running"] is False  # listed while it lingers


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cols": 0}, "cols"),
        ({"rows": 1001}, "rows"),
        ({"cols": "80"}, "cols"),  # strict: a number, not a string of one
        ({"rows": 2.5}, "rows"),
        ({"command": []}, "command"),
        ({"cwd": ""}, "cwd"),
        ({"shell": True}, "shell"),  # an unknown field
        ({"env": {"A=B": "1"}}, "env"),  # the agent would drop it: the caller is told
        ({"env": {"": "1"}}, "env"),
        ({"env": {"A": "x\x00y"}}, "env"),
    ],
)
async def test_a_bad_body_is_a_422_naming_the_field(svc: Svc, body: dict[str, Any], field: str) -> None:
    r = await svc.api.post(BASE, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", field], r.text


async def test_unknown_terminals_and_workspaces_are_404(svc: Svc) -> None:
    for method in ("GET", "DELETE"):
        r = await svc.api.request(method, f"{BASE}/term-000000000000")
        assert r.status_code == 404, (method, r.text)
    assert (await svc.api.get("/v1/workspaces/nope/terminals")).status_code == 404
    r = await svc.api.post(BASE, json={"command": ["sh"], "cwd": "no/such/dir"})
    assert r.status_code == 404 and r.json()["error"] == "not_found", r.text


# -- the WebSocket --------------------------------------------------------------------------


async def test_a_round_trip_input_resize_and_exit(svc: Svc) -> None:
    t = await svc.open(cols=80, rows=24)
    async with await svc.connect(t["id"]) as ws:
        assert ws.subprotocol == PROTOCOL
        attached = await ws.receive_json()
        assert attached == {"type": "attached", "id": t["id"], "cursor": 0, "dropped": 0, "cols": 80, "rows": 24}
        await ws.send_bytes(b"echo h''i\r")
        await read_until(ws, b"hi\r\n")
        await ws.send_json({"type": "resize", "cols": 132, "rows": 43})
        await ws.send_json({"type": "input", "data": "stty size\r"})
        await read_until(ws, b"43 132")
        await ws.send_bytes(b"exit 3\r")
        assert await next_text(ws) == {"type": "exit", "exit_code": 3, "outcome": "exit", "signal": None}
        with pytest.raises(wsclient.Closed) as closed:
            await ws.receive()
        assert closed.value.code == 1000
    info = (await svc.api.get(f"{BASE}/{t['id']}")).json()
    assert info["exit_code"] == 3 and (info["cols"], info["rows"]) == (132, 43)


async def test_a_client_leaving_detaches_and_a_reattach_replays(svc: Svc) -> None:
    t = await svc.open()
    ws = await svc.connect(t["id"])
    await ws.receive_json()
    await ws.send_bytes(b"echo one$((1+1))\r")
    await read_until(ws, b"one2")
    await ws.close()
    await asyncio.sleep(0.3)
    assert (await svc.api.get(f"{BASE}/{t['id']}")).json()["running"]  # it goes on
    await svc.api.post(  # (a change meanwhile: the scrollback holds what it printed)
        "/v1/workspaces/w1/execute", json={"tool": "shell_execute", "arguments": {"command": "true"}}
    )
    async with await svc.connect(t["id"]) as ws:
        attached = await ws.receive_json()
        assert attached["cursor"] == 0 and attached["dropped"] == 0
        replay = await read_until(ws, b"one2")
        await ws.send_bytes(b"echo three\r")
        await read_until(ws, b"three\r\n")
        cursor = attached["cursor"] + len(replay)
    # Resuming from a cursor sends only what came after it.
    async with await svc.connect(t["id"], f"?since={cursor}") as ws:
        attached = await ws.receive_json()
        assert attached["cursor"] == cursor
        after = await read_until(ws, b"three\r\n")
        assert b"one2" not in after


async def test_several_clients_see_the_same_screen(svc: Svc) -> None:
    t = await svc.open()
    async with await svc.connect(t["id"]) as a, await svc.connect(t["id"]) as b:
        await a.receive_json()
        await b.receive_json()
        await a.send_bytes(b"echo from-a\r")
        await read_until(a, b"from-a\r\n")
        await read_until(b, b"from-a\r\n")


async def test_a_signal_reaches_the_foreground_program(svc: Svc) -> None:
    t = await svc.open()
    async with await svc.connect(t["id"]) as ws:
        await ws.receive_json()
        await ws.send_bytes(b"sleep 100\r")
        await asyncio.sleep(0.5)
        await ws.send_json({"type": "signal", "signal": "INT"})  # as Ctrl-C: to the sleep, not the shell
        await ws.send_bytes(b"echo after-$?\r")
        await read_until(ws, b"after-130")
        await ws.send_bytes(b"sleep 100\r")
        await asyncio.sleep(0.5)
        await ws.send_json({"type": "signal", "signal": 15})  # by number: TERM
        await ws.send_bytes(b"echo again-$?\r")
        await read_until(ws, b"again-143")


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ("not json", "JSON"),
        ("[1, 2]", "unknown message type"),
        ('{"type": "paste"}', "unknown message type 'paste'"),
        ('{"type": "resize", "cols": 0, "rows": 10}', "cols must be an integer 1-1000"),
        ('{"type": "resize", "cols": 80, "rows": true}', "rows must be an integer"),
        ('{"type": "resize", "cols": 80}', "rows must be an integer"),
        ('{"type": "signal", "signal": "NOPE"}', "not a signal"),
        ('{"type": "signal", "signal": 0}', "not a signal"),
        ('{"type": "input", "data": 5}', "data must be a string"),
        ("[" * 100_000, "JSON"),  # nested past the parser's depth (a RecursionError)
        # under 1 MiB of characters, 1.2 MB of bytes
        (json.dumps({"type": "input", "data": "\u20ac" * 400_000}, ensure_ascii=False), "at most"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else v,
)
async def test_a_malformed_message_is_answered_and_the_connection_stays(svc: Svc, message: str, says: str) -> None:
    t = await svc.open()
    async with await svc.connect(t["id"]) as ws:
        await ws.receive_json()
        await ws.send_text(message)
        error = await next_text(ws)
        assert error["type"] == "error" and says in error["message"], error
        await ws.send_bytes(b"echo still-here\r")
        await read_until(ws, b"still-here\r\n")


async def test_too_large_an_input_is_refused_in_an_error_frame(svc: Svc) -> None:
    t = await svc.open()
    async with await svc.connect(t["id"]) as ws:
        await ws.receive_json()
        await ws.send_bytes(b"x" * (MAX_INPUT + 1))
        error = await next_text(ws)
        assert error["type"] == "error" and "at most" in error["message"], error


async def test_a_refusal_is_a_close_4000_plus_the_status_with_why(svc: Svc) -> None:
    t = await svc.open()
    for url, code in [
        (f"{BASE}/term-000000000000/ws", 4404),
        (f"{BASE}/not.an.id/ws", 4404),
        ("/v1/workspaces/nope/terminals/term-1/ws", 4404),
        ("/v1/workspaces/-bad-/terminals/term-1/ws", 4422),
        (f"{BASE}/{t['id']}/ws?since=-1", 4422),
        (f"{BASE}/{t['id']}/ws?since=x", 4422),
    ]:
        ws = await wsclient.connect(svc.url.replace("http", "ws", 1) + url, subprotocols=[PROTOCOL], headers=AUTH)
        assert ws.subprotocol == PROTOCOL  # (accepted, so that the client reads why)
        with pytest.raises(wsclient.Closed) as closed:
            await ws.receive()
        await ws.close()
        assert closed.value.code == code, (url, closed.value)
        assert closed.value.reason, url


async def test_the_bearer_subprotocol_is_never_echoed(svc: Svc) -> None:
    t = await svc.open()
    async with await svc.connect(t["id"], subprotocols=["loom.bearer.c2VjcmV0", PROTOCOL]) as ws:
        assert ws.subprotocol == PROTOCOL
    async with await svc.connect(t["id"], subprotocols=["loom.bearer.c2VjcmV0"]) as ws:
        assert ws.subprotocol is None  # (a client that offers only a credential gets no subprotocol)
    async with await svc.connect(t["id"], subprotocols=[]) as ws:
        assert ws.subprotocol is None and (await ws.receive_json())["type"] == "attached"


def test_a_close_reason_fits_a_control_frame() -> None:
    assert _reason("short") == "short"
    long = "é" * 100  # 200 bytes
    cut = _reason(long)
    assert len(cut.encode()) <= 123 and cut.endswith("...")
