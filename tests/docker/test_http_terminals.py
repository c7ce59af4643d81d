"""The terminal routes and their WebSocket on the real engine, under runc and gVisor: the
service (uvicorn on a free port, a token) opens a login shell in the workspace's sandbox;
a WebSocket client types ``echo hi``, sees ``hi``, resizes and reads the size back from
``stty size``, and ``exit 3`` ends it with an exit frame; a terminal a client left goes on
and a new client sees its output replayed; what a terminal changes is on disk. The
protocol's corners on the local backend: tests/unit/test_http_terminals.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests import wsclient
from tests.docker.conftest import require_runtime, served
from tests.unit.test_http_terminals import next_text, read_until
from worker.http.terminals import PROTOCOL

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

TOKEN = "terminals-docker-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "/v1/workspaces/w/terminals"


@dataclass
class Svc:
    api: httpx.AsyncClient
    workspace: Path

    async def connect(self, tid: str) -> wsclient.WebSocket:
        url = str(self.api.base_url).rstrip("/").replace("http", "ws", 1) + f"{BASE}/{tid}/ws"
        return await wsclient.connect(url, subprotocols=[PROTOCOL], headers=AUTH)


@pytest.fixture(params=["runc", "runsc"])
async def service(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[Svc]:
    """The service on ``runtime``, its workspace ``w`` owned by uid 1000; its sandboxes
    stopped with it (its lifespan)."""
    runtime = str(request.param)
    require_runtime(runtime)
    async with served(tmp_path, TOKEN, runtime=runtime) as c:
        yield Svc(c, tmp_path / "root" / "w")


async def test_a_login_shell_typed_into_resized_and_exited(service: Svc) -> None:
    r = await service.api.post(BASE, json={"cols": 80, "rows": 24})
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["running"] and t["command"], t  # the sandbox user's login shell
    async with await service.connect(t["id"]) as ws:
        assert ws.subprotocol == PROTOCOL
        attached = await ws.receive_json()
        assert attached["type"] == "attached" and (attached["cols"], attached["rows"]) == (80, 24)
        await ws.send_bytes(b"echo h''i; id -u\r")
        out = await read_until(ws, b"hi\r\n1000\r\n", timeout=60)  # (the workspace's owner)
        await ws.send_json({"type": "resize", "cols": 101, "rows": 33})
        await ws.send_bytes(b"stty size; echo made > from-terminal.txt\r")
        out = await read_until(ws, b"33 101\r\n")
        await ws.send_bytes(b"exit 3\r")
        assert await next_text(ws, timeout=60) == {"type": "exit", "exit_code": 3, "outcome": "exit", "signal": None}
        with pytest.raises(wsclient.Closed) as closed:
            await ws.receive()
        assert closed.value.code == 1000, out
    assert (service.workspace / "from-terminal.txt").read_text() == "made\n"
    info = (await service.api.get(f"{BASE}/{t['id']}")).json()
    assert (info["running"], info["exit_code"], info["cols"], info["rows"]) == (False, 3, 101, 33)


async def test_a_terminal_goes_on_without_a_client_and_replays_to_the_next(service: Svc) -> None:
    t = (await service.api.post(BASE, json={"command": ["bash", "--norc"]})).json()
    ws = await service.connect(t["id"])
    await ws.receive_json()
    await ws.send_bytes(b"for i in 1 2 3; do echo line-$i; done; sleep 1; echo later\r")
    await read_until(ws, b"line-3")
    await ws.close()  # detached before "later" is printed
    await asyncio.sleep(2)
    assert (await service.api.get(f"{BASE}/{t['id']}")).json()["running"]
    async with await service.connect(t["id"]) as again:
        attached = await again.receive_json()
        assert attached["cursor"] == 0 and attached["dropped"] == 0
        replay = await read_until(again, b"later\r\n")
        assert b"line-1\r\nline-2\r\nline-3\r\n" in replay  # what it printed while nobody watched, too
    r = await service.api.delete(f"{BASE}/{t['id']}")
    assert r.status_code == 200 and r.json()["running"] is False, r.text
    async with await service.connect("term-000000000000") as gone:
        with pytest.raises(wsclient.Closed) as closed:
            await gone.receive()
        assert closed.value.code == 4404
