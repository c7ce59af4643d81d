"""The port proxy's WebSockets against a real uvicorn on loopback, with a real WebSocket
client (websocket-client, in a thread: the service runs on the test's loop) and the
stdlib echo server of tests/wsecho.py (the local backend: "the sandbox's loopback" is this
host's here). The same on the real engine, under runc and gVisor:
tests/docker/test_websocket_ports.py."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket

from tests import wsecho
from tests.servers import free_port
from tests.unit.test_http_stream_ports import AUTH, TOKEN, serving
from worker.auth import bearer_subprotocol

HEADER = [f"Authorization: Bearer {TOKEN}"]


@pytest.fixture
def echo() -> Iterator[int]:
    server = wsecho.serve()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
async def base_url(tmp_path: Path, local_backend: Any) -> AsyncIterator[str]:
    async with serving(tmp_path / "root", local_backend) as url:
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as c:
            assert (await c.post("/v1/workspaces", json={"name": "w"})).status_code == 201
        yield url


def ws_url(base_url: str, port: int, rest: str = "/") -> str:
    return base_url.replace("http://", "ws://") + f"/v1/workspaces/w/ports/{port}{rest}"


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await asyncio.wait_for(asyncio.to_thread(fn), 120)


def close_of(ws: websocket.WebSocket) -> tuple[int, str]:
    """The code and reason of the close the server sends next."""
    while True:
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return struct.unpack("!H", frame.data[:2])[0], frame.data[2:].decode()


async def last_close(base_url: str, port: int, expected: str) -> str:
    """The app's record of the last close a client sent, waited for until it starts with
    ``expected``."""
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        for _ in range(200):
            last = (await c.get(f"/v1/workspaces/w/ports/{port}/last-close")).text
            if last.startswith(expected):
                break
            await asyncio.sleep(0.05)
    return last


def refused(url: str, **kwargs: Any) -> websocket.WebSocketBadStatusException:
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(url, timeout=60, **kwargs)
    return e.value


async def test_messages_pass_both_ways_and_the_handshake_as_the_client_made_it(base_url: str, echo: int) -> None:
    def client() -> None:
        ws = websocket.create_connection(
            ws_url(base_url, echo, "/chat/room%201?x=1&y=%2F"), header=HEADER, subprotocols=["nope", "chat.v2"]
        )
        assert ws.subprotocol == "chat.v2"  # the app's choice
        ws.send("héllo")
        assert ws.recv() == "héllo"
        ws.send_binary(b"\x00\xff\x01")
        assert ws.recv() == b"\x00\xff\x01"
        ws.send("")
        assert ws.recv() == ""
        ws.send("who")
        seen = json.loads(ws.recv())
        assert seen["path"] == "/chat/room%201?x=1&y=%2F" and seen["subprotocol"] == "chat.v2"
        headers = seen["headers"]
        assert "authorization" not in headers  # the service's token never reaches the app
        assert headers["sec-websocket-protocol"] == "nope, chat.v2"
        assert headers["x-forwarded-prefix"] == f"/v1/workspaces/w/ports/{echo}"
        assert headers["host"] == base_url.removeprefix("http://")  # Host unchanged
        assert headers["origin"] == base_url  # (websocket-client's: this service)
        ws.send("frag")  # two frames from the app: one message here
        assert ws.recv() == "frag-one frag-two"
        ws.send("ping")  # the proxy answers the app's ping
        assert ws.recv() == "pong:p1"
        ws.ping(b"mine")  # uvicorn answers the client's
        assert ws.recv_data_frame(True)[0] == websocket.ABNF.OPCODE_PONG
        big = os.urandom(5 << 20)
        ws.send_binary(big)
        assert ws.recv() == big
        ws.send("big:5000000")
        assert ws.recv() == b"b" * 5000000
        ws.close(status=4002, reason=b"client bye")

    await in_thread(client)
    # the client's close code and reason reached the app
    assert await last_close(base_url, echo, "4002 client bye") == "4002 client bye"


async def test_the_apps_close_reaches_the_client(base_url: str, echo: int) -> None:
    def client() -> None:
        ws = websocket.create_connection(ws_url(base_url, echo), header=HEADER)
        ws.send("close:4001:bye now")
        assert close_of(ws) == (4001, "bye now")
        ws.close()

    await in_thread(client)


async def test_the_token_as_subprotocol_or_basic_and_never_passed_on(base_url: str, echo: int) -> None:
    def client() -> None:
        ws = websocket.create_connection(ws_url(base_url, echo), subprotocols=["echo.v1", bearer_subprotocol(TOKEN)])
        assert ws.subprotocol == "echo.v1"
        ws.send("who")
        seen = json.loads(ws.recv())
        assert seen["headers"]["sec-websocket-protocol"] == "echo.v1" and "authorization" not in seen["headers"]
        ws.close()
        basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        ws = websocket.create_connection(ws_url(base_url, echo), header=[f"Authorization: Basic {basic}"])
        assert ws.subprotocol is None
        ws.send("x")
        assert ws.recv() == "x"
        ws.close()

    await in_thread(client)


async def test_a_refused_handshake_is_an_http_answer(base_url: str, echo: int) -> None:
    def client() -> None:
        # The guard's: no token, a wrong one, another origin.
        e = refused(ws_url(base_url, echo))
        assert e.status_code == 401 and e.resp_headers["www-authenticate"].startswith("Basic realm=")
        e = refused(ws_url(base_url, echo), subprotocols=["echo.v1", bearer_subprotocol("wrong")])
        assert e.status_code == 401
        e = refused(ws_url(base_url, echo), header=HEADER, origin="http://evil.example")
        assert e.status_code == 403 and b"Cross-site request refused" in e.resp_body
        e = refused(ws_url(base_url, echo), header=HEADER, origin="null")  # the app's own sandboxed pages
        assert e.status_code == 403
        # The proxy's: nothing listens, no such workspace, a port out of range.
        closed = free_port()
        e = refused(ws_url(base_url, closed), header=HEADER)
        assert e.status_code == 502 and f"Nothing listens on port {closed}".encode() in e.resp_body
        e = refused(ws_url(base_url, echo).replace("/w/", "/nope/"), header=HEADER)
        assert e.status_code == 404
        e = refused(ws_url(base_url, 70000), header=HEADER)
        assert e.status_code == 422
        # The app's own refusal, passed on; an app that is not a WebSocket server answers as it does.
        e = refused(ws_url(base_url, echo, "/refuse"), header=HEADER)
        assert (e.status_code, e.resp_body) == (403, b"refused by the app\n")
        assert e.resp_headers["content-security-policy"].startswith("sandbox")  # as every answer of the app

    await in_thread(client)


async def test_an_answer_that_is_not_websocket_is_a_502(base_url: str) -> None:
    async def junk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(junk, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        e = await in_thread(lambda: refused(ws_url(base_url, port), header=HEADER))
        assert e.status_code == 502 and b"no valid WebSocket answer" in e.resp_body and b"accept" in e.resp_body
    finally:
        srv.close()


async def test_a_broken_connection_to_the_app_closes_the_client_with_1011(base_url: str, echo: int) -> None:
    def client() -> None:
        ws = websocket.create_connection(ws_url(base_url, echo), header=HEADER)
        ws.send("drop")
        code, reason = close_of(ws)
        assert code == 1011 and "broke" in reason and len(reason.encode()) <= 123, reason
        ws.close()

    await in_thread(client)


async def test_a_message_larger_than_the_proxy_takes_closes_both_with_1009(
    base_url: str, echo: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.http import ports_ws

    monkeypatch.setattr(ports_ws, "MAX_MESSAGE", 1 << 20)

    def client() -> None:
        ws = websocket.create_connection(ws_url(base_url, echo), header=HEADER)
        ws.send(f"big:{1 << 20}")
        assert len(ws.recv()) == 1 << 20  # at the limit: passed on
        ws.send(f"big:{(1 << 20) + 1}")
        assert close_of(ws)[0] == 1009
        ws.close()

    await in_thread(client)
    assert (await last_close(base_url, echo, "1009 ")).startswith("1009 ")


async def test_a_client_that_does_not_read_holds_the_app_back(base_url: str, echo: int) -> None:
    # 128 MiB from the app to a client that reads nothing for a while: the app is made to
    # wait (the buffers on the way, the tunnel's window and one message), not the proxy
    # made to hold it all; then everything arrives.
    total = 2048

    async def sent() -> int:
        async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
            return int((await c.get(f"/v1/workspaces/w/ports/{echo}/flood-sent")).text)

    ws = await in_thread(lambda: websocket.create_connection(ws_url(base_url, echo), header=HEADER))
    try:
        await in_thread(lambda: ws.send(f"flood:{total}"))
        await asyncio.sleep(1.5)
        first = await sent()
        await asyncio.sleep(0.5)
        # (the kernel's socket buffers on the way hold ~14 MiB here)
        assert first == await sent() < total // 4, first  # stalled, far from the end

        def read_all() -> int:
            n = 0
            for _ in range(total):
                n += len(ws.recv())
            return n

        assert await in_thread(read_all) == total * 65536
    finally:
        await in_thread(ws.close)


def test_serve_runs_uvicorn_with_websockets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `loom-worker serve` itself: uvicorn configured with wsproto (the tests above serve the
    # app with uvicorn's "auto", which finds the same library).
    from uvicorn.protocols.websockets.wsproto_impl import WSProtocol

    from worker.cli import main, service, verbosity

    configs: list[Any] = []

    class Server:
        def __init__(self, config: Any) -> None:
            configs.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr(service, "_quiet_exit_server", lambda: Server)
    monkeypatch.setattr(verbosity, "configure", lambda *_a, **_k: None)  # (the test process's logging stays)
    monkeypatch.setenv("LOOM_API_TOKEN", TOKEN)
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    assert main(["serve", "--port", "1", "--workspace-root", str(tmp_path)]) == 0
    [config] = configs
    config.load()
    assert config.ws == "wsproto" and config.ws_protocol_class is WSProtocol


async def test_on_a_server_without_the_denial_extension_a_refusal_is_a_close(
    tmp_path: Path, local_backend: Any, echo: int
) -> None:
    from tests.asgi_ws import handshake
    from tests.unit.test_http import AUTH as AUTH_IN_PROCESS
    from tests.unit.test_http import running
    from worker.registry import ToolRegistry

    async with running(tmp_path / "root", ToolRegistry(backend=local_backend)) as svc:
        await svc.workspace("w")

        async def closed(path: str) -> tuple[int | None, str]:
            answer = await handshake(svc.app, path, AUTH_IN_PROCESS, denial=False)
            assert answer.kind == "close", answer
            return answer.code, answer.reason

        code, reason = await closed(f"/v1/workspaces/w/ports/{echo}/refuse")
        assert code == 1011 and reason.endswith("refused the WebSocket handshake: 403"), reason
        code, reason = await closed(f"/v1/workspaces/w/ports/{free_port()}/")
        assert code == 1011 and reason.startswith("Nothing listens on port"), reason
        code, reason = await closed(f"/v1/workspaces/nope/ports/{echo}/")
        assert code == 1008, reason
        answer = await handshake(svc.app, f"/v1/workspaces/w/ports/{echo}/", AUTH_IN_PROCESS, ["chat.v2"])
        assert (answer.kind, answer.subprotocol) == ("accept", "chat.v2")
