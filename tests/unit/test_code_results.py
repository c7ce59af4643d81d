"""``run_code``'s result as each surface shows it, without a kernel: an execution (the
harness's :class:`worker.kernels.Execution`, made by hand here) becomes the text a model reads, the
images it sees, and ``data``; the images become MCP ``ImageContent``, Anthropic image
blocks and HTTP ``images``; the caps hold."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import pytest

from worker import kernels
from worker.content import anthropic_content, anthropic_tool_result, mcp_content, tool_text
from worker.kernels import ExecutionError as Error
from worker.kernels import Logs, Result
from worker.kernels.toolresult import MAX_VALUE_CHARS, execution_result, image_size
from worker.native.calls import anthropic_result
from worker.result import MAX_IMAGE_CHARS, MAX_IMAGES, MAX_OUTPUT_BYTES, ToolImage, ToolResult, fit_images
from worker.service import result_dict


def png(width: int, height: int, *, noise: int = 0) -> str:
    """A real PNG (grey, ``noise`` extra random-ish bytes in a text chunk), base64."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    parts = [
        b"\x89PNG\r\n\x1a\n",
        chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)),
        chunk(b"IDAT", zlib.compress(raw)),
    ]
    if noise:
        parts.append(chunk(b"tEXt", b"x\x00" + bytes(i * 7 % 251 for i in range(noise))))
    parts.append(chunk(b"IEND", b""))
    return base64.b64encode(b"".join(parts)).decode()


def jpeg_header(width: int, height: int) -> str:
    """The start of a JPEG up to its frame header (enough to read its size)."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return base64.b64encode(b"\xff\xd8" + app0 + sof + b"\xff\xd9").decode()


def Execution(**fields: Any) -> kernels.Execution:
    fields.setdefault("execution_count", 3)
    fields.setdefault("context_id", "python-default")
    return kernels.Execution(**fields)


CHART = png(640, 480)


# -- image sizes ---------------------------------------------------------------------------


def test_image_sizes_are_read_from_the_headers() -> None:
    assert image_size("image/png", CHART) == (640, 480)
    assert image_size("image/jpeg", jpeg_header(800, 600)) == (800, 600)
    gif = base64.b64encode(b"GIF89a" + struct.pack("<HH", 33, 17) + b"\x00" * 8).decode()
    assert image_size("image/gif", gif) == (33, 17)
    assert image_size("image/png", "not base64!") is None
    assert image_size("image/png", base64.b64encode(b"nope").decode()) is None
    assert image_size("image/webp", CHART) is None


# -- the text, the images, data ------------------------------------------------------------


def test_stdout_the_main_result_and_a_chart() -> None:
    ex = Execution(
        logs=Logs(stdout=["loading\n", "done\n"]),
        results=[
            Result(text="<Figure size 640x480 with 1 Axes>", png=CHART),
            Result(text="42", is_main_result=True),
        ],
    )
    r = execution_result(ex)
    assert r.success and r.error is None
    assert r.output == "loading\ndone\n<Figure size 640x480 with 1 Axes>\n[image 1: image/png 640x480]\nOut[3]: 42"
    assert r.images == [ToolImage("image/png", CHART, 640, 480)]
    d = r.data or {}
    assert d["outcome"] == "ok" and d["execution_count"] == 3 and d["context_id"] == "python-default"
    assert d["results"][0] == {
        "formats": ["text/plain", "image/png"],
        "is_main_result": False,
        "images": [0],
        "text": "<Figure size 640x480 with 1 Axes>",
        "truncated": False,
    }
    assert "png" not in d["results"][0]  # the image's bytes travel once: in images
    assert d["results"][1]["is_main_result"] is True and d["results"][1]["text"] == "42"


def test_a_dataframe_keeps_its_text_for_the_model_and_its_html_for_programs() -> None:
    table = "   a  b\n0  1  2"
    html = "<table><tr><td>1</td><td>2</td></tr></table>"
    r = execution_result(Execution(results=[Result(text=table, html=html, is_main_result=True)]))
    assert r.output == f"Out[3]: {table}\n[text/html {len(html)} B]"
    res = (r.data or {})["results"][0]
    assert res["html"] == html and res["text"] == table and res["formats"] == ["text/plain", "text/html"]


def test_a_display_objects_repr_gives_way_to_its_readable_source() -> None:
    md = Result(text="<IPython.core.display.Markdown object>", markdown="# Title\n\nbody")
    html = Result(text="<IPython.core.display.HTML object>", html="<b>x</b>")
    js = Result(json={"a": [1, 2]})
    svg = Result(text="<IPython.core.display.SVG object>", svg="<svg/>")
    r = execution_result(Execution(results=[md, html, js, svg]))
    assert r.output.split("\n") == [
        "# Title",
        "",
        "body",
        "[text/html 8 B]",
        '{\n "a": [\n  1,\n  2\n ]\n}'.split("\n")[0],
        *'{\n "a": [\n  1,\n  2\n ]\n}'.split("\n")[1:],
        "[image/svg+xml 6 B]",
    ]
    assert r.images == []  # an SVG is text: not an image block (neither API takes SVG)
    assert (r.data or {})["results"][3]["svg"] == "<svg/>"
    # "extra" holds other MIME types, and a "metadata" entry that is not one
    r = execution_result(Execution(results=[Result(text="t", extra={"metadata": {"w": 1}, "application/x-y": "z"})]))
    assert r.output == "t\n[application/x-y 1 B]"


def test_display_order_is_kept_and_images_are_numbered_in_it() -> None:
    second = png(10, 20)
    results = [
        Result(text="a"),
        Result(png=CHART),
        Result(text="b"),
        Result(jpeg=jpeg_header(5, 6)),
        Result(png=second),
    ]
    r = execution_result(Execution(results=results))
    assert r.output == "a\n[image 1: image/png 640x480]\nb\n[image 2: image/jpeg 5x6]\n[image 3: image/png 10x20]"
    assert [i.mime_type for i in r.images] == ["image/png", "image/jpeg", "image/png"]
    assert [res.get("images") for res in (r.data or {})["results"]] == [None, [0], None, [1], [2]]


def test_an_error_is_a_failure_with_its_name_value_and_traceback() -> None:
    tb = (
        "---------------------------------------------------------------------------\n"
        "ZeroDivisionError                         Traceback (most recent call last)\n"
        "Cell In[3], line 1\n----> 1 1/0\n\nZeroDivisionError: division by zero"
    )
    ex = Execution(
        logs=Logs(stdout=["before\n"]), error=Error("ZeroDivisionError", "division by zero", tb), outcome="error"
    )
    r = execution_result(ex)
    assert not r.success and r.error == "ZeroDivisionError: division by zero"
    assert r.output == "before\n" + tb
    assert (r.data or {})["error"] == {"name": "ZeroDivisionError", "value": "division by zero", "traceback": tb}
    # the error line is added when the traceback lacks it
    r = execution_result(Execution(error=Error("SyntaxError", "invalid syntax", "  File x\n    1 +"), outcome="error"))
    assert r.output.endswith("SyntaxError: invalid syntax") and r.error == "SyntaxError: invalid syntax"
    assert tool_text(r) == r.output  # (it names the error already)


@pytest.mark.parametrize("outcome", ["interrupted", "restarted", "kernel_died"])
def test_a_timeout_restart_or_dead_kernel_says_what_state_was_lost(outcome: str) -> None:
    r = execution_result(Execution(logs=Logs(stdout=["tick\n"]), outcome=outcome))
    assert not r.success and r.error
    assert r.output.startswith("tick\n[") and r.error in r.output
    if outcome == "interrupted":
        assert "state is kept" in r.error
    else:
        assert "lost" in r.error
    # an interrupt's KeyboardInterrupt is shown, the message says what happened
    kb = Error("KeyboardInterrupt", "", "KeyboardInterrupt")
    r = execution_result(Execution(error=kb, outcome=outcome))
    assert r.error == r.output.split("\n")[-1][1:-1] and "KeyboardInterrupt\n[" in r.output
    # the harness's own message wins
    r = execution_result(Execution(outcome=outcome, message="Timed out after 2s; restarted: x was lost"))
    assert r.error == "Timed out after 2s; restarted: x was lost" and r.output == f"[{r.error}]"


def test_nothing_printed_and_no_value() -> None:
    r = execution_result(Execution(results=[]))
    assert r.success and r.output == "(no output)" and r.images == []


def test_files_changed_and_stderr() -> None:
    r = execution_result(Execution(logs=Logs(stdout=["a"], stderr=["warn\n"]), files_changed=["out.csv"]))
    assert r.output == "a\n[stderr]\nwarn\n" and r.files_changed == ["out.csv"]
    assert (r.data or {})["stderr"] == "warn\n"


# -- caps ----------------------------------------------------------------------------------


def test_the_text_is_capped_like_every_tools_and_data_values_are_bounded() -> None:
    big = "x" * (5 << 20)
    ex = Execution(logs=Logs(stdout=[big]), results=[Result(html="<p>" + big, text="t", is_main_result=True)])
    r = execution_result(ex).capped()
    assert len(r.output.encode()) <= MAX_OUTPUT_BYTES and "bytes omitted" in r.output
    d = r.data or {}
    assert d["output_truncated"] is True and d["truncated"] is True
    assert len(d["stdout"]) <= 256 * 1024 + 100
    res = d["results"][0]
    assert res["truncated"] is True and len(res["html"]) <= MAX_VALUE_CHARS + 100


def test_images_over_the_limits_are_named_not_attached() -> None:
    huge = png(100, 100, noise=MAX_IMAGE_CHARS)  # over the per-image limit once base64
    many = [Result(png=png(2, 2)) for _ in range(MAX_IMAGES + 1)]
    r = execution_result(Execution(results=[Result(png=huge), *many]))
    assert len(r.images) == MAX_IMAGES
    lines = r.output.split("\n")
    assert lines[0].startswith("[image/png 100x100: too large to attach (") and "save it to a file" in lines[0]
    assert lines[1] == "[image 1: image/png 2x2]"
    assert lines[-1].startswith(f"[image/png 2x2: not attached: a result carries at most {MAX_IMAGES} images")
    res = (r.data or {})["results"]
    assert "too large" in res[0]["omitted"]["image/png"] and "images" not in res[0]


def test_capped_drops_images_past_the_limits_and_counts_them() -> None:
    images = [ToolImage("image/png", CHART)] * (MAX_IMAGES + 2) + [ToolImage("image/svg+xml", "PHN2Zy8+")]
    r = ToolResult.ok("x", images=images).capped()
    assert len(r.images) == MAX_IMAGES and (r.data or {})["images_dropped"] == 3
    kept, dropped = fit_images([ToolImage("image/png", "A" * (MAX_IMAGE_CHARS + 4))])
    assert kept == [] and len(dropped) == 1


# -- every surface -------------------------------------------------------------------------


def chart_result() -> ToolResult:
    return execution_result(Execution(results=[Result(text="<Figure>", png=CHART)])).capped()


def test_mcp_content_is_the_text_then_an_image_block_per_image() -> None:
    r = chart_result()
    assert mcp_content(r) == [
        {"type": "text", "text": "<Figure>\n[image 1: image/png 640x480]"},
        {"type": "image", "data": CHART, "mimeType": "image/png"},
    ]
    assert mcp_content(ToolResult.ok("plain")) == [{"type": "text", "text": "plain"}]


def test_anthropic_tool_result_has_base64_image_blocks() -> None:
    r = chart_result()
    block = anthropic_tool_result("toolu_1", r)
    assert block == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [
            {"type": "text", "text": "<Figure>\n[image 1: image/png 640x480]"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": CHART}},
        ],
        "is_error": False,
    }
    # the native tools' helper answers with the same blocks
    assert anthropic_result("toolu_1", r)["content"] == block["content"]
    # a failure still shows its chart, after the error
    failed = ToolResult(False, "Traceback...", None, [], "ValueError: x", [ToolImage("image/png", CHART, 640, 480)])
    content = anthropic_content(failed)
    assert content[0]["text"].startswith("Error: ValueError: x\n") and content[1]["type"] == "image"


def test_anthropic_blocks_validate_against_the_sdks_types() -> None:
    from anthropic.types import ToolResultBlockParam
    from pydantic import TypeAdapter

    TypeAdapter(ToolResultBlockParam).validate_python(anthropic_tool_result("toolu_1", chart_result()))


def test_http_and_json_carry_images_only_when_there_are_any() -> None:
    r = chart_result()
    assert result_dict(r)["images"] == [{"mime_type": "image/png", "data": CHART, "width": 640, "height": 480}]
    assert r.to_dict()["images"] == result_dict(r)["images"]
    plain = ToolResult.ok("x")
    assert "images" not in result_dict(plain) and "images" not in plain.to_dict()
