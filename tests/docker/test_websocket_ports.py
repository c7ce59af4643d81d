"""WebSockets to a server in the sandbox, on the real engine, under runc and gVisor: the
stdlib echo server of tests/wsecho.py started in the sandbox (``shell_execute
{"background": true}``), reached through the service's port proxy (message by message:
text, binary, 5 MB both ways, the close codes both ways, the token as the subprotocol)
and through ``loom-worker port-forward`` (raw TCP: the WebSocket passes untouched)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import websocket

from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import require_runtime
from tests.docker.test_stream_ports import CLI, settings_of
from tests.servers import serve_app
from tests.workers import ROOT, cli_env, run_dir
from worker.auth import bearer_subprotocol
from worker.http import create_app
from worker.registry import default_registry

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

TOKEN = "ws-ports-test-token"
ECHO = (Path(__file__).parents[1] / "wsecho.py").read_text()
APP_PORT = 8766


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_ready: None) -> str:
    require_runtime(request.param)
    return str(request.param)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The service's workspace root; the workspace ``w`` in it (owned by uid 1000) with
    the echo server."""
    r = tmp_path / "root"
    (r / "w").mkdir(parents=True)
    (r / "w" / "wsecho.py").write_text(ECHO)
    for p in (r / "w", r / "w" / "wsecho.py"):
        os.chown(p, 1000, 1000)
    yield r


@pytest.fixture
def env(runtime: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    with run_dir() as run:
        yield cli_env(run, tmp_path / "data", LOOM_IMAGE=SANDBOX_IMAGE, LOOM_RUNTIME=runtime, LOOM_LOG_LEVEL="warning")


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await asyncio.wait_for(asyncio.to_thread(fn), 300)


def close_of(ws: websocket.WebSocket) -> tuple[int, str]:
    while True:
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return struct.unpack("!H", frame.data[:2])[0], frame.data[2:].decode()


def round_trips(url: str, bye: str, **connect: Any) -> dict[str, Any]:
    """Text, binary (5 MB both ways), the app's ping, the app's close; then a second
    connection closed by the client with 4002 and ``bye``. Returns what the app saw of the
    first handshake."""
    ws = websocket.create_connection(url, timeout=120, subprotocols=["echo.v1"], **connect.get("first", {}))
    assert ws.subprotocol == "echo.v1"
    ws.send("héllo")
    assert ws.recv() == "héllo"
    ws.send_binary(b"\x00\xff")
    assert ws.recv() == b"\x00\xff"
    big = os.urandom(5 << 20)
    ws.send_binary(big)
    assert ws.recv() == big
    ws.send("ping")
    assert ws.recv() == "pong:p1"
    ws.send("who")
    seen: dict[str, Any] = json.loads(ws.recv())
    ws.send("close:4001:bye now")
    assert close_of(ws) == (4001, "bye now")
    ws.close()
    ws = websocket.create_connection(url, timeout=120, **connect.get("second", {}))
    ws.send("x")
    assert ws.recv() == "x"
    ws.close(status=4002, reason=bye.encode())
    return seen


async def last_close(registry: Any, ws: Path, expected: str) -> str:
    """The app's record of the last close a client sent (waited for until ``expected``)."""
    seen = "none"
    for _ in range(100):
        r = await registry.execute("shell_execute", {"command": f"curl -sf 127.0.0.1:{APP_PORT}/last-close"}, ws)
        seen = str(r.output)
        if seen == expected:
            break
        await asyncio.sleep(0.1)
    return seen


async def test_websockets_through_the_proxy_and_port_forward(env: dict[str, str], root: Path) -> None:
    ws = root / "w"
    settings = settings_of(env, workspace_root=root, api_token=TOKEN)
    async with default_registry(settings, catalog=False) as registry:
        try:
            r = await registry.execute(
                "shell_execute", {"command": f"python3 wsecho.py {APP_PORT}", "background": True}, ws
            )
            assert r.success and r.data is not None and r.data["running"], r.output
            r = await registry.execute(
                "shell_execute",
                {"command": f"for i in $(seq 100); do curl -sf 127.0.0.1:{APP_PORT}/x && exit 0; sleep 0.1; done"},
                ws,
            )
            assert r.success and r.output == "plain http\n", r.output

            # The service's port proxy (the test's own registry: the service leaves the sandbox running).
            app = create_app(settings.model_copy(update={"stop_sandboxes_on_exit": False}), registry)
            async with serve_app(app) as base:
                url = base.replace("http://", "ws://") + f"/v1/workspaces/w/ports/{APP_PORT}/room?q=1"
                header = {"header": [f"Authorization: Bearer {TOKEN}"]}
                token = {"subprotocols": ["echo.v1", bearer_subprotocol(TOKEN)]}
                seen = await in_thread(lambda: round_trips(url, "via the proxy", first=header, second=token))
                assert seen["path"] == "/room?q=1" and "authorization" not in seen["headers"]
                assert seen["headers"]["x-forwarded-prefix"] == f"/v1/workspaces/w/ports/{APP_PORT}"
                assert await last_close(registry, ws, "4002 via the proxy") == "4002 via the proxy"

                def refused() -> None:
                    with pytest.raises(websocket.WebSocketBadStatusException) as e:
                        websocket.create_connection(url, timeout=60)
                    assert e.value.status_code == 401

                await in_thread(refused)

            # loom-worker port-forward: raw TCP, the WebSocket passes as it is.
            argv = [*CLI, "port-forward", "-w", str(ws), f":{APP_PORT}"]
            p = await asyncio.create_subprocess_exec(
                *argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT)
            )
            try:
                assert p.stdout is not None
                line = (await asyncio.wait_for(p.stdout.readline(), 300)).decode()
                assert line.startswith("Forwarding from 127.0.0.1:"), line
                port = int(line.split(":")[1].split()[0])
                url = f"ws://127.0.0.1:{port}/direct"
                seen = await in_thread(lambda: round_trips(url, "via port-forward"))
                assert seen["path"] == "/direct" and seen["headers"]["host"] == f"127.0.0.1:{port}"
                assert "x-forwarded-prefix" not in seen["headers"]  # nothing in between
                assert await last_close(registry, ws, "4002 via port-forward") == "4002 via port-forward"
            finally:
                p.send_signal(signal.SIGINT)
                _out, err = await asyncio.wait_for(p.communicate(), 120)
            assert p.returncode == 0, err
        finally:
            await registry.stop(ws)
