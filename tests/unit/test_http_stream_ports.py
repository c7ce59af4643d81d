"""The service's streaming routes against a real uvicorn on loopback (the local backend:
the agent runs on this host, so "the sandbox's loopback" is this host's here):
``POST .../execute/stream`` (SSE), the port proxy ``.../ports/{port}/...``, and MCP
progress notifications over streamable HTTP with the official client."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.servers import free_port, serve_app
from worker.http import create_app
from worker.registry import ToolRegistry
from worker.settings import Settings

TOKEN = "stream-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def serving(root: Path, backend: Any, **overrides: Any) -> AsyncIterator[str]:
    settings = Settings(workspace_root=root, **{"api_token": TOKEN, **overrides})
    app = create_app(settings, ToolRegistry(backend=backend))
    async with serve_app(app) as url:
        yield url


@pytest.fixture
async def base_url(tmp_path: Path, local_backend: Any) -> AsyncIterator[str]:
    async with serving(tmp_path / "root", local_backend) as url:
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as c:
            assert (await c.post("/v1/workspaces", json={"name": "w"})).status_code == 201
        yield url


async def sse(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a Server-Sent Events body, as they arrive."""
    event, data = "message", []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


# -- POST .../execute/stream -----------------------------------------------------------------


async def test_execute_stream_sends_output_before_the_command_ends(base_url: str, tmp_path: Path) -> None:
    ws = tmp_path / "root" / "w"
    events: list[tuple[str, Any]] = []
    before_sleep_ended = None
    body = {"tool": "shell_execute", "arguments": {"command": "echo first; sleep 2; touch slept; echo err >&2"}}
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        async with c.stream("POST", "/v1/workspaces/w/execute/stream", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            async for event, data in sse(r):
                if event == "output" and before_sleep_ended is None:
                    before_sleep_ended = not (ws / "slept").exists()
                events.append((event, json.loads(data)))
        plain = (await c.post("/v1/workspaces/w/execute", json=body)).json()
    assert before_sleep_ended is True
    assert events[0] == ("output", {"stream": "stdout", "text": "first\n"})
    assert events[1] == ("output", {"stream": "stderr", "text": "err\n"})
    assert [e for e, _ in events] == ["output", "output", "result"]
    result = events[2][1]
    assert set(result) == set(plain) and result["success"] and result["output"] == plain["output"]


async def test_execute_stream_of_other_tools_failures_and_refusals(base_url: str, tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        body = {"tool": "list_directory", "arguments": {}}
        async with c.stream("POST", "/v1/workspaces/w/execute/stream", json=body) as r:
            events = [(e, json.loads(d)) for e, d in [x async for x in sse(r)]]
        assert [e for e, _ in events] == ["result"] and events[0][1]["success"]
        body = {"tool": "shell_execute", "arguments": {"command": "printf '\\377'; exit 7"}}
        async with c.stream("POST", "/v1/workspaces/w/execute/stream", json=body) as r:
            events = [(e, json.loads(d)) for e, d in [x async for x in sse(r)]]
        assert events[0] == ("output", {"stream": "stdout", "text": "\ufffd"})
        assert events[-1][1]["success"] is False and events[-1][1]["data"]["exit_code"] == 7
        r = await c.post("/v1/workspaces/nope/execute/stream", json=body)
        assert r.status_code == 404
        r = await c.post("/v1/workspaces/w/execute/stream", json={"tool": "shell_execute", "argumnts": {}})
        assert r.status_code == 422 and "argumnts" in r.text
        r = await c.post("/v1/workspaces/w/execute/stream", json=body, headers={"Authorization": "Bearer x"})
        assert r.status_code == 401


async def test_execute_stream_is_429_when_the_service_is_full(tmp_path: Path, local_backend: Any) -> None:
    async with serving(tmp_path / "root", local_backend, max_concurrent_calls=1) as url:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as c:
            await c.post("/v1/workspaces", json={"name": "w"})
            body = {"tool": "shell_execute", "arguments": {"command": "echo on; sleep 1"}}
            async with c.stream("POST", "/v1/workspaces/w/execute/stream", json=body) as r:
                async for event, _ in sse(r):
                    assert event == "output"  # the call runs and holds the only slot
                    busy = await c.post("/v1/workspaces/w/execute/stream", json=body)
                    assert busy.status_code == 429
                    break
            # The client left: the call still ends and gives its slot back.
            for _ in range(100):
                r = await c.post("/v1/workspaces/w/execute", json={"tool": "list_directory", "arguments": {}})
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert r.status_code == 200


# -- the port proxy ------------------------------------------------------------------------------


class _App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/slow"):
            # Chunks over time: the proxy passes each one on as it comes.
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"one\n", b"two\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
                self.server.gate.wait(10)  # type: ignore[attr-defined]
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.endswith("/sw.js"):
            self._reply(200, b"self.onfetch = () => {};", {"Service-Worker-Allowed": "/"})
            return
        seen = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
        self._reply(
            200,
            json.dumps(seen).encode(),
            {
                "Content-Type": "application/json",
                "Connection": "keep-alive, X-Private",
                "X-Private": "1",
                "Keep-Alive": "5",
            },
        )

    do_HEAD = do_GET

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        h = hashlib.sha256()
        left = n
        while left:
            data = self.rfile.read(min(left, 1 << 16))
            h.update(data)
            left -= len(data)
        self._reply(201, f"{h.hexdigest()} {n}".encode(), {"Set-Cookie": "app=1; Path=/"})


@pytest.fixture
def app_port() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _App)
    srv.gate = threading.Event()  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.gate.set()  # type: ignore[attr-defined]
        srv.shutdown()
        srv.server_close()


async def test_the_proxy_passes_requests_and_answers(base_url: str, app_port: ThreadingHTTPServer) -> None:
    port = app_port.server_address[1]
    prefix = f"/v1/workspaces/w/ports/{port}"
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        r = await c.get(f"{prefix}/a%20b/c?x=1&y=%2F", headers={"Cookie": "k=v", "X-App": "mine"})
        assert r.status_code == 200, r.text
        seen = r.json()
        assert seen["path"] == "/a%20b/c?x=1&y=%2F"  # the path exactly as sent, query included
        assert seen["headers"]["cookie"] == "k=v" and seen["headers"]["x-app"] == "mine"
        assert seen["headers"]["x-forwarded-prefix"] == prefix
        assert seen["headers"]["host"] == base_url.removeprefix("http://")  # Host unchanged
        assert "authorization" not in seen["headers"]  # the service's token never reaches the app
        assert "keep-alive" not in r.headers and "x-private" not in r.headers  # hop-by-hop, both ways
        assert r.headers["content-type"] == "application/json"
        assert len(r.headers.get_list("date")) == 1  # the service's, not also the app's
        # the agent's app runs sandboxed: an opaque origin, never the dashboard's
        assert r.headers["content-security-policy"].startswith("sandbox allow-scripts")
        assert "allow-same-origin" not in r.headers["content-security-policy"]
        r = await c.get(f"{prefix}/sw.js")
        assert "service-worker-allowed" not in r.headers  # no worker over the whole origin
        r = await c.head(f"{prefix}/")
        assert r.status_code == 200 and r.content == b""
        payload = os.urandom(20 << 20)  # more than the API's body limit (16 MiB): streamed, not held
        r = await c.post(f"{prefix}/upload", content=payload)
        assert r.status_code == 201 and r.text == f"{hashlib.sha256(payload).hexdigest()} {len(payload)}"
        assert r.headers["set-cookie"] == "app=1; Path=/"
        r = await c.get(prefix + "?q=1", follow_redirects=False)
        assert r.status_code == 308 and r.headers["location"] == prefix + "/?q=1"


async def test_the_proxy_streams_the_answer(base_url: str, app_port: ThreadingHTTPServer) -> None:
    port = app_port.server_address[1]
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        async with c.stream("GET", f"/v1/workspaces/w/ports/{port}/slow") as r:
            parts = r.aiter_raw()
            first = await parts.__anext__()
            assert first == b"one\n"  # while the app still holds its second part back
            app_port.gate.set()  # type: ignore[attr-defined]
            rest = b"".join([p async for p in parts])
        assert rest == b"two\n"


async def test_browsers_sign_in_with_basic_and_nothing_passes_without(
    base_url: str, app_port: ThreadingHTTPServer
) -> None:
    port = app_port.server_address[1]
    url = f"/v1/workspaces/w/ports/{port}/"
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
        r = await c.get(url)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic realm=")
        basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        r = await c.get(url, headers={"Authorization": f"Basic {basic}"})
        assert r.status_code == 200 and "authorization" not in r.json()["headers"]
        wrong = base64.b64encode(b"anyone:nope").decode()
        for header in (f"Basic {wrong}", "Basic !!", "Bearer nope", TOKEN):
            assert (await c.get(url, headers={"Authorization": header})).status_code == 401


async def test_the_proxy_says_what_is_wrong(base_url: str) -> None:
    closed = free_port()
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        r = await c.get(f"/v1/workspaces/w/ports/{closed}/")
        assert r.status_code == 502 and f"Nothing listens on port {closed}" in r.json()["detail"]
        r = await c.get("/v1/workspaces/nope/ports/80/")
        assert r.status_code == 404
        r = await c.get("/v1/workspaces/w/ports/70000/")
        assert r.status_code == 422


async def test_no_proxy_without_a_token(tmp_path: Path, local_backend: Any, app_port: ThreadingHTTPServer) -> None:
    async with serving(tmp_path / "root", local_backend, api_token=None) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            await c.post("/v1/workspaces", json={"name": "w"})
            r = await c.get(f"/v1/workspaces/w/ports/{app_port.server_address[1]}/")
            assert r.status_code == 403 and "port-forward" in r.json()["detail"]


async def test_an_answer_that_is_not_http_is_a_502(base_url: str) -> None:
    async def junk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"SSH-2.0-not-http\r\n\r\n")
        writer.close()

    srv = await asyncio.start_server(junk, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
            r = await c.get(f"/v1/workspaces/w/ports/{port}/")
        assert r.status_code == 502 and "no valid HTTP answer" in r.json()["detail"]
    finally:
        srv.close()


# -- MCP progress -------------------------------------------------------------------------------


async def test_mcp_progress_carries_the_output(base_url: str, tmp_path: Path) -> None:
    ws = tmp_path / "root" / "w"
    messages: list[tuple[float, str | None]] = []
    before_sleep_ended: list[bool] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append((value, message))
        before_sleep_ended.append(not (ws / "slept").exists())

    async with httpx2.AsyncClient(headers=AUTH, timeout=60) as http:
        async with Client(streamable_http_client(f"{base_url}/v1/workspaces/w/mcp", http_client=http)) as client:
            r = await client.call_tool(
                "shell_execute",
                {"command": "echo first; sleep 2; touch slept; echo second"},
                progress_callback=progress,
            )
            assert r.is_error is False and "first\nsecond" in "".join(c.text for c in r.content if hasattr(c, "text"))
            plain = await client.call_tool("shell_execute", {"command": "echo quiet"})
            assert plain.is_error is False
    assert [m for _, m in messages] == ["first\n", "second\n"]
    assert before_sleep_ended[0] is True
    assert messages[0][0] < messages[1][0]  # progress grows


async def test_mcp_progress_over_stdio(tmp_path: Path) -> None:
    from mcp.client.stdio import StdioServerParameters

    ws = tmp_path / "ws"
    ws.mkdir()
    repo = str(Path(__file__).resolve().parents[2])
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "worker.cli", "mcp", "--workspace", str(ws), "--backend", "local"],
        env={"LOOM_ALLOW_UNSAFE_LOCAL": "1", "LOOM_LOG_FORMAT": "json", "PYTHONPATH": repo},
    )
    messages: list[str | None] = []
    before_sleep_ended: list[bool] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message)
        before_sleep_ended.append(not (ws / "slept").exists())

    async with Client(params) as client:
        r = await client.call_tool(
            "shell_execute", {"command": "echo first; sleep 2; touch slept; echo second"}, progress_callback=progress
        )
    assert r.is_error is False
    assert messages == ["first\n", "second\n"] and before_sleep_ended[0] is True
