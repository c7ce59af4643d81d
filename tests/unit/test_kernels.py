"""Code contexts without a sandbox: a bridge's events read as untrusted input (caps,
MIME fields, tracebacks without colours), its first line, what an execution says for a
model, the CLI's exit codes; the bridge itself run on this host's python with its
ipykernel (it is the image's python3 that runs it in a sandbox)."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import KernelUnavailableError, ProtocolError
from sandbox.kernel_bridge import BOOT
from sandbox.kernel_session import ready_line
from sandbox.kernels import bridge_source
from worker.cli.code import exit_code
from worker.kernels import Execution, ExecutionError, Result, strip_ansi, wire
from worker.kernels.execute import message, shown

ROOT = Path(__file__).resolve().parents[2]


def test_output_is_capped_per_stream() -> None:
    r = wire.Reader()
    assert r.output({"type": "stdout", "text": "a" * (wire.MAX_STREAM - 10)}).text == "a" * (wire.MAX_STREAM - 10)
    cut = r.output({"type": "stdout", "text": "b" * 10_000})
    assert cut is not None and len(cut.text) == 10 + 4096  # (room for the bridge's marker line)
    assert r.output({"type": "stdout", "text": "more"}) is None
    assert r.output({"type": "stderr", "text": "other stream"}).kind == "stderr"
    with pytest.raises(ProtocolError):
        r.output({"type": "stdout", "text": 3})


def test_a_result_by_mime_type() -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 100).decode()
    folded = "\n".join(png[i : i + 76] for i in range(0, len(png), 76)) + "\n"
    r = wire.Reader().result(
        {
            "type": "result",
            "data": {
                "text/plain": "<Figure>",
                "image/png": folded,
                "application/json": {"a": [1]},
                "application/vnd.custom+json": {"x": 1},
            },
            "main": True,
        }
    )
    assert r is not None and r.is_main_result
    assert r.png == png and r.text == "<Figure>" and r.json == {"a": [1]}
    assert r.extra == {"application/vnd.custom+json": {"x": 1}}
    assert r.formats() == ["text", "png", "json", "application/vnd.custom+json"]
    assert r.to_dict() == {
        "type": "result",
        "text": "<Figure>",
        "png": png,
        "json": {"a": [1]},
        "is_main_result": True,
        "extra": {"application/vnd.custom+json": {"x": 1}},
    }


def test_a_value_over_the_cap_is_dropped_and_said() -> None:
    big = "A" * (wire.MAX_VALUE + 1)
    r = wire.Reader().result({"type": "result", "data": {"text/plain": "<Figure>", "image/png": big}})
    assert r is not None and r.png is None
    assert r.text == f"<Figure>\n[image/png of {wire.MAX_VALUE + 1} bytes not kept: a value may have 10 MiB]"
    with pytest.raises(ProtocolError):
        wire.Reader().result({"type": "result", "data": {"image/png": 3}})
    reader = wire.Reader(results=wire.MAX_RESULT_COUNT)
    assert reader.result({"type": "result", "data": {"text/plain": "1"}}) is None


def test_the_end_of_an_execution() -> None:
    end = wire.end(
        {
            "type": "end",
            "status": "error",
            "execution_count": 3,
            "error": {
                "name": "ZeroDivisionError",
                "value": "division by zero",
                "traceback": ["\x1b[31m----\x1b[39m", "\x1b[31mZeroDivisionError\x1b[39m: division by zero"],
            },
        }
    )
    assert end.error == ExecutionError(
        "ZeroDivisionError", "division by zero", "----\nZeroDivisionError: division by zero"
    )
    assert end.execution_count == 3
    for bad in ({"status": "fine"}, {"status": "ok", "execution_count": -1}, {"status": "ok", "execution_count": True}):
        with pytest.raises(ProtocolError):
            wire.end({"type": "end", **bad})
    assert strip_ansi("\x1b[38;5;28;01mimport\x1b[39;00m x") == "import x"


def _end(**kw: Any) -> wire.End:
    base: dict[str, Any] = {"status": "ok", "execution_count": None, "error": None, "notes": [], "why": None}
    base.update(exit_code=None, signal=None, oom=False, detail="")
    base.update(kw)
    return wire.End(**base)


def test_what_an_execution_says() -> None:
    assert message(_end(), 60, [], False) == ""
    assert message(_end(status="interrupted", why="timeout"), 2, [], False) == (
        "timed out after 2 s: interrupted; the context's state is kept"
    )
    restarted = message(_end(status="restarted", why="timeout"), 2.5, [], False)
    assert restarted == (
        "timed out after 2.5 s and did not stop when interrupted: the kernel was restarted, its state (variables, "
        "imports) is lost"
    )
    died = message(_end(status="kernel_died", signal=9), 60, [], False)
    assert "killed by SIGKILL: most likely out of memory" in died and "a new kernel starts at the next" in died
    assert "memory limit was reached" in message(_end(status="kernel_died", signal=9), 60, [], True)
    assert "exited with status 3" in message(_end(status="kernel_died", exit_code=3), 60, [], False)
    err = ExecutionError("NameError", "name 'x' is not defined", "")
    assert (
        message(_end(status="error", error=err), 60, [], False) == "the code raised NameError: name 'x' is not defined"
    )
    assert "a new one ran this code" in message(_end(notes=["kernel_replaced"]), 60, [], False)
    assert shown("x = 1\ny = 2") == "run_code: x = 1 ..." and shown("1 + 1") == "run_code: 1 + 1"


def test_the_bridges_first_line() -> None:
    line = {"loom_kernel_bridge": 1, "port": 4000, "token": "t" * 32, "language": "python", "cwd": "/workspace"}
    info = ready_line("ctx-a", json.dumps(line).encode() + b"\n", True, 1.0)
    assert info is not None and (info.port, info.cwd, info.workdir, info.running) == (4000, "/workspace", ".", True)
    assert ready_line("ctx-a", json.dumps(line).encode(), True, 1.0) is None  # (not a whole line yet)
    with pytest.raises(ProtocolError):
        ready_line("ctx-a", b'{"loom_kernel_bridge": 1, "port": "x"}\n', True, 1.0)
    missing = {"loom_kernel_bridge": 1, "error": "missing", "missing": ["ipykernel", "zmq"], "python": "3.9.2"}
    with pytest.raises(KernelUnavailableError) as e:
        ready_line("ctx-a", json.dumps(missing).encode() + b"\n", False, 1.0)
    assert e.value.missing == ["ipykernel", "zmq"] and e.value.code == "kernel_unavailable"
    assert "(Python 3.9.2) cannot import ipykernel, zmq" in str(e.value)
    assert "python3-ipykernel" in str(e.value) and "pip install" in str(e.value) and "pypi" in str(e.value)


def test_the_clis_exit_codes() -> None:
    assert exit_code(Execution()) == 0
    assert exit_code(Execution(outcome="error")) == 1
    assert exit_code(Execution(outcome="interrupted", message="timed out after 2 s: interrupted")) == 124
    assert exit_code(Execution(outcome="restarted", message="timed out after 2 s and did not stop")) == 124
    assert exit_code(Execution(outcome="kernel_died")) == 137
    assert Execution(results=[Result(text="2", is_main_result=True)]).text == "2"


# -- the bridge on this host's python ------------------------------------------------------


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    pytest.importorskip("ipykernel")
    src = bridge_source()
    cwd = tmp_path_factory.mktemp("bridge")
    p = subprocess.Popen([sys.executable, "-c", BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=cwd)
    assert p.stdin is not None and p.stdout is not None
    cfg = {"id": "ctx-t", "language": "python", "kernel": "python3", "workdir": ".", "env": {"FROM_CTX": "yes"}}
    p.stdin.write(b"%d\n" % len(src) + src + json.dumps(cfg).encode() + b"\n")
    p.stdin.close()
    ready = json.loads(p.stdout.readline())
    try:
        yield ready
    finally:
        p.terminate()
        p.wait(30)


class Client:
    def __init__(self, ready: dict[str, Any]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", ready["port"]), timeout=60)
        self.file = self.sock.makefile("rb")
        self.send({"token": ready["token"]})

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def read(self) -> dict[str, Any]:
        return json.loads(self.file.readline())

    def run(self, code: str, timeout: float = 30, grace: float = 2) -> list[dict[str, Any]]:
        self.send({"op": "execute", "code": code, "timeout": timeout, "grace": grace})
        out = []
        while not out or out[-1]["type"] != "end":
            out.append(self.read())
        return out


def test_the_bridge_runs_code_and_keeps_state(bridge: dict[str, Any]) -> None:
    assert bridge["loom_kernel_bridge"] == 1 and bridge["env"] == {"FROM_CTX": "yes"}
    c = Client(bridge)
    assert c.read()["type"] == "hello"
    c.run("x = 41")
    events = c.run("import os\nprint(os.environ['FROM_CTX'])\nx + 1")
    assert [e["type"] for e in events] == ["stdout", "result", "end"], events
    assert events[0]["text"] == "yes\n" and events[1] == {
        "type": "result",
        "data": {"text/plain": "42"},
        "metadata": {},
        "main": True,
    }
    assert events[-1]["status"] == "ok"
    big = c.run("import sys\nsys.stdout.write('x' * (3 << 20))")
    text = "".join(e["text"] for e in big if e["type"] == "stdout")
    assert (
        text
        == "x" * (1 << 20) + f"\n[{2 << 20} more bytes of stdout not kept: an execution keeps 1 MiB of each stream]\n"
    )
    assert big[-1]["cut"] == {"stdout": 2 << 20}
    spun = c.run("while True:\n    pass", timeout=1)
    assert spun[-1]["status"] == "interrupted" and spun[-1]["error"]["name"] == "KeyboardInterrupt"
    assert c.run("x")[0]["data"] == {"text/plain": "41"}
    wrong = Client({**bridge, "token": "0" * 32})
    assert wrong.read() == {"type": "refused", "detail": "wrong token"}
