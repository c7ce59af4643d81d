"""E2B's code interpreter SDK (``e2b_code_interpreter.Sandbox``, unchanged) against loom
on the real engine, under runc and gVisor: ``run_code`` keeps state between calls, shows
a matplotlib chart as a PNG, reports an error by name, value and traceback, calls its
callbacks as the output comes, sets ``envs`` for one execution; what the code writes is
in the workspace's changelog; contexts are created, listed, restarted and removed; a
client that gives up (its timeout) interrupts the code, as E2B's server does."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from tests.docker.e2b.conftest import E2BServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def _changelog(server: E2BServer, sandbox_id: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{server.url}/v1/workspaces/{sandbox_id}/changelog",
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=60,
    )
    r.raise_for_status()
    entries: list[dict[str, Any]] = r.json()
    return entries


def test_run_code(e2b_server_runtime: E2BServer) -> None:
    from e2b_code_interpreter import OutputMessage, Result, Sandbox

    server = e2b_server_runtime
    sbx = Sandbox.create()
    try:
        # State across calls; the callbacks as the output comes; the main result's text.
        out: list[OutputMessage] = []
        err: list[OutputMessage] = []
        shown: list[Result] = []
        ex = sbx.run_code(
            "import sys\nx = 41\nprint('hello')\nprint('careful', file=sys.stderr)\nx + 1",
            on_stdout=out.append,
            on_stderr=err.append,
            on_result=shown.append,
        )
        assert ex.error is None
        assert ex.text == "42"
        assert ex.logs.stdout == ["hello\n"] and ex.logs.stderr == ["careful\n"]
        assert [m.line for m in out] == ["hello\n"] and not out[0].error
        assert [m.line for m in err] == ["careful\n"] and err[0].error
        assert len(shown) == 1 and shown[0].is_main_result and shown[0].text == "42"
        assert ex.execution_count == 1
        again = sbx.run_code("x * 2")
        assert again.text == "82" and again.execution_count == 2
        assert sbx.run_code("'a string'").text == "a string"  # (its quotes off, as E2B's server)

        # A matplotlib chart: a PNG result.
        chart = sbx.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()"
        )
        assert chart.error is None
        pngs = [r.png for r in chart.results if r.png]
        assert len(pngs) == 1
        assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
        assert "png" in chart.results[0].formats()

        # An error: its name, value and traceback; on_error called with it.
        errors: list[Any] = []
        bad = sbx.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
        assert bad.error is not None
        assert (bad.error.name, bad.error.value) == ("ZeroDivisionError", "division by zero")
        assert "return 1 / 0" in bad.error.traceback and "ZeroDivisionError" in bad.error.traceback
        assert errors == [bad.error]
        assert not bad.results

        # envs for one execution, gone after it.
        assert sbx.run_code("import os\nos.environ['E2B_TEST_VAR']", envs={"E2B_TEST_VAR": "set"}).text == "set"
        assert sbx.run_code("str(os.environ.get('E2B_TEST_VAR'))").text == "None"

        # A file the code writes is the workspace's, in its changelog as the execution's.
        wrote = sbx.run_code("open('from_code.txt', 'w').write('written by run_code')")
        assert wrote.error is None
        assert (server.workspace(sbx.sandbox_id) / "from_code.txt").read_text() == "written by run_code"
        entries = [e for e in _changelog(server, sbx.sandbox_id) if e["path"] == "from_code.txt"]
        assert len(entries) == 1
        assert entries[0]["op"] == "create" and entries[0]["tool"] == "e2b.run_code"
    finally:
        sbx.kill()


def test_contexts_and_timeout(e2b_server_runtime: E2BServer) -> None:
    from e2b import NotFoundException, SandboxException, TimeoutException
    from e2b_code_interpreter import Sandbox

    server = e2b_server_runtime
    sbx = Sandbox.create()
    try:
        assert sbx.run_code("import os\nos.makedirs('sub')\ny = 'default'").error is None
        ctx = sbx.create_code_context(cwd="/home/user/sub")
        assert ctx.language == "python" and ctx.cwd == "/home/user/sub" and ctx.id.startswith("ctx-")
        # Its own state, its own directory (the workspace's sub).
        assert sbx.run_code("y = 5\nopen('here.txt', 'w').write('ctx')", context=ctx).error is None
        assert sbx.run_code("y", context=ctx).text == "5"
        assert sbx.run_code("y").text == "default"
        assert (server.workspace(sbx.sandbox_id) / "sub" / "here.txt").read_text() == "ctx"

        listed = {c.id: c for c in sbx.list_code_contexts()}
        assert ctx.id in listed and listed[ctx.id].cwd == "/home/user/sub"
        assert "ctx-python" in listed and listed["ctx-python"].cwd == "/home/user"

        sbx.restart_code_context(ctx)  # a new kernel: the state is gone
        assert sbx.run_code("'y' in globals()", context=ctx).text == "False"

        sbx.remove_code_context(ctx.id)
        assert ctx.id not in {c.id for c in sbx.list_code_contexts()}
        with pytest.raises(NotFoundException):
            sbx.run_code("1", context=ctx)
        with pytest.raises(NotFoundException):
            sbx.restart_code_context(ctx.id)

        # What loom does not offer: said, with its status.
        with pytest.raises(SandboxException, match=r"501.*'javascript' code is not offered"):
            sbx.create_code_context(language="js")
        with pytest.raises(SandboxException, match=r"501.*/tmp is not offered"):
            sbx.create_code_context(cwd="/tmp")

        # A client that gives up interrupts the code (its state kept): the loop, had it run
        # on (a minute), would have set `finished` before the next call could run.
        assert sbx.run_code("z = 'kept'").error is None
        with pytest.raises(TimeoutException):
            sbx.run_code("import time\nfor _ in range(1200):\n    time.sleep(0.05)\nfinished = True", timeout=2)
        after = sbx.run_code("('finished' in globals(), z)")
        assert after.error is None and after.text == "(False, 'kept')"
    finally:
        sbx.kill()
