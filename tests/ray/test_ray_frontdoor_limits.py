"""The cluster's front door (``loom-worker serve --ray``, a process of its own) refuses an
oversized request while it reads it, before anything is forwarded to a node: requests of
100 MiB and 1 GiB (a tool call, an MCP message), by Content-Length and chunked, and the
front door's peak RSS grows by at most ``tests.bodies.BOUND`` for each."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bodies import BOUND, MiB, body, grown, http_post, reset_peak
from tests.ray.conftest import NAMESPACE, RayCluster
from tests.servers import free_port
from worker.limits import MAX_REQUEST_BYTES

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SIZES = [pytest.param(100 * MiB, id="100MiB"), pytest.param(1 << 30, id="1GiB")]
WRITE = b'{"name": "write_file", "arguments": {"path": "big.txt", "content": "'


@pytest.fixture(scope="module")
def front_door(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """``loom-worker serve --ray``, with a workspace ``limits``: (its pid, its port)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(
        LOOM_DATA_DIR=str(tmp_path_factory.mktemp("front") / "data"),
        LOOM_LOG_LEVEL="warning",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    argv = [sys.executable, "-m", "worker.cli", "serve", "--ray", ray_cluster.address, "--ray-namespace", NAMESPACE]
    p = subprocess.Popen([*argv, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):  # its start: bounded by the test's timeout (a synchronisation)
            assert p.poll() is None, p.stderr.read().decode()[-3000:] if p.stderr else ""
            try:
                if http_post(port, "/healthz", iter([b""]), length=0)[0] in (200, 405):
                    break
            except OSError:
                time.sleep(0.1)
        status, answer = http_post(port, "/v1/workspaces", iter([b'{"name": "limits"}']), length=18)
        assert status == 201, answer  # a workspace on a node, so a body is read before it is routed
        try:
            yield p.pid, port
        finally:
            http_delete(port, "/v1/workspaces/limits?delete_files=true")
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)


def http_delete(port: int, path: str) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"DELETE {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode())
        sock.recv(1 << 16)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_the_front_door_refuses_it_while_reading(front_door: tuple[int, int], size: int, framing: str) -> None:
    pid, port = front_door
    length = size if framing == "content-length" else None
    for path, start in (
        ("/v1/workspaces/limits/execute", WRITE),
        ("/v1/workspaces/limits/mcp", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + WRITE[1:]),
    ):
        rss = reset_peak(pid)
        status, answer = http_post(port, path, body(size, start), length=length)
        assert status == 413 and json.loads(answer) == {
            "detail": f"Request body larger than {MAX_REQUEST_BYTES} bytes"
        }, (path, answer)
        assert grown(pid, rss) <= BOUND, path
