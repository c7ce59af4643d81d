"""Code contexts through the harness API on the real engine, under runc and gVisor: state
that lasts (and is a context's own), rich results (a matplotlib PNG of the right size, a
DataFrame as HTML and text, displays in order, SVG, JSON), errors without terminal
colours, output cut as documented, a timeout interrupted (state kept) or restarted when
the code ignores SIGINT (state lost), a kernel killed by the memory limit reported and
replaced, files the code writes recorded and undone under its call id."""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.errors import AgentError, KernelUnavailableError
from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import own_registry
from worker.kernels import CodeArgumentError, Execution, OutputMessage, Result
from worker.registry import ToolRegistry

pytestmark = [pytest.mark.docker]


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def registry(runtime: str, docker_ready: None, tmp_path: Path) -> AsyncIterator[ToolRegistry]:
    async with own_registry(tmp_path, runtime) as reg:
        yield reg


def workspace(tmp_path: Path, name: str = "ws") -> Path:
    ws = tmp_path / name
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    return ws


def png_size(b64: str) -> tuple[int, int]:
    """(width, height) of a base64 PNG, from its signature and IHDR chunk."""
    data = base64.b64decode(b64, validate=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_state_lasts_and_is_the_contexts_own(registry: ToolRegistry, tmp_path: Path) -> None:
    handle = registry.sandbox(workspace(tmp_path))
    first = await handle.run_code("x = 41\nimport json")
    assert first.outcome == "ok" and first.results == [] and first.error is None, first
    assert first.context_id == "ctx-python"
    second = await handle.run_code("x + 1")
    assert second.text == "42" and second.results[0].is_main_result, second
    assert second.execution_count == (first.execution_count or 0) + 1
    third = await handle.run_code("json.dumps({'a': x})")  # the import is still there
    assert third.text == "'{\"a\": 41}'", third
    other = await handle.create_code_context()
    assert other.language == "python" and other.id.startswith("ctx-") and other.cwd == "/workspace"
    alone = await handle.run_code("x", context=other)
    assert alone.outcome == "error" and alone.error is not None and alone.error.name == "NameError", alone
    assert (await handle.run_code("x", context="ctx-python")).text == "41"
    ids = [c.id for c in await handle.code_contexts()]
    assert ids == ["ctx-python", other.id]
    await handle.restart_code_context("ctx-python")
    lost = await handle.run_code("x")
    assert lost.error is not None and lost.error.name == "NameError", lost
    await handle.delete_code_context(other)
    assert [c.id for c in await handle.code_contexts()] == ["ctx-python"]
    with pytest.raises(AgentError) as e:
        await handle.run_code("1", context=other.id)
    assert e.value.code == "not_found"
    with pytest.raises(CodeArgumentError) as bad:
        await handle.run_code("1", language="cobol")
    assert bad.value.field == "language"
    with pytest.raises(CodeArgumentError) as bad:
        await handle.run_code("1", timeout=0)
    assert bad.value.field == "timeout"


async def test_a_project_whose_files_are_named_as_standard_modules_still_gets_a_kernel(
    registry: ToolRegistry, tmp_path: Path
) -> None:
    """The bridge starts in the workspace: a project's ``secrets.py`` or ``select.py`` must
    not be imported in place of the standard library's (the kernel never started). The
    code itself still imports the project's own modules, as in Jupyter."""
    ws = workspace(tmp_path)
    for name in ("secrets", "select", "selectors", "signal", "tempfile", "threading"):
        (ws / f"{name}.py").write_text(f"raise RuntimeError('the project {name}.py was imported')\n")
    (ws / "projmod.py").write_text("X = 41\n")
    for p in ws.iterdir():
        os.chown(p, 1000, 1000)
    ex = await registry.sandbox(ws).run_code("import projmod\nprojmod.X + 1")
    assert ex.outcome == "ok" and ex.text == "42", ex


async def test_the_kernel_speaks_over_unix_sockets_not_loopback_ports(registry: ToolRegistry, tmp_path: Path) -> None:
    """ipykernel once died at start with "Address already in use" (CI): the five loopback
    ports picked free for it and let go (jupyter_client's way) can be taken before it binds
    them, by the source port of any connection made meanwhile. Its channels are unix
    sockets in the bridge's own directory now, none a port picked ahead."""
    handle = registry.sandbox(workspace(tmp_path))
    r = await handle.run_code(
        "import zmq\nfrom ipykernel.kernelapp import IPKernelApp\napp = IPKernelApp.instance()\n"
        "print(' '.join(s.getsockopt(zmq.LAST_ENDPOINT).decode() for s in "
        "(app.shell_socket, app.iopub_socket, app.stdin_socket, app.control_socket)))"
    )
    assert r.outcome == "ok", r
    endpoints = "".join(r.logs.stdout).split()
    assert len(endpoints) == 4 and all(e.startswith("ipc:///tmp/loom-kernel-") for e in endpoints), r.text
    hb = await handle.run_code("app.heartbeat.transport, app.heartbeat.ip.startswith('/tmp/loom-kernel-')")
    assert hb.text == "('ipc', True)", hb


async def test_rich_results(registry: ToolRegistry, tmp_path: Path) -> None:
    handle = registry.sandbox(workspace(tmp_path))
    chart = await handle.run_code(
        "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(4, 3), dpi=100)\n"
        "ax.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.show()",
        timeout=120,
    )
    assert chart.outcome == "ok", chart
    pngs = [r for r in chart.results if r.png]
    assert len(pngs) == 1 and not pngs[0].is_main_result, chart.results
    assert png_size(pngs[0].png or "") == (400, 300)
    assert "Figure" in (pngs[0].text or "")

    table = await handle.run_code(
        "import pandas as pd\npd.DataFrame({'name': ['a', 'b'], 'value': [1, 2]})", timeout=120
    )
    main = table.results[-1]
    assert main.is_main_result and main.html and "<table" in main.html and "value" in main.html, table
    assert main.text is not None and "name" in main.text and "value" in main.text

    shown = await handle.run_code(
        "from IPython.display import display, SVG, JSON, Markdown, HTML\n"
        "display('one')\n"
        'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" '
        'height="10"/></svg>\'))\n'
        "display(JSON({'a': [1, 2]}))\n"
        "display(Markdown('**three**'))\n"
        "display(HTML('<b>four</b>'))\n"
        "5"
    )
    rs = shown.results
    assert [r.is_main_result for r in rs] == [False] * 5 + [True], rs
    assert rs[0].text == "'one'"
    assert rs[1].svg is not None and rs[1].svg.startswith("<svg")
    assert rs[2].json == {"a": [1, 2]}
    assert rs[3].markdown == "**three**"
    assert rs[4].html == "<b>four</b>"
    assert rs[5].text == "5"
    assert [f for f in rs[1].formats() if f != "text"] == ["svg"]


async def test_errors_output_and_streaming(registry: ToolRegistry, tmp_path: Path) -> None:
    handle = registry.sandbox(workspace(tmp_path))
    boom = await handle.run_code("def f():\n    return 1 / 0\nf()")
    assert boom.outcome == "error" and boom.error is not None, boom
    assert boom.error.name == "ZeroDivisionError" and boom.error.value == "division by zero"
    assert "\x1b" not in boom.error.traceback and "return 1 / 0" in boom.error.traceback
    assert "ZeroDivisionError" in boom.message

    syntax = await handle.run_code("def (:")
    assert syntax.outcome == "error" and syntax.error is not None and syntax.error.name == "SyntaxError", syntax

    events = [ev async for ev in handle.run_code_stream("import sys\nprint('out')\nprint('err', file=sys.stderr)\n7")]
    kinds = [type(e).__name__ for e in events]
    assert kinds[-1] == "Execution" and "Result" in kinds, kinds
    outs = [e for e in events if isinstance(e, OutputMessage)]
    assert {(o.kind, o.text) for o in outs} == {("stdout", "out\n"), ("stderr", "err\n")}
    ex = events[-1]
    assert isinstance(ex, Execution) and ex.logs.stdout == ["out\n"] and ex.logs.stderr == ["err\n"]
    assert isinstance(events[-2], Result) and events[-2].text == "7"

    big = await handle.run_code("import sys\nfor _ in range(5):\n    sys.stdout.write('x' * (1 << 20))", timeout=120)
    text = "".join(big.logs.stdout)
    assert big.outcome == "ok", big
    kept, _, _marker = text.partition("\n[")
    assert kept == "x" * (1 << 20), len(kept)
    assert "more bytes of stdout not kept: an execution keeps 1 MiB of each stream" in text
    assert f"[{(5 << 20) - (1 << 20)} more bytes" in text


async def test_a_timeout_interrupts_and_then_restarts(registry: ToolRegistry, tmp_path: Path) -> None:
    handle = registry.sandbox(workspace(tmp_path))
    await handle.run_code("kept = 'yes'")
    spun = await handle.run_code("while True:\n    pass", timeout=2)
    assert spun.outcome == "interrupted", spun
    assert spun.error is not None and spun.error.name == "KeyboardInterrupt"
    assert spun.message == "timed out after 2 s: interrupted; the context's state is kept"
    assert (await handle.run_code("kept")).text == "'yes'"

    stubborn = await handle.run_code(
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", timeout=2
    )
    assert stubborn.outcome == "restarted", stubborn
    assert "did not stop when interrupted: the kernel was restarted" in stubborn.message
    assert "state (variables, imports) is lost" in stubborn.message
    gone = await handle.run_code("kept")
    assert gone.outcome == "ok" or (gone.error is not None and gone.error.name == "NameError"), gone
    assert gone.error is not None


@pytest.mark.alone  # (gVisor's out-of-memory kill: see scripts/test)
async def test_a_kernel_that_dies_is_reported_and_replaced(runtime: str, docker_ready: None, tmp_path: Path) -> None:
    async with own_registry(tmp_path, runtime, memory="320m") as registry:
        handle = registry.sandbox(workspace(tmp_path))
        await handle.run_code("x = 1")
        hog = await handle.run_code("blocks = []\nwhile True:\n    blocks.append(b'x' * (32 << 20))", timeout=120)
        assert hog.outcome == "kernel_died", hog
        assert "the kernel died while running the code" in hog.message
        assert "state (variables, imports) is lost" in hog.message
        assert "memory" in hog.message, hog.message
        after = await handle.run_code("x = 2\nx * 21")
        assert after.outcome == "ok" and after.text == "42", after
        if runtime == "runc":  # (under gVisor the whole sandbox went: a fresh default context ran it)
            assert "a new one ran this code, the earlier state (variables, imports) is lost" in after.message
        exited = await handle.run_code("import os\nos._exit(3)")
        assert exited.outcome == "kernel_died" and "exited with status 3" in exited.message, exited
        again = await handle.run_code("1 + 1")
        assert again.text == "2", again
        assert "a new one ran this code" in again.message


async def test_files_the_code_writes_are_recorded_and_undone(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    (ws / "keep.txt").write_text("kept\n")
    handle = registry.sandbox(ws)
    ex = await handle.run_code(
        "from pathlib import Path\nPath('out.csv').write_text('a,b\\n1,2\\n')\nPath('keep.txt').unlink()",
        call_id="exec-1",
    )
    assert ex.outcome == "ok" and ex.call_id == "exec-1", ex
    assert ex.files_changed == ["keep.txt", "out.csv"]
    opened = registry.pool.opened()[ws.resolve()]
    log = await opened.recorder.log(call_id="exec-1")  # type: ignore[attr-defined]
    assert {e.path for e in log} == {"keep.txt", "out.csv"} and all(e.call_id == "exec-1" for e in log), log
    assert {e.tool for e in log} == {"sandbox.run_code"}
    assert await opened.recorder.undo(opened.sandbox, call_id="exec-1") is not None  # type: ignore[attr-defined]
    assert not (ws / "out.csv").exists()
    assert (ws / "keep.txt").read_text() == "kept\n"


async def test_an_image_without_a_kernel_says_what_is_missing(docker_ready: None, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    async with own_registry(tmp_path, "runc") as registry:
        await registry.configure_workspace(ws, {"image": SANDBOX_IMAGE.rsplit(":", 1)[0] + ":minimal"})
        with pytest.raises(KernelUnavailableError) as e:
            await registry.sandbox(ws).run_code("1")
    assert e.value.code == "kernel_unavailable"
    assert "ipykernel" in e.value.missing and "jupyter_client" in e.value.missing
    assert "python3-ipykernel" in str(e.value) and "pip install" in str(e.value)


async def test_contexts_count_against_the_process_budget_and_end_with_the_sandbox(
    runtime: str, docker_ready: None, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    async with own_registry(tmp_path, runtime, max_processes=2) as registry:
        handle = registry.sandbox(ws)
        first = await handle.create_code_context()
        await handle.run_code("1")  # the default context: the second
        with pytest.raises(AgentError) as e:
            await handle.create_code_context()
        assert e.value.code == "limit" and "at most 2" in str(e.value)
        await handle.delete_code_context(first)
        (ws / "sub").mkdir()
        sub = await handle.create_code_context(cwd="sub", env={"MARK": "m"})
        assert sub.cwd == "/workspace/sub"
        assert (await handle.run_code("import os\nos.getcwd(), os.environ['MARK']", context=sub)).text == (
            "('/workspace/sub', 'm')"
        )
        await registry.stop(ws)
        assert await handle.code_contexts() == []  # a new sandbox: no context
        assert (await handle.run_code("2 * 21")).text == "42"  # the default one, made again
