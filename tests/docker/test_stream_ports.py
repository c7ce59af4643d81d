"""Output as it happens and ports, on the real engine, under runc and gVisor:

- ``loom-worker exec`` streams (a line printed, then a 2 s sleep: the line arrives before
  the sleep ends, judged by the order of events, never by a clock) and exits with the
  command's code (0, 1, 124, 137), non-UTF-8 bytes intact, through the local worker and
  in-process; what it changes is recorded and undone;
- a server started in the sandbox (``shell_execute {"background": true}``) is reached by a
  later call, through ``loom-worker port-forward`` from the host, and through the
  service's port proxy, a 5 MB body both ways included.

Every process here runs with the same settings (image, runtime, data directory), so the
CLI's processes and the test's own registry use the same container.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import require_runtime
from tests.servers import serve_app
from tests.workers import ROOT, cli_env, run_dir
from worker import ToolOutput, ToolResult
from worker.http import create_app
from worker.registry import default_registry
from worker.settings import Settings

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

CLI = [sys.executable, "-m", "worker.cli"]
TOKEN = "ports-test-token"
#: A small app for the sandbox: GET answers the path and a page; POST answers the sha256
#: and size of the body, then a body of that many bytes (so 5 MB go both ways).
APP = r"""
import hashlib, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def _send(self, body, ctype="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._send(("app page at %s\n" % self.path).encode())
    def do_POST(self):
        n = int(self.headers["Content-Length"])
        h = hashlib.sha256()
        left = n
        while left:
            d = self.rfile.read(min(left, 65536)); h.update(d); left -= len(d)
        self._send(("%s %d\n" % (h.hexdigest(), n)).encode() + b"z" * n)

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
APP_PORT = 8765
LOCAL = f"http://127.0.0.1:{APP_PORT}"


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_ready: None) -> str:
    require_runtime(request.param)
    return str(request.param)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The service's workspace root; the workspace ``w`` in it, owned by uid 1000."""
    r = tmp_path / "root"
    (r / "w").mkdir(parents=True)
    os.chown(r / "w", 1000, 1000)
    yield r


@pytest.fixture
def env(runtime: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    with run_dir() as run:
        yield cli_env(
            run,
            tmp_path / "data",
            LOOM_IMAGE=SANDBOX_IMAGE,
            LOOM_RUNTIME=runtime,
            LOOM_LOG_LEVEL="warning",
        )


def settings_of(env: dict[str, str], **more: Any) -> Settings:
    return Settings(image=env["LOOM_IMAGE"], runtime=env["LOOM_RUNTIME"], data_dir=Path(env["LOOM_DATA_DIR"]), **more)


def stop_sandbox(env: dict[str, str], ws: Path) -> None:
    subprocess.run([*CLI, "stop", "-w", str(ws)], env={**env, "LOOM_CLI_DAEMON": "0"}, capture_output=True, timeout=120)


# -- exec --------------------------------------------------------------------------------------


@pytest.mark.parametrize("daemon", ["1", "0"])
def test_exec_streams_and_exits_with_the_commands_code(env: dict[str, str], root: Path, daemon: str) -> None:
    ws = root / "w"
    env = {**env, "LOOM_CLI_DAEMON": daemon}
    try:
        argv = [*CLI, "exec", "-w", str(ws), "--", "sh", "-c", "echo first; sleep 2; touch slept; echo second"]
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
        assert p.stdout is not None
        first = p.stdout.readline()
        slept_when_first_arrived = (ws / "slept").exists()
        rest, err = p.communicate(timeout=300)
        assert (first, slept_when_first_arrived) == (b"first\n", False), err  # the line came before the sleep ended
        assert (rest, err, p.returncode) == (b"second\n", b"", 0)

        def run(*words: str) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(
                [*CLI, "exec", "-w", str(ws), *words], env=env, capture_output=True, timeout=300, cwd=str(ROOT)
            )

        q = run("--", "sh", "-c", r"printf 'a\377b\n'; printf '\200' >&2; exit 1")
        assert (q.returncode, q.stdout, q.stderr) == (1, b"a\xffb\n", b"\x80")
        q = run("--timeout", "1", "--", "sleep", "60")
        assert q.returncode == 124 and b"timed out" in q.stderr
        q = run("--", "kill -9 $$")
        assert q.returncode == 137
        q = run("--", "python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))")
        assert (q.returncode, q.stdout) == (0, bytes(range(256)))
    finally:
        stop_sandbox(env, ws)


def test_exec_changes_are_recorded_and_undone(env: dict[str, str], root: Path) -> None:
    ws = root / "w"
    (ws / "kept.txt").write_text("original\n")
    os.chown(ws / "kept.txt", 1000, 1000)  # the sandbox runs as the workspace's owner
    try:
        p = subprocess.run(
            [
                *CLI,
                "exec",
                "-w",
                str(ws),
                "--call-id",
                "ex-1",
                "--",
                "sh -c 'echo changed > kept.txt; mkdir d; echo n > d/new'",
            ],
            env=env,
            capture_output=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr
        assert (ws / "kept.txt").read_text() == "changed\n" and (ws / "d" / "new").exists()
        log = subprocess.run([*CLI, "log", "-w", str(ws)], env=env, capture_output=True, text=True, timeout=120)
        assert "kept.txt" in log.stdout and "ex-1" in log.stdout, log.stdout
        undo = subprocess.run(
            [*CLI, "undo", "-w", str(ws), "--call", "ex-1"], env=env, capture_output=True, text=True, timeout=300
        )
        assert undo.returncode == 0, undo.stderr
        assert (ws / "kept.txt").read_text() == "original\n" and not (ws / "d").exists()
    finally:
        stop_sandbox(env, ws)


async def test_the_python_iterator_streams_on_the_engine(env: dict[str, str], root: Path) -> None:
    ws = root / "w"
    async with default_registry(settings_of(env), catalog=False) as registry:
        try:
            first_before_sleep_ended = None
            items: list[ToolOutput | ToolResult] = []
            cmd = "echo first; sleep 2; touch slept; echo second"
            async for item in registry.execute_stream("shell_execute", {"command": cmd}, ws):
                if isinstance(item, ToolOutput) and first_before_sleep_ended is None:
                    first_before_sleep_ended = not (ws / "slept").exists()
                items.append(item)
            assert first_before_sleep_ended is True
            assert [i.text for i in items if isinstance(i, ToolOutput)] == ["first\n", "second\n"]
            assert isinstance(items[-1], ToolResult) and items[-1].success
        finally:
            await registry.stop(ws)


# -- a server in the sandbox --------------------------------------------------------------------


async def _serving(app: Any) -> AsyncIterator[str]:
    async with serve_app(app) as url:
        yield url


async def test_a_server_in_the_sandbox_reached_by_a_call_port_forward_and_the_proxy(
    env: dict[str, str], root: Path, runtime: str
) -> None:
    ws = root / "w"
    (ws / "app.py").write_text(APP)
    os.chown(ws / "app.py", 1000, 1000)
    settings = settings_of(env, workspace_root=root, api_token=TOKEN)
    async with default_registry(settings, catalog=False) as registry:
        try:
            sandbox: Any = (await registry.workspace(ws)).sandbox
            r = await registry.execute(
                "shell_execute", {"command": f"python3 app.py {APP_PORT}", "background": True}, ws
            )
            assert r.success and r.data is not None and r.data["running"], r.output
            server = r.data["process_id"]
            r = await registry.execute(
                "shell_execute",
                {"command": f"for i in $(seq 100); do curl -sf {LOCAL}/hi && exit 0; sleep 0.1; done; exit 1"},
                ws,
            )
            assert r.success and r.output == "app page at /hi\n", r.output  # a later call reaches it
            await _check_tunnel_kinds(sandbox, runtime)

            await _check_port_forward(env, ws)
            await _check_proxy(settings, registry)
            r = await registry.execute("process_kill", {"process_id": server}, ws)
            assert r.success, r.output
        finally:
            await registry.stop(ws)


async def _get_through(tunnel: Any, path: str) -> bytes:
    await tunnel.write(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    out = b""
    while data := await tunnel.read():
        out += data
    await tunnel.close()
    return out


async def _check_tunnel_kinds(sandbox: Any, runtime: str) -> None:
    """Under runc the agent hands the connection itself over (the fd channel beside the
    direct channel); under gVisor it is relayed over the channel. Both carry the same."""
    from sandbox.handover import SocketTunnel
    from sandbox.tunnel import SandboxTunnel

    t = await sandbox.open_tunnel(APP_PORT)
    assert isinstance(t, SocketTunnel if runtime == "runc" else SandboxTunnel), type(t)
    assert (await _get_through(t, "/kind")).endswith(b"app page at /kind\n")
    conn = await sandbox.connection()
    if conn.fd_channel is not None:  # without it (closed), runc relays too
        conn.fd_channel.close()
        t = await sandbox.open_tunnel(APP_PORT)
        assert isinstance(t, SandboxTunnel)
        assert (await _get_through(t, "/relayed")).endswith(b"app page at /relayed\n")


async def _check_port_forward(env: dict[str, str], ws: Path) -> None:
    argv = [*CLI, "port-forward", "-w", str(ws), f":{APP_PORT}"]
    p = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT)
    )
    try:
        assert p.stdout is not None
        line = (await asyncio.wait_for(p.stdout.readline(), 300)).decode()
        assert line.startswith("Forwarding from 127.0.0.1:") and line.endswith(f" -> {APP_PORT}\n"), line
        port = int(line.split(":")[1].split()[0])
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            r = await c.get("/from-the-host")
            assert r.status_code == 200 and r.text == "app page at /from-the-host\n"
            body = os.urandom(5 << 20)
            r = await c.post("/upload", content=body)
            head, _, rest = r.content.partition(b"\n")
            assert head.decode() == f"{hashlib.sha256(body).hexdigest()} {len(body)}" and rest == b"z" * len(body)
            pages = await asyncio.gather(*(c.get(f"/p{i}") for i in range(10)))
            assert [x.text for x in pages] == [f"app page at /p{i}\n" for i in range(10)]
    finally:
        p.send_signal(signal.SIGINT)
        _out, err = await asyncio.wait_for(p.communicate(), 120)
    assert p.returncode == 0, err


async def _check_proxy(settings: Settings, registry: Any) -> None:
    # The test's own registry: the service must leave its sandbox (and the server) running.
    app = create_app(settings.model_copy(update={"stop_sandboxes_on_exit": False}), registry)
    async for base in _serving(app):
        prefix = f"/v1/workspaces/w/ports/{APP_PORT}"
        async with httpx.AsyncClient(base_url=base, timeout=120) as c:
            assert (await c.get(f"{prefix}/x")).status_code == 401  # token required
            auth = {"Authorization": f"Bearer {TOKEN}"}
            r = await c.get(f"{prefix}/index.html?q=1", headers=auth)
            assert r.status_code == 200 and r.text == "app page at /index.html?q=1\n"
            r = await c.get(f"{prefix}/basic", auth=("anyone", TOKEN))  # as a browser signs in
            assert r.status_code == 200 and r.text == "app page at /basic\n"
            body = os.urandom(5 << 20)
            r = await c.post(f"{prefix}/upload", content=body, headers=auth)
            head, _, rest = r.content.partition(b"\n")
            assert head.decode() == f"{hashlib.sha256(body).hexdigest()} {len(body)}" and rest == b"z" * len(body)
            r = await c.get(f"/v1/workspaces/w/ports/{APP_PORT + 1}/", headers=auth)
            assert r.status_code == 502 and "Nothing listens" in r.json()["detail"]
            events = []
            body_json = {"tool": "shell_execute", "arguments": {"command": "echo streamed; sleep 1; echo done"}}
            async with c.stream("POST", "/v1/workspaces/w/execute/stream", json=body_json, headers=auth) as s:
                async for line in s.aiter_lines():
                    if line.startswith("event:"):
                        events.append(line[6:].strip())
            assert events == ["output", "output", "result"]
