"""An execution of code in the call journal: its outputs kept for the timeline (in order,
the richest format of each result, images as base64), bounded, with secrets masked; a
call of any other tool has none."""

from __future__ import annotations

import base64
from pathlib import Path

from worker.calls import CallJournal, brief_outputs, page
from worker.calls.outputs import MAX_HTML_CHARS, MAX_OUTPUTS_CHARS, MAX_TEXT_CHARS
from worker.kernels.toolresult import execution_result
from worker.result import ToolImage, ToolResult

try:  # tests/unit may or may not be a package
    from .test_code_results import CHART, Error, Execution, Logs, Result, png
except ImportError:
    from test_code_results import CHART, Error, Execution, Logs, Result, png  # type: ignore[no-redef]


def test_a_chart_a_table_and_an_error_in_the_journal(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    ex = Execution(
        logs=Logs(stdout=["hello\n"], stderr=["careful\n"]),
        results=[
            Result(text="<Figure size 640x480 with 1 Axes>", png=CHART),
            Result(text="   a\n0  1", html="<table><td>1</td></table>", is_main_result=True),
        ],
        error=Error("ValueError", "bad", "Traceback\nValueError: bad"),
        outcome="error",
    )
    result = execution_result(ex).capped()
    journal = CallJournal(tmp_path / "data")
    journal.record(root, "run_code", {"code": "plot()"}, result, 5.0, call_id="c1", subtask_id=None)
    journal.close()
    [rec], _ = page(journal.directory(root))
    assert rec["tool"] == "run_code" and rec["args"] == {"code": "plot()"} and rec["success"] is False
    assert rec["outputs"] == [
        {"kind": "stdout", "text": "hello\n"},
        {"kind": "stderr", "text": "careful\n"},
        {
            "kind": "result",
            "main": False,
            "mime_type": "image/png",
            "data": CHART,
            "width": 640,
            "height": 480,
            "text": "<Figure size 640x480 with 1 Axes>",
        },
        {"kind": "result", "main": True, "mime_type": "text/html", "text": "<table><td>1</td></table>"},
        {"kind": "error", "name": "ValueError", "value": "bad", "traceback": "Traceback\nValueError: bad"},
    ]


def test_other_tools_have_no_outputs(tmp_path: Path) -> None:
    assert brief_outputs(ToolResult.ok("x", {"exit_code": 0})) is None
    root = tmp_path / "ws"
    root.mkdir()
    journal = CallJournal(tmp_path / "data")
    journal.record(root, "shell_execute", {"command": "ls"}, ToolResult.ok("x"), 1.0, call_id="c", subtask_id=None)
    journal.close()
    [rec], _ = page(journal.directory(root))
    assert "outputs" not in rec


def test_richest_format_first_svg_as_an_image_then_markdown() -> None:
    svg = "<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'/>"
    r = execution_result(
        Execution(results=[Result(text="<SVG>", svg=svg), Result(text="t", markdown="*m*"), Result(text="plain")])
    )
    outs = brief_outputs(r)
    assert outs is not None
    assert outs[0]["mime_type"] == "image/svg+xml" and base64.b64decode(outs[0]["data"]).decode() == svg
    assert outs[1] == {"kind": "result", "main": False, "mime_type": "text/markdown", "text": "*m*"}
    assert outs[2] == {"kind": "result", "main": False, "mime_type": "text/plain", "text": "plain"}


def test_outputs_are_bounded_and_secrets_masked() -> None:
    big = "x" * (1 << 20)
    results = [Result(html="<p>" + big), *[Result(png=png(50, 50, noise=60_000)) for _ in range(6)]]
    ex = Execution(logs=Logs(stdout=["API_KEY=sk-abcdef123456 " + big]), results=results, outcome="restarted")
    outs = brief_outputs(execution_result(ex).capped())
    assert outs is not None
    size = sum(len(str(o.get("text", ""))) + len(str(o.get("data", ""))) for o in outs)
    assert size <= MAX_OUTPUTS_CHARS
    assert outs[0]["kind"] == "stdout" and "sk-abcdef" not in outs[0]["text"] and "[redacted]" in outs[0]["text"]
    assert len(outs[0]["text"]) <= MAX_TEXT_CHARS + 40
    assert outs[1]["mime_type"] == "text/html" and len(outs[1]["text"]) <= MAX_HTML_CHARS + 40
    images = [o for o in outs if o.get("mime_type") == "image/png"]
    notes = [o for o in outs if o["kind"] == "note"]
    assert 1 <= len(images) < 6 and any("too large for the timeline" in n["text"] for n in notes)
    assert "lost" in notes[-1]["text"]  # the restart's message closes it


def test_an_image_index_out_of_range_is_ignored() -> None:
    r = ToolResult.ok("x", {"results": [{"images": [3], "text": "t"}]}, images=[ToolImage("image/png", CHART)])
    assert brief_outputs(r) == [{"kind": "result", "main": False, "mime_type": "text/plain", "text": "t"}]
