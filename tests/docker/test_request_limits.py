"""An oversized request is refused while it is read, on every surface, in bounded memory.

Requests of 100 MiB and 1 GiB (a ``write_file`` call's JSON) against the real servers,
each started as its own process: ``loom-worker serve`` (the tools' HTTP API, MCP over
streamable HTTP, the harness's exec), ``loom-worker mcp`` (MCP over stdio), the CLI's
local worker (a frame sent straight to its socket) and the CLI itself (``--args -`` and
``batch``). The bodies are generated a piece at a time (one 1 MiB piece, sent again and
again), so the test holds none of them.

The bound, measured: the server's peak RSS (``VmHWM`` of ``/proc/<pid>/status``, reset
to the current RSS through ``clear_refs`` just before the request) grows by at most
:data:`BOUND` while it refuses one request, and by at most ``n`` times the request limit
(``LOOM_MAX_BODY_BYTES``, 24 MiB) and :data:`BOUND` for ``n`` sent at once. The CLI, a
process per call, is bounded as a whole (its peak from ``wait4``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bodies import BOUND, MiB, body, grown, http_post, reset_peak
from tests.servers import free_port
from tests.workers import LOOM, ROOT, cli, cli_env, run_dir, this_key, worker_dir
from worker.limits import MAX_REQUEST_BYTES
from worker.localworker.client import connect
from worker.localworker.rundir import WorkerFiles

pytestmark = pytest.mark.docker

SIZES = [pytest.param(100 * MiB, id="100MiB"), pytest.param(1 << 30, id="1GiB")]


# -- HTTP -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, docker_ready: None) -> Iterator[tuple[int, int, str]]:
    """``loom-worker serve`` (the Docker backend) as its own process: (pid, port, a workspace id)."""
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(PYTHONPATH=str(ROOT), LOOM_DATA_DIR=str(tmp / "data"), LOOM_WORKSPACE_ROOT=str(tmp / "ws"))
    env.update(LOOM_LOG_LEVEL="warning", LOOM_CATALOG="false")
    proc = subprocess.Popen(
        [LOOM, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        status = 0
        for _ in range(600):  # up to a minute to start (a synchronisation, not a timing check)
            if proc.poll() is not None:
                raise AssertionError(proc.stderr.read().decode() if proc.stderr else "serve exited")
            try:
                status, answer = http_post(port, "/v1/workspaces", iter([b"{}"]), length=2)
                break
            except (ConnectionRefusedError, OSError):
                threading.Event().wait(0.1)
        assert status == 201, answer
        yield proc.pid, port, json.loads(answer)["id"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


ARGS = b'{"path": "big.txt", "content": "'
WRITE = b'{"name": "write_file", "arguments": ' + ARGS


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_http_execute_refuses_it_while_reading(service: tuple[int, int, str], size: int, framing: str) -> None:
    pid, port, ws = service
    rss = reset_peak(pid)
    length = size if framing == "content-length" else None
    status, answer = http_post(port, f"/v1/workspaces/{ws}/execute", body(size, WRITE), length=length)
    assert status == 413 and json.loads(answer) == {"detail": f"Request body larger than {MAX_REQUEST_BYTES} bytes"}
    assert grown(pid, rss) <= BOUND
    # And the service goes on serving.
    small = b'{"name": "nope", "arguments": {}}'
    status, _ = http_post(port, f"/v1/workspaces/{ws}/execute", iter([small]), length=len(small))
    assert status in (200, 404, 422)


@pytest.mark.parametrize("size", SIZES)
def test_mcp_over_http_refuses_it_while_reading(service: tuple[int, int, str], size: int) -> None:
    pid, port, ws = service
    rss = reset_peak(pid)
    start = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + WRITE[1:]
    accept = "Accept: application/json, text/event-stream\r\n"
    status, answer = http_post(port, f"/v1/workspaces/{ws}/mcp", body(size, start), length=None, headers=accept)
    assert status == 413 and json.loads(answer) == {"detail": f"Request body larger than {MAX_REQUEST_BYTES} bytes"}
    assert grown(pid, rss) <= BOUND


@pytest.mark.parametrize("size", SIZES)
def test_the_harness_exec_refuses_it_while_reading(service: tuple[int, int, str], size: int) -> None:
    pid, port, ws = service
    rss = reset_peak(pid)
    start = b'{"cmd": ["cat"], "stdin": "'
    status, _answer = http_post(port, f"/v1/workspaces/{ws}/sandbox/exec", body(size, start), length=None)
    assert status == 413
    # The exec route takes a 64 MiB stdin as base64: its own limit is ~86 MiB.
    assert grown(pid, rss) <= 86 * MiB + BOUND


def test_several_at_once_stay_bounded(service: tuple[int, int, str]) -> None:
    pid, port, ws = service
    rss = reset_peak(pid)
    n = 4
    statuses: list[int] = []

    def one() -> None:
        statuses.append(http_post(port, f"/v1/workspaces/{ws}/execute", body(1 << 30, WRITE), length=None)[0])

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [413] * n
    assert grown(pid, rss) <= n * MAX_REQUEST_BYTES + BOUND


# -- MCP over stdio -------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_mcp_over_stdio_refuses_it_while_reading(
    workspace: Path, tmp_path: Path, size: int, docker_ready: None
) -> None:
    import mcp_types

    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(
        PYTHONPATH=str(ROOT), LOOM_DATA_DIR=str(tmp_path / "data"), LOOM_LOG_LEVEL="warning", LOOM_CATALOG="false"
    )
    proc = subprocess.Popen(
        [LOOM, "mcp", "--workspace", str(workspace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": mcp_types.LATEST_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        }
        proc.stdin.write(
            json.dumps(init).encode() + b"\n" + b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
        )
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        rss = reset_peak(proc.pid)
        start = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": ' + WRITE[1:]
        for piece in body(size, start):
            proc.stdin.write(piece)
        proc.stdin.write(b'"}}}\n')
        proc.stdin.write(b'{"jsonrpc": "2.0", "id": 8, "method": "tools/list"}\n')
        proc.stdin.flush()
        refused = json.loads(proc.stdout.readline())
        assert refused["id"] == 7 and str(MAX_REQUEST_BYTES) in refused["error"]["message"], refused
        assert json.loads(proc.stdout.readline())["id"] == 8  # the session goes on
        assert grown(proc.pid, rss) <= BOUND
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


# -- the CLI and its local worker -----------------------------------------------------------


@pytest.fixture(scope="module")
def local_worker(
    tmp_path_factory: pytest.TempPathFactory, docker_ready: None
) -> Iterator[tuple[dict[str, str], Path, str]]:
    """A running local worker (the Docker backend): (the CLI's environment, a workspace, its key)."""
    tmp = tmp_path_factory.mktemp("lw")
    ws = tmp / "ws"
    ws.mkdir()
    with run_dir() as run:
        env = cli_env(run, tmp / "data")
        p = cli(env, "call", "no_such_tool", "-w", str(ws))  # starts the worker; no sandbox needed
        assert b"no_such_tool" in p.stdout + p.stderr, p
        yield env, ws, this_key(env)


def _pid_of(env: dict[str, str], key: str) -> int:
    client = connect(WorkerFiles(worker_dir(env["XDG_RUNTIME_DIR"]), key), key)
    assert client is not None
    try:
        return int(client.request({"op": "status"})["pid"])
    finally:
        client.close()


@pytest.mark.parametrize("size", SIZES)
def test_the_local_worker_refuses_a_frame_while_reading(
    local_worker: tuple[dict[str, str], Path, str], size: int
) -> None:
    env, ws, key = local_worker
    pid = _pid_of(env, key)
    client = connect(WorkerFiles(worker_dir(env["XDG_RUNTIME_DIR"]), key), key)
    assert client is not None
    try:
        assert client.max_request == MAX_REQUEST_BYTES  # from the worker's greeting
        rss = reset_peak(pid)
        start = f'{{"id": 1, "op": "call", "key": "{key}", "tool": "write_file", "workspace": "{ws}", '.encode()
        start += b'"arguments": {"path": "big.txt", "content": "'
        sock = client.sock
        try:
            for piece in body(size, start):
                sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it stopped reading: the answer is waiting
        answer = json.loads(client._readline())
        assert answer["t"] == "error" and answer["code"] == "too_large" and answer["id"] == 1, answer
        assert str(MAX_REQUEST_BYTES) in answer["message"]
        assert grown(pid, rss) <= BOUND
    finally:
        client.close()
    assert _pid_of(env, key) == pid  # the same worker serves on


def test_a_call_over_the_limit_is_not_sent_to_the_worker(local_worker: tuple[dict[str, str], Path, str]) -> None:
    env, ws, key = local_worker
    client = connect(WorkerFiles(worker_dir(env["XDG_RUNTIME_DIR"]), key), key)
    assert client is not None
    try:
        big = {"path": "big.txt", "content": "x" * (MAX_REQUEST_BYTES + MiB)}
        code, result = client.call(
            "write_file", big, str(ws), None, check_unknown=True, on_log=lambda _t: None, tty=False
        )
    finally:
        client.close()
    assert code == 1 and result["success"] is False and result["data"] == {"error_kind": "too_large"}
    assert not (ws / "big.txt").exists()


#: Runs a command and writes its peak RSS (KiB, from ``wait4``) to the file ``$RSS_OUT``.
#: (Measured from this small process, not from pytest's: a child's peak includes what it
#: was before ``exec``, a fork of its parent.)
_MEASURED = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "open(os.environ['RSS_OUT'], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def _cli_streaming(
    env: dict[str, str], argv: list[str], chunks: Iterator[bytes], rss_out: Path
) -> tuple[int, bytes, bytes, int]:
    """Run ``loom-worker ARGV`` with ``chunks`` on its stdin; (exit code, stdout, stderr,
    its peak RSS)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _MEASURED, LOOM, *argv],
        env={**env, "RSS_OUT": str(rss_out)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    got: dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: got.__setitem__("err", proc.stderr.read()))  # type: ignore[union-attr]
    out = threading.Thread(target=lambda: got.__setitem__("out", proc.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    out.start()
    try:
        for piece in chunks:
            proc.stdin.write(piece)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it stopped reading
    code = proc.wait(timeout=120)
    reader.join()
    out.join()
    return code, got["out"], got["err"], int(rss_out.read_text()) * 1024


@pytest.mark.parametrize("size", SIZES)
def test_the_cli_refuses_args_while_reading(
    local_worker: tuple[dict[str, str], Path, str], size: int, tmp_path: Path
) -> None:
    env, ws, _key = local_worker
    code, _out, err, peak = _cli_streaming(
        env, ["call", "write_file", "-w", str(ws), "--args", "-"], body(size, ARGS), tmp_path / "rss"
    )
    assert code == 2 and f"over the limit of {MAX_REQUEST_BYTES} bytes" in err.decode(), err
    assert peak <= MAX_REQUEST_BYTES + BOUND
    assert not (ws / "big.txt").exists()


@pytest.mark.parametrize("size", SIZES)
def test_a_batch_line_over_the_limit_is_refused_and_the_next_runs(
    local_worker: tuple[dict[str, str], Path, str], size: int, tmp_path: Path
) -> None:
    env, ws, _key = local_worker

    def lines() -> Iterator[bytes]:
        yield from body(size, b'{"tool": "write_file", "arguments": {"path": "big.txt", "content": "')
        yield b'"}}\n{"tool": "no_such_tool", "arguments": {}, "id": 2}\n'

    code, out, err, peak = _cli_streaming(env, ["batch", "-w", str(ws)], lines(), tmp_path / "rss")
    first, second = (json.loads(line) for line in out.splitlines())
    assert code == 1 and f"over the limit of {MAX_REQUEST_BYTES} bytes" in first["error"], (out, err)
    assert second["id"] == 2 and "no_such_tool" in second["error"]  # the next line ran
    assert peak <= MAX_REQUEST_BYTES + BOUND
    assert not (ws / "big.txt").exists()
