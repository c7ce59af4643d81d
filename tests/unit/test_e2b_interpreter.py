"""The code interpreter's API without Docker (worker.integrations.e2b.interpreter): its
routes answer only the requests for port 49999, loom's events as E2B's server's lines,
``env_vars`` set for one cell in a real IPython and put back, the languages and working
directories offered, and the traffic access token that opens the sandbox's own API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient

from worker import kernels
from worker.auth import Access, Facts, Kind
from worker.integrations.e2b import interpreter
from worker.integrations.e2b.target import JUPYTER_PORT


def test_routes_answer_only_the_interpreters_port() -> None:
    app = FastAPI()
    app.router.routes.extend(interpreter.routes(None))

    @app.get("/health")
    def envd_health() -> PlainTextResponse:  # (envd's, behind the interpreter's)
        return PlainTextResponse("envd", status_code=204)

    with TestClient(app) as client:
        jupyter = {"E2b-Sandbox-Port": str(JUPYTER_PORT)}
        r = client.get("/health", headers=jupyter)
        assert (r.status_code, r.json()) == (200, "OK")
        assert client.get("/health").status_code == 204
        assert client.get("/health", headers={"E2b-Sandbox-Port": "49983"}).status_code == 204
        assert client.get("/health", headers={"E2b-Sandbox-Port": "nope"}).status_code == 204
        other = client.post("/process.Process/Start", headers=jupyter)
        assert (other.status_code, other.json()) == (404, {"detail": "Not Found"})


def test_result_lines_as_e2b_names_them() -> None:
    r = kernels.Result(text="'quoted'", png="iVBOR", is_main_result=True)
    r.extra = {"e2b/data": {"a": [1]}, "e2b/chart": {"type": "line"}, "application/vnd.x": "v"}
    assert interpreter.result_line(r) == {
        "type": "result",
        "text": "quoted",
        "png": "iVBOR",
        "data": {"a": [1]},
        "chart": {"type": "line"},
        "extra": {"application/vnd.x": "v"},
        "is_main_result": True,
    }
    assert interpreter.result_line(kernels.Result(text="'"))["text"] == "'"  # (one quote is no pair)

    out = interpreter.event_lines(kernels.OutputMessage("stderr", "oops\n", 1_700_000_000_123_456_000))
    assert out == [{"type": "stderr", "text": "oops\n", "timestamp": "2023-11-14T22:13:20.123456+00:00"}]

    failed = kernels.Execution(error=kernels.ExecutionError("NameError", "name 'q' is not defined", "tb"))
    failed.execution_count = 3
    assert interpreter.event_lines(failed) == [
        {"type": "number_of_executions", "execution_count": 3},
        {"type": "error", "name": "NameError", "value": "name 'q' is not defined", "traceback": "tb"},
    ]
    restarted = kernels.Execution(outcome="restarted", message="timed out: the kernel was restarted")
    assert interpreter.event_lines(restarted) == [
        {"type": "error", "name": "ContextRestarting", "value": "timed out: the kernel was restarted", "traceback": ""}
    ]
    assert interpreter.event_lines(kernels.Execution(execution_count=1)) == [
        {"type": "number_of_executions", "execution_count": 1}
    ]


def test_languages_and_working_directories() -> None:
    assert interpreter.language_of(None) == "python"
    assert interpreter.language_of(" Python ") == "python"
    with pytest.raises(interpreter.NotOffered, match="'javascript' code is not offered"):
        interpreter.language_of("js")
    with pytest.raises(interpreter.NotOffered, match="'r' code"):
        interpreter.language_of("r")
    assert interpreter.workdir_of(None) == "."
    assert interpreter.workdir_of("/home/user") == "."
    assert interpreter.workdir_of("/home/user/a/../b") == "b"
    assert interpreter.workdir_of("data") == "data"  # (relative to /home/user, as E2B's)
    for outside in ("/tmp", "/home", "/home/user/..", "/workspace/../etc"):
        with pytest.raises(interpreter.NotOffered, match="is not offered"):
            interpreter.workdir_of(outside)


def test_env_vars_hold_for_one_cell_in_ipython() -> None:
    code = "    import os\n    print(os.environ['E2B_A'], os.environ['HOME_X'])"
    cell = interpreter.with_env(code, {"E2B_A": "1", "HOME_X": "it's"})
    assert interpreter.with_env("x = 1", {}) == "x = 1"
    assert cell.startswith("    exec(") and cell.count("\n") == 2  # one line before the code, as indented
    script = textwrap.dedent(
        f"""
        import json, os
        from IPython.core.interactiveshell import InteractiveShell
        os.environ["HOME_X"] = "before"
        os.environ.pop("E2B_A", None)
        sh = InteractiveShell.instance()
        ok = sh.run_cell({cell!r}).success
        after = [os.environ.get("E2B_A"), os.environ.get("HOME_X")]
        failing = sh.run_cell({interpreter.with_env("raise ValueError('x')", {"E2B_A": "2"})!r})
        clean = not {{"env", "saved", "restore", "ip"}} & set(sh.user_ns)
        print(json.dumps([ok, after, failing.success, os.environ.get("E2B_A"), clean]))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "1 it's"  # set for the cell
    ok, after, failing_ok, after_failing, clean = json.loads(lines[-1])
    assert ok is True and after == [None, "before"]  # and put back after it
    assert failing_ok is False and after_failing is None  # also when the cell raised
    assert clean  # (the setting's names are not the user's)


def test_traffic_token_header_opens_its_sandbox_only() -> None:
    access = Access("service-token")
    token = access.envd_token("i1")  # (the control plane's trafficAccessToken too)

    def facts(headers: dict[str, str], sandbox: str = "i1") -> Facts:
        # (ASGI names headers in lower case)
        raw = [(k.lower().encode(), v.encode()) for k, v in {"e2b-sandbox-id": sandbox, **headers}.items()]
        return Facts.of({"type": "http", "method": "POST", "headers": [(b"host", b"127.0.0.1:8"), *raw]})

    assert access.check(facts({"E2B-Traffic-Access-Token": token}), Kind.E2B_SANDBOX) is None
    assert access.check(facts({"X-Access-Token": token}), Kind.E2B_SANDBOX) is None
    other = access.check(facts({"E2B-Traffic-Access-Token": token}, sandbox="i2"), Kind.E2B_SANDBOX)
    assert other is not None and other.status == 401 and other.e2b
    # X-Access-Token is read first: a wrong one is not saved by a right traffic token.
    both = facts({"X-Access-Token": "wrong", "E2B-Traffic-Access-Token": token})
    assert access.check(both, Kind.E2B_SANDBOX) is not None
    control = access.check(facts({"E2B-Traffic-Access-Token": token}), Kind.E2B)  # (not the API key)
    assert control is not None and control.status == 401


class _Client:
    """An ASGI client of one response: what it was sent, and it goes away (``http.disconnect``)
    once it has ``leave_after`` body chunks (never: None)."""

    def __init__(self, leave_after: int | None) -> None:
        self.leave_after = leave_after
        self.chunks: list[bytes] = []
        self.got = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        while self.leave_after is None or len(self.chunks) < self.leave_after:
            self.got.clear()
            await self.got.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            self.chunks.append(message["body"])
            self.got.set()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in b"".join(self.chunks).decode().splitlines()]


async def _serve(events: AsyncIterator[kernels.CodeEvent], client: _Client) -> tuple[list[str], bool]:
    """``events`` streamed to ``client``: what was interrupted, whether the slot was given back."""
    interrupted: list[str] = []
    released: list[bool] = []

    async def interrupt() -> None:
        interrupted.append("ctx-python")

    stack = contextlib.AsyncExitStack()
    stack.callback(released.append, True)
    stream = interpreter.ExecutionStream(events, interrupt, stack)
    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/execute", "headers": []}
    await stream(scope, client.receive, client.send)
    return interrupted, released == [True]


async def test_a_stream_keeps_alive_and_ends_as_e2bs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpreter, "KEEPALIVE", 0.01)
    client = _Client(leave_after=None)

    async def events() -> AsyncIterator[kernels.CodeEvent]:
        yield kernels.OutputMessage("stdout", "a\n", 1)
        while not any(b"keepalive" in chunk for chunk in client.chunks):  # (the code is quiet a while)
            await client.got.wait()
        yield kernels.Result(text="2", is_main_result=True)
        yield kernels.Execution(execution_count=1)

    interrupted, released = await _serve(events(), client)
    kinds = [line["type"] for line in client.lines()]
    assert kinds[:2] == ["stdout", "keepalive"]
    assert [k for k in kinds if k != "keepalive"] == ["stdout", "result", "number_of_executions", "end_of_execution"]
    assert interrupted == [] and released


async def test_a_client_gone_interrupts_the_execution() -> None:
    closed: list[bool] = []

    async def events() -> AsyncIterator[kernels.CodeEvent]:
        try:
            yield kernels.OutputMessage("stdout", "working\n", 1)
            await asyncio.Event().wait()  # (the code runs on)
            yield kernels.Execution()
        finally:
            closed.append(True)

    client = _Client(leave_after=1)
    interrupted, released = await _serve(events(), client)
    assert [line["type"] for line in client.lines()] == ["stdout"]
    assert interrupted == ["ctx-python"] and released and closed == [True]


async def test_the_sandbox_lost_mid_stream_is_an_unexpected_end() -> None:
    from sandbox.errors import SandboxLostError

    async def events() -> AsyncIterator[kernels.CodeEvent]:
        yield kernels.OutputMessage("stderr", "x", 1)
        raise SandboxLostError("the container stopped")

    client = _Client(leave_after=None)
    interrupted, released = await _serve(events(), client)
    lines = client.lines()
    assert [line["type"] for line in lines] == ["stderr", "error", "end_of_execution"]
    assert lines[1]["name"] == "UnexpectedEndOfExecution" and "the container stopped" in lines[1]["value"]
    assert interrupted == [] and released
