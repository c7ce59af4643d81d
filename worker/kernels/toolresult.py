"""An execution of code (the harness's ``Execution``) as the ToolResult a model reads.

Pure: no sandbox, no kernel. ``run_code`` (:mod:`worker.tools.code`) answers with it, and
the harness journals its executions with it, so each keeps its outputs in the timeline.

``output`` (the text; capped at 10 KB by the registry as every tool's) is, in order: the
code's stdout, its stderr under ``[stderr]``, each result (the main result, the value of
the last expression, as ``Out[n]: <text/plain>``; a displayed object as its
``text/plain``; each of its other formats named in brackets: ``[image 1: image/png
640x480]``, ``[text/html 3.1 KB]``), the error's traceback, and for a timeout, a restart
or a kernel that died, a line saying what happened and what state was lost.

Raster images (PNG, JPEG) go in ``ToolResult.images``, each once, in the order they are
named (``image 1`` first), for the surfaces that show a model images (see
:mod:`worker.content`); one over the limits (:func:`worker.result.fit_images`) is named
with the reason instead. ``data`` holds the rest, structured, each rich value at most
:data:`MAX_VALUE_CHARS`::

    outcome           ok | error | interrupted | restarted | kernel_died
    execution_count   the kernel's counter (In [n])       context_id  the context it ran in
    stdout, stderr    what the code printed (head and tail kept, MAX_STREAM_CHARS each)
    error             {name, value, traceback} or null     message  what happened, for the model
    results           one per result, in order: {formats: [MIME types], is_main_result,
                      text, html, markdown, svg, latex, json, javascript (those it has),
                      images: [indexes into ToolResult.images], omitted: {MIME: why},
                      truncated: true when a value was cut}

The call journal keeps a bounded copy of ``results``, ``stdout``, ``stderr``, ``error``
and the images for the dashboard's timeline (:func:`worker.calls.outputs.brief_outputs`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Sequence
from typing import Any

from ..result import IMAGE_TYPES, MAX_IMAGES, ToolImage, ToolResult, fit_images, truncate_output
from .model import Execution, ExecutionError, Result

#: Characters kept of stdout and of stderr in ``data`` (head and tail).
MAX_STREAM_CHARS = 256 * 1024
#: Characters kept of each rich value (HTML, SVG, Markdown, LaTeX, JSON) in ``data``.
MAX_VALUE_CHARS = 256 * 1024

#: The harness's Result fields (E2B's names) and their MIME types, in the order shown.
FORMATS: tuple[tuple[str, str], ...] = (
    ("text", "text/plain"),
    ("png", "image/png"),
    ("jpeg", "image/jpeg"),
    ("svg", "image/svg+xml"),
    ("html", "text/html"),
    ("markdown", "text/markdown"),
    ("latex", "text/latex"),
    ("json", "application/json"),
    ("javascript", "application/javascript"),
    ("pdf", "application/pdf"),
)
#: Formats kept as text in ``data.results`` (the binary ones are images or omitted).
TEXT_FIELDS = ("text", "html", "markdown", "svg", "latex", "json", "javascript")
#: Formats a model can read as they are when a result has no useful ``text/plain``.
_READABLE = ("markdown", "latex", "json")
#: ``<IPython.core.display.HTML object>``: a repr that says nothing of the content.
_PLACEHOLDER = re.compile(r"^<[\w.]+ object(?: at 0x[0-9a-f]+)?>$")

#: What each outcome means for the model, when the execution gives no message of its own.
OUTCOME_MESSAGES = {
    "interrupted": "The code ran past its timeout and was interrupted (as Ctrl-C does); the context's state is kept.",
    "restarted": (
        "The code ran past its timeout and did not stop when interrupted, so its kernel was restarted: "
        "every variable, import and loaded object of this context is lost; run the setup again."
    ),
    "kernel_died": (
        "The kernel running the code died (out of memory, or the process exited); its state is lost. "
        "A new kernel starts with the next call: use less memory, or split the work."
    ),
}


# -- image sizes ---------------------------------------------------------------------


def image_size(mime_type: str, data: str) -> tuple[int, int] | None:
    """``(width, height)`` in pixels of a base64 PNG, JPEG or GIF, read from its header;
    None when it cannot be read."""
    try:
        if mime_type == "image/png":
            head = base64.b64decode(data[:44] + "=" * (-len(data[:44]) % 4))
            if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
                w, h = struct.unpack(">II", head[16:24])
                return int(w), int(h)
            return None
        if mime_type == "image/gif":
            head = base64.b64decode(data[:16])
            if head[:4] == b"GIF8":
                w, h = struct.unpack("<HH", head[6:10])
                return int(w), int(h)
            return None
        if mime_type == "image/jpeg":
            return _jpeg_size(base64.b64decode(data))
    except (binascii.Error, ValueError, struct.error):
        return None
    return None


def _jpeg_size(raw: bytes) -> tuple[int, int] | None:
    """The size in the first start-of-frame marker (SOF0..SOF15 but DHT, JPG, DAC)."""
    if raw[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 < len(raw):
        if raw[i] != 0xFF:
            return None
        marker = raw[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = struct.unpack(">H", raw[i + 2 : i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", raw[i + 5 : i + 9])
            return int(w), int(h)
        i += 2 + length
    return None


# -- the text ------------------------------------------------------------------------


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1_000_000:.1f} MB"


def _join(parts: list[str]) -> str:
    out = ""
    for part in parts:
        if not part:
            continue
        out += ("" if not out or out.endswith("\n") else "\n") + part
    return out


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, indent=1, default=str)
    except (TypeError, ValueError):
        return str(value)


def _stream(lines: Sequence[str] | str | None) -> str:
    if lines is None:
        return ""
    if isinstance(lines, str):
        return lines
    return "".join(str(x) for x in lines)


def _traceback(error: ExecutionError) -> str:
    tb = error.traceback
    text = tb if isinstance(tb, str) else "\n".join(str(x) for x in tb)
    last = f"{error.name}: {error.value}" if error.value else str(error.name)
    return text if last in text else _join([text, last])


def _cut(value: str, limit: int = MAX_VALUE_CHARS) -> tuple[str, bool]:
    if len(value) <= limit:
        return value, False
    return truncate_output(value, limit)[0], True


class _Builder:
    """One execution's text, images and ``data.results``, built result by result."""

    def __init__(self, execution_count: int | None) -> None:
        self.count = execution_count
        self.lines: list[str] = []
        self.images: list[ToolImage] = []
        self.results: list[dict[str, Any]] = []

    def add(self, result: Result) -> None:
        main = result.is_main_result
        values: list[tuple[str, str, Any]] = [
            (name, mime, v) for name, mime in FORMATS if (v := getattr(result, name, None)) not in (None, "")
        ]
        extra = result.extra or {}
        # (the other MIME types the kernel sent; a "metadata" entry is not one)
        values.extend((k, k, v) for k, v in extra.items() if isinstance(k, str) and "/" in k and v not in (None, ""))
        entry: dict[str, Any] = {"formats": [mime for _, mime, _ in values], "is_main_result": main}
        notes: list[str] = []
        text = next((v for name, _, v in values if name == "text"), None)
        text = None if text is None else _as_text(text)
        if text is None or _PLACEHOLDER.match(text.strip()):
            # no text, or a display object's repr: a readable format says more (HTML and
            # SVG stay a summary)
            text = next((_as_text(v) for name, _, v in values if name in _READABLE), None)
        for name, mime, value in values:
            if name == "text":
                continue
            if name in ("png", "jpeg"):
                notes.append(self._image(mime, value, entry))
                continue
            shown = _as_text(value)
            if name in TEXT_FIELDS:
                entry[name], cut = _cut(shown)
                entry["truncated"] = entry.get("truncated", False) or cut
            else:
                entry.setdefault("omitted", {})[mime] = _size(len(shown))
            if text is not None and name in _READABLE and shown == text:
                continue  # it is the text already
            suffix = ": not run" if name == "javascript" else ""
            notes.append(f"[{mime} {_size(len(shown.encode('utf-8', 'replace')))}{suffix}]")
        if text is not None:
            entry["text"], cut = _cut(text)
            entry["truncated"] = entry.get("truncated", False) or cut
        entry.setdefault("truncated", False)
        self.results.append(entry)
        body = text or ""
        if main and body and self.count is not None:
            body = f"Out[{self.count}]: {body}"
        self.lines.append(_join([body, " ".join(notes)]))

    def _image(self, mime: str, value: Any, entry: dict[str, Any]) -> str:
        data = value if isinstance(value, str) else ""
        data = "".join(data.split())  # base64 as Jupyter sends it may hold newlines
        size = image_size(mime, data) if data else None
        image = ToolImage(mime, data, *(size or (None, None)))
        kept, _ = fit_images([*self.images, image])
        described = image.describe()
        if mime in IMAGE_TYPES and data and len(kept) == len(self.images) + 1:
            self.images.append(image)
            entry.setdefault("images", []).append(len(self.images) - 1)
            return f"[image {len(self.images)}: {described}]"
        if not data:
            why = "empty"
        elif len(self.images) >= MAX_IMAGES:
            why = f"not attached: a result carries at most {MAX_IMAGES} images"
        else:
            why = f"too large to attach ({_size(len(data) * 3 // 4)})"
        entry.setdefault("omitted", {})[mime] = why
        return f"[{described}: {why}; save it to a file to keep it]"


def execution_result(execution: Execution) -> ToolResult:
    """The ToolResult of ``execution`` (the harness's ``Execution``: ``results``,
    ``logs.stdout``/``logs.stderr``, ``error``, ``execution_count``, ``context_id``,
    ``outcome``, ``message``, ``files_changed``); see the module docstring."""
    stdout = _stream(execution.logs.stdout)
    stderr = _stream(execution.logs.stderr)
    count = execution.execution_count
    outcome = execution.outcome
    error = execution.error
    builder = _Builder(count if isinstance(count, int) else None)
    for result in execution.results:
        builder.add(result)
    message = execution.message or OUTCOME_MESSAGES.get(outcome)
    parts = [stdout, f"[stderr]\n{stderr}" if stderr else "", *builder.lines]
    if error is not None:
        parts.append(_traceback(error))
    if message and outcome != "ok" and outcome != "error":
        parts.append(f"[{message}]")
    output = _join(parts)
    data: dict[str, Any] = {
        "outcome": outcome,
        "execution_count": count,
        "context_id": execution.context_id or None,
        "stdout": _cut(stdout, MAX_STREAM_CHARS)[0],
        "stderr": _cut(stderr, MAX_STREAM_CHARS)[0],
        "error": None
        if error is None
        else {"name": str(error.name), "value": str(error.value), "traceback": _cut(_traceback(error))[0]},
        "results": builder.results,
        "message": message,
    }
    if len(stdout) > MAX_STREAM_CHARS or len(stderr) > MAX_STREAM_CHARS:
        data["truncated"] = True
    files = list(execution.files_changed)
    if error is None and outcome == "ok":
        return ToolResult.ok(output or "(no output)", data, files, builder.images)
    if outcome in OUTCOME_MESSAGES and message:  # (an interrupt's KeyboardInterrupt says less)
        what = message
    elif error is not None:
        what = f"{error.name}: {error.value}" if error.value else str(error.name)
    else:
        what = message or f"the execution ended: {outcome}"
    return ToolResult(False, output or f"Error: {what}", data, files, what, builder.images)
