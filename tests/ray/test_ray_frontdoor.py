"""The HTTP front door on the cluster (``loom-worker serve --ray``: the same app, its
workspaces on the nodes): create, execute, stream, the changelog and the port proxy, for
workspaces on different nodes."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import serve_app
from tests.unit.test_http_stream_ports import sse

from .conftest import NAMESPACE, RayCluster

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

TOKEN = "ray-front-door-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
APP_PORT = 8765
#: A small server for the sandbox: GET answers its path; POST the sha256 of the body.
APP = r"""
import hashlib, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def _send(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._send(("%s at %s\n" % (sys.argv[2], self.path)).encode())
    def do_POST(self):
        n = int(self.headers["Content-Length"])
        self._send(hashlib.sha256(self.rfile.read(n)).hexdigest().encode())

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
async def front_door(ray_cluster: RayCluster, tmp_path: Path) -> AsyncIterator[str]:
    """``loom-worker serve --ray``'s app, served on loopback; its base URL."""
    from worker.integrations.ray.cli import front_door as make
    from worker.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", api_token=TOKEN, catalog=False)
    async with serve_app(make(settings, ray_cluster.address, NAMESPACE)) as url:
        yield url


async def _call(c: httpx.AsyncClient, ws: str, tool: str, **args: Any) -> dict[str, Any]:
    r = await c.post(f"/v1/workspaces/{ws}/execute", json={"tool": tool, "arguments": args}, headers=AUTH)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def test_create_execute_stream_and_the_port_proxy_on_different_nodes(
    ray_cluster: RayCluster, front_door: str
) -> None:
    async with httpx.AsyncClient(base_url=front_door, timeout=120) as c:
        made = []
        for _ in range(3):
            r = await c.post("/v1/workspaces", json={}, headers=AUTH)
            assert r.status_code == 201, r.text
            made.append(r.json())
        try:
            nodes = {w["node"] for w in made}
            assert len(nodes) >= 2, made  # two slots a node: three workspaces need two nodes
            for w in made:
                assert w["state"] == "ready" and Path(w["path"]).parent == ray_cluster.roots[w["node"]], w
            listed = {w["id"]: w for w in (await c.get("/v1/workspaces", headers=AUTH)).json()}
            assert {k: listed[k] for k in (w["id"] for w in made)} == {w["id"]: w for w in made}

            # Two workspaces on two nodes, each serving its own app on the same port.
            a = made[0]
            b = next(w for w in made if w["node"] != a["node"])
            for w in (a, b):
                await _check_workspace(c, w)
        finally:
            for w in made:
                r = await c.delete(f"/v1/workspaces/{w['id']}", params={"delete_files": "true"}, headers=AUTH)
                assert r.status_code == 200 and r.json()["files_deleted"] is True, r.text
                assert not Path(w["path"]).exists()
        assert (await c.get(f"/v1/workspaces/{made[0]['id']}/changelog", headers=AUTH)).status_code == 404


async def _check_workspace(c: httpx.AsyncClient, w: dict[str, Any]) -> None:
    ws = w["id"]
    r = await _call(c, ws, "write_file", path="app.py", content=APP)
    assert r["success"] and (Path(w["path"]) / "app.py").read_text() == APP, r
    r = await _call(c, ws, "shell_execute", command=f"python3 app.py {APP_PORT} {ws}", background=True)
    assert r["success"] and r["data"]["running"], r
    r = await _call(
        c,
        ws,
        "shell_execute",
        command=f"for i in $(seq 100); do curl -sf http://127.0.0.1:{APP_PORT}/up && exit 0; sleep 0.1; done; exit 1",
    )
    assert r["success"] and r["output"] == f"{ws} at /up\n", r

    # The port proxy reaches the app in that workspace's sandbox, on its node.
    prefix = f"/v1/workspaces/{ws}/ports/{APP_PORT}"
    r2 = await c.get(f"{prefix}/page?q=1", headers=AUTH)
    assert r2.status_code == 200 and r2.text == f"{ws} at /page?q=1\n", r2.text
    body = os.urandom(1 << 20)
    r2 = await c.post(f"{prefix}/upload", content=body, headers=AUTH)
    assert r2.status_code == 200 and r2.text == hashlib.sha256(body).hexdigest()
    r2 = await c.get(f"/v1/workspaces/{ws}/ports/{APP_PORT + 1}/", headers=AUTH)
    assert r2.status_code == 502 and "Nothing listens" in r2.json()["detail"], r2.text

    # A stream: the output events in order, then the result.
    events = []
    async with c.stream(
        "POST",
        f"/v1/workspaces/{ws}/execute/stream",
        json={"tool": "shell_execute", "arguments": {"command": "echo one; echo two >&2; echo three"}},
        headers=AUTH,
    ) as resp:
        assert resp.status_code == 200
        async for event, data in sse(resp):
            events.append((event, json.loads(data)))
    assert [e for e, _ in events][-1] == "result" and events[-1][1]["data"]["stdout"] == "one\nthree\n", events
    out = "".join(d["text"] for e, d in events if e == "output" and d["stream"] == "stdout")
    assert out == "one\nthree\n", events

    # The changelog, undo and settings: on the node.
    r3 = await c.get(f"/v1/workspaces/{ws}/changelog", headers=AUTH)
    assert r3.status_code == 200 and [e["path"] for e in r3.json()] == ["app.py"], r3.text
    r3 = await c.patch(f"/v1/workspaces/{ws}", json={"pids": 200}, headers=AUTH)
    assert r3.status_code == 200, r3.text
    r3 = await c.get(f"/v1/workspaces/{ws}", headers=AUTH)
    assert r3.status_code == 200 and r3.json()["settings"] == {"pids": 200} and r3.json()["path"] == w["path"]
    r3 = await c.post(f"/v1/workspaces/{ws}/undo", json={"all": True}, headers=AUTH)
    assert r3.status_code == 200 and not (Path(w["path"]) / "app.py").exists(), r3.text


async def test_mcp_through_the_front_door_runs_on_the_node(ray_cluster: RayCluster, front_door: str) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from tests.unit.mcp_session import play

    async with httpx.AsyncClient(base_url=front_door, timeout=120) as c:
        r = await c.post("/v1/workspaces", json={"name": "mcp-ws"}, headers=AUTH)
        assert r.status_code == 201, r.text
        w = r.json()
        try:
            async with (
                httpx2.AsyncClient(headers=AUTH, timeout=120) as http,
                Client(streamable_http_client(f"{front_door}/v1/workspaces/mcp-ws/mcp", http_client=http)) as client,
            ):
                await play(client, Path(w["path"]))  # the files land in that node's workspace root
            assert Path(w["path"]).parent == ray_cluster.roots[w["node"]]
        finally:
            r = await c.delete("/v1/workspaces/mcp-ws", params={"delete_files": "true"}, headers=AUTH)
            assert r.status_code == 200, r.text


async def test_loom_worker_serve_with_ray_is_that_front_door(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """The command itself: ``loom-worker serve --ray ADDRESS`` (a process of its own)."""
    import asyncio
    import signal
    import subprocess
    import sys

    from tests.servers import free_port

    port = free_port()
    env = {
        **os.environ,
        "LOOM_API_TOKEN": TOKEN,
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_LOG_LEVEL": "warning",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    argv = [sys.executable, "-m", "worker.cli", "serve", "--ray", ray_cluster.address, "--ray-namespace", NAMESPACE]
    p = await asyncio.create_subprocess_exec(
        *argv, "--port", str(port), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            for _ in range(600):  # its start: bounded by the test's timeout
                try:
                    if (await c.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    assert p.returncode is None, (await p.communicate())[1][-3000:]
                await asyncio.sleep(0.1)
            r = await c.post("/v1/workspaces", json={"name": "from-the-cli"}, headers=AUTH)
            assert r.status_code == 201, r.text
            w = r.json()
            assert w["state"] == "ready" and Path(w["path"]).parent == ray_cluster.roots[w["node"]], w
            assert (await _call(c, "from-the-cli", "shell_execute", command="echo hi"))["output"] == "hi\n"
            r = await c.delete("/v1/workspaces/from-the-cli", params={"delete_files": "true"}, headers=AUTH)
            assert r.status_code == 200, r.text
    finally:
        p.send_signal(signal.SIGINT)
        _out, err = await asyncio.wait_for(p.communicate(), 120)
    assert p.returncode == 0, err[-3000:]
