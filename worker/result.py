"""``ToolResult``: what every tool call returns (Loom Spec 05), and the 10 KB output cap.

``output`` is what a model reads, so it is kept at most :data:`MAX_OUTPUT_BYTES` (UTF-8
bytes): when longer, its head and tail are kept around a visible marker, because the
start of an output (the command echo, the first error) and its end (the summary, the
last traceback) are usually the parts worth reading. ``data`` carries the structured,
uncut values for programs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .jsontext import has_surrogate, json_line
from .quoting import quote_path

__all__ = [
    "MAX_OUTPUT_BYTES",
    "ToolResult",
    "has_surrogate",
    "json_line",
    "json_safe",
    "safe_data",
    "safe_text",
    "truncate_output",
]

#: The most ``output`` may hold, in UTF-8 bytes, marker included.
MAX_OUTPUT_BYTES = 10 * 1024


def _cut_utf8(data: bytes, limit: int, *, from_end: bool = False) -> str:
    """At most ``limit`` bytes of ``data`` as text, never splitting a character."""
    if from_end:
        part = data[len(data) - limit :] if limit > 0 else b""
        # Skip UTF-8 continuation bytes at the start of the kept tail.
        i = 0
        while i < len(part) and (part[i] & 0xC0) == 0x80:
            i += 1
        return part[i:].decode("utf-8", "replace")
    return data[:limit].decode("utf-8", "ignore") if limit > 0 else ""


def truncate_output(text: str, limit: int = MAX_OUTPUT_BYTES) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` UTF-8 bytes, keeping head and tail.

    Returns ``(text, was_cut)``. The marker says how many bytes were left out.
    """
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return text, False
    # Reserve room for the marker with the largest number it could hold.
    marker_room = len(f"\n\n[... {len(raw)} bytes omitted (output limit {limit} bytes) ...]\n\n".encode())
    budget = max(0, limit - marker_room)
    head_n = budget * 6 // 10
    tail_n = budget - head_n
    head = _cut_utf8(raw, head_n)
    tail = _cut_utf8(raw, tail_n, from_end=True)
    omitted = len(raw) - len(head.encode()) - len(tail.encode())
    marker = f"\n\n[... {omitted} bytes omitted (output limit {limit} bytes) ...]\n\n"
    return head + marker + tail, True


def safe_text(text: str) -> str:
    """``text`` with any lone surrogate (bytes of a file name or an output that are not
    UTF-8, carried by surrogateescape) replaced by U+FFFD, so every JSON encoder and UTF-8
    stream takes it. Paths are quoted losslessly by the tools before this
    (:func:`worker.quoting.quote_path`); this is the net for the rest."""
    if text.isascii() or not has_surrogate(text):
        return text
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def safe_data(obj: Any) -> Any:
    """``obj`` (JSON-like) with :func:`safe_text` applied to every string in it, for
    serializers that refuse lone surrogates (pydantic's); a walk costs ~1 µs per item."""
    if type(obj) is str:
        return obj if obj.isascii() or not has_surrogate(obj) else safe_text(obj)
    if isinstance(obj, dict):
        return {safe_data(k): safe_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [safe_data(v) for v in obj]
    return obj


def json_safe(obj: Any) -> Any:
    """``obj`` itself when every string in it is valid UTF-8 text, else :func:`safe_data`
    of it (for serializers that refuse lone surrogates, e.g. pydantic's)."""
    text = json.dumps(obj, ensure_ascii=False, default=str)
    return safe_data(obj) if not text.isascii() and has_surrogate(text) else obj


@dataclass
class ToolResult:
    """The outcome of one tool call.

    ``success`` is False whenever ``error`` explains what went wrong; ``files_changed``
    holds workspace-relative paths the call changed (written, edited, or seen changed
    after a shell command).
    """

    success: bool
    output: str
    data: dict[str, Any] | None = None
    files_changed: list[str] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def ok(cls, output: str, data: dict[str, Any] | None = None, files_changed: list[str] | None = None) -> ToolResult:
        return cls(True, output, data, list(files_changed or []), None)

    @classmethod
    def fail(
        cls,
        error: str,
        *,
        output: str = "",
        data: dict[str, Any] | None = None,
        files_changed: list[str] | None = None,
    ) -> ToolResult:
        return cls(False, output or f"Error: {error}", data, list(files_changed or []), error)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """Compact JSON (non-ASCII kept as is) for the model or a pipeline."""
        return json_line(self.to_dict())

    def capped(self, limit: int = MAX_OUTPUT_BYTES) -> ToolResult:
        """This result with ``output`` (and ``error``) cut to ``limit`` bytes, ready to
        leave the worker: ``files_changed`` quoted (:func:`~worker.quoting.quote_path`), no
        lone surrogate in the texts (:func:`safe_text`; ``data`` is made safe by the
        serializers, only when needed: :func:`json_line`, the HTTP and MCP services).

        When ``output`` is cut, ``data["truncated"]`` and ``data["output_truncated"]``
        become true.
        """
        output, cut = truncate_output(safe_text(self.output), limit)
        error = self.error if self.error is None else truncate_output(safe_text(self.error), limit)[0]
        data = self.data
        if cut:
            data = dict(data or {})
            data["truncated"] = True
            data["output_truncated"] = True
        return ToolResult(self.success, output, data, [quote_path(p) for p in self.files_changed], error)
