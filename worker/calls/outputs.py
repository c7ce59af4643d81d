"""What an execution of code showed, as the call journal keeps it for the timeline: bounded.

A ``run_code`` call (or the harness's execution: any result whose ``data`` has
``results``, the shape of :mod:`worker.kernels.toolresult`) gets ``outputs`` in its record,
in order::

    {"kind": "stdout" | "stderr", "text"}
    {"kind": "result", "main": bool, "mime_type", "text"}       text/plain, text/html,
                                                                 text/markdown, text/latex,
                                                                 application/json
    {"kind": "result", "main": bool, "mime_type", "data", "width", "height", "text"}
                                                                 an image (base64): PNG,
                                                                 JPEG, or SVG
    {"kind": "error", "name", "value", "traceback"}
    {"kind": "note", "text"}                                     what was left out, and why

Each result is shown in its richest format (an image, then SVG, HTML, Markdown, LaTeX,
JSON, plain text), as a notebook shows it; ``text`` beside an image is its plain text.
Texts are cut (:data:`MAX_TEXT_CHARS`, HTML :data:`MAX_HTML_CHARS`) with credentials
masked as in the arguments, and a record's outputs hold at most :data:`MAX_OUTPUTS_CHARS`
characters in all: an image that does not fit becomes a note (the call's own result had
it; the journal is a history to look at, bounded per workspace).
"""

from __future__ import annotations

import base64
from typing import Any

from ..result import ToolResult
from .brief import cut, mask_secrets

#: The most characters one record's outputs hold (images' base64 included).
MAX_OUTPUTS_CHARS = 256 * 1024
#: Characters kept of a text (stdout, stderr, a plain, Markdown or LaTeX result, a traceback).
MAX_TEXT_CHARS = 8 * 1024
#: Characters kept of an HTML result (a table of a few hundred rows).
MAX_HTML_CHARS = 64 * 1024
#: The richest first: the format a result is shown in.
RICHEST = ("svg", "html", "markdown", "latex", "json", "text")
_MIME = {
    "svg": "image/svg+xml",
    "html": "text/html",
    "markdown": "text/markdown",
    "latex": "text/latex",
    "json": "application/json",
    "text": "text/plain",
}


def _cut(text: str, limit: int) -> str:
    return cut(mask_secrets(text), limit)


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_OUTPUTS_CHARS
        self.out: list[dict[str, Any]] = []

    def add(self, part: dict[str, Any], size: int) -> bool:
        if size > self.left:
            return False
        self.left -= size
        self.out.append(part)
        return True

    def text(self, kind: str, text: str, limit: int = MAX_TEXT_CHARS, **more: Any) -> None:
        shown = _cut(text, min(limit, max(0, self.left - 64)))
        if shown:
            self.add({"kind": kind, **more, "text": shown}, len(shown) + 64)

    def note(self, text: str) -> None:
        self.out.append({"kind": "note", "text": text})


def brief_outputs(result: ToolResult) -> list[dict[str, Any]] | None:
    """The ``outputs`` of a call's record (see the module docstring), or None when the
    result is not an execution's."""
    data = result.data or {}
    results = data.get("results")
    if not isinstance(results, list):
        return None
    budget = _Budget()
    for stream in ("stdout", "stderr"):
        text = data.get(stream)
        if isinstance(text, str) and text:
            budget.text(stream, text)
    for res in results:
        if isinstance(res, dict):
            _result(budget, res, result)
    error = data.get("error")
    if isinstance(error, dict):
        tb = str(error.get("traceback") or "")
        shown = _cut(tb, MAX_TEXT_CHARS)
        value = _cut(str(error.get("value")), 1024)
        part = {"kind": "error", "name": _cut(str(error.get("name")), 256), "value": value, "traceback": shown}
        budget.add(part, len(shown) + len(value) + 320)
    message = data.get("message")
    if isinstance(message, str) and message and data.get("outcome") not in (None, "ok", "error"):
        budget.note(_cut(message, 1024))
    return budget.out


def _result(budget: _Budget, res: dict[str, Any], result: ToolResult) -> None:
    main = bool(res.get("is_main_result"))
    text = res.get("text")
    plain = text if isinstance(text, str) else ""
    for index in res.get("images") or []:
        if not isinstance(index, int) or not 0 <= index < len(result.images):
            continue
        image = result.images[index]
        part = {
            "kind": "result",
            "main": main,
            "mime_type": image.mime_type,
            "data": image.data,
            "width": image.width,
            "height": image.height,
            "text": _cut(plain, 256),
        }
        if budget.add(part, len(image.data) + 400):
            return
        budget.note(f"[{image.describe()}, {len(image.data) * 3 // 4} bytes: too large for the timeline]")
        break  # shown as its next format
    for name in RICHEST:
        value = res.get(name)
        if not isinstance(value, str) or not value:
            continue
        if name == "svg":
            encoded = base64.b64encode(value.encode("utf-8", "replace")).decode()
            part = {"kind": "result", "main": main, "mime_type": _MIME[name], "data": encoded, "text": _cut(plain, 256)}
            if budget.add(part, len(encoded) + 400):
                return
            budget.note(f"[image/svg+xml, {len(value)} characters: too large for the timeline]")
            continue  # shown as its next format
        limit = MAX_HTML_CHARS if name == "html" else MAX_TEXT_CHARS
        budget.text("result", value, limit, main=main, mime_type=_MIME[name])
        return
    omitted = res.get("omitted")
    if isinstance(omitted, dict) and omitted:
        budget.note("[" + "; ".join(f"{k}: {v}" for k, v in omitted.items()) + "]")
