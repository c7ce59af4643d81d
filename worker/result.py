"""``ToolResult``: what every tool call returns (Loom Spec 05), and the 10 KB output cap.

``output`` is what a model reads, so it is kept at most :data:`MAX_OUTPUT_BYTES` (UTF-8
bytes): when longer, its head and tail are kept around a visible marker, because the
start of an output (the command echo, the first error) and its end (the summary, the
last traceback) are usually the parts worth reading. ``data`` carries the structured,
uncut values for programs.

``images`` is the one place an image travels from a tool to a model (a chart ``run_code``
drew): :class:`ToolImage`, base64 of a PNG, JPEG, GIF or WebP. ``output`` already says
in words what each one is (``[image/png 640x480]``), so a surface without images (an
OpenAI tool message, a terminal) loses nothing else; the surfaces that have image content
map them there (:mod:`worker.content`: MCP ``ImageContent``, Anthropic ``tool_result``
image blocks). At most :data:`MAX_IMAGES` of at most :data:`MAX_IMAGE_CHARS` each, and
:data:`MAX_IMAGES_CHARS` in all, leave the worker (:meth:`ToolResult.capped`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .jsontext import has_surrogate, json_line
from .quoting import quote_path

__all__ = [
    "IMAGE_TYPES",
    "MAX_IMAGES",
    "MAX_IMAGES_CHARS",
    "MAX_IMAGE_CHARS",
    "MAX_OUTPUT_BYTES",
    "ToolImage",
    "ToolResult",
    "fit_images",
    "has_surrogate",
    "json_line",
    "json_safe",
    "safe_data",
    "safe_text",
    "truncate_output",
]

#: The most ``output`` may hold, in UTF-8 bytes, marker included.
MAX_OUTPUT_BYTES = 10 * 1024
#: The image types a result may carry: those both Anthropic's API and MCP clients take.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
#: Images one result may carry.
MAX_IMAGES = 8
#: The largest image, in base64 characters (Anthropic's API refuses an image over 5 MB).
MAX_IMAGE_CHARS = 5 << 20
#: All of one result's images together, in base64 characters.
MAX_IMAGES_CHARS = 10 << 20


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


@dataclass(frozen=True)
class ToolImage:
    """An image for the model to see: ``data`` is the base64 (standard alphabet, no line
    breaks) of an image of type ``mime_type`` (one of :data:`IMAGE_TYPES`), ``width`` and
    ``height`` its size in pixels when known."""

    mime_type: str
    data: str
    width: int | None = None
    height: int | None = None

    def describe(self) -> str:
        """``image/png 640x480`` (the size when known)."""
        size = f" {self.width}x{self.height}" if self.width and self.height else ""
        return f"{self.mime_type}{size}"


def fit_images(images: list[ToolImage]) -> tuple[list[ToolImage], list[ToolImage]]:
    """``(kept, left out)``: the images in order while they fit :data:`MAX_IMAGES`,
    :data:`MAX_IMAGE_CHARS` each and :data:`MAX_IMAGES_CHARS` in all; an image of a type
    not in :data:`IMAGE_TYPES` is left out."""
    kept: list[ToolImage] = []
    dropped: list[ToolImage] = []
    total = 0
    for image in images:
        size = len(image.data)
        fits = len(kept) < MAX_IMAGES and size <= MAX_IMAGE_CHARS and total + size <= MAX_IMAGES_CHARS
        if fits and image.mime_type in IMAGE_TYPES:
            kept.append(image)
            total += size
        else:
            dropped.append(image)
    return kept, dropped


@dataclass
class ToolResult:
    """The outcome of one tool call.

    ``success`` is False whenever ``error`` explains what went wrong; ``files_changed``
    holds workspace-relative paths the call changed (written, edited, or seen changed
    after a shell command); ``images`` the images for the model to see (see the module
    docstring), each also named in ``output``.
    """

    success: bool
    output: str
    data: dict[str, Any] | None = None
    files_changed: list[str] = field(default_factory=list)
    error: str | None = None
    images: list[ToolImage] = field(default_factory=list)

    @classmethod
    def ok(
        cls,
        output: str,
        data: dict[str, Any] | None = None,
        files_changed: list[str] | None = None,
        images: list[ToolImage] | None = None,
    ) -> ToolResult:
        return cls(True, output, data, list(files_changed or []), None, list(images or []))

    @classmethod
    def fail(
        cls,
        error: str,
        *,
        output: str = "",
        data: dict[str, Any] | None = None,
        files_changed: list[str] | None = None,
        images: list[ToolImage] | None = None,
    ) -> ToolResult:
        return cls(False, output or f"Error: {error}", data, list(files_changed or []), error, list(images or []))

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-like values; ``images`` only when there are any (a list of
        ``{mime_type, data, width, height}``)."""
        out = asdict(self)
        if not self.images:
            del out["images"]
        return out

    def to_json(self) -> str:
        """Compact JSON (non-ASCII kept as is) for the model or a pipeline."""
        return json_line(self.to_dict())

    def capped(self, limit: int = MAX_OUTPUT_BYTES) -> ToolResult:
        """This result with ``output`` (and ``error``) cut to ``limit`` bytes, ready to
        leave the worker: ``files_changed`` quoted (:func:`~worker.quoting.quote_path`), no
        lone surrogate in the texts (:func:`safe_text`; ``data`` is made safe by the
        serializers, only when needed: :func:`json_line`, the HTTP and MCP services).

        When ``output`` is cut, ``data["truncated"]`` and ``data["output_truncated"]``
        become true. Images beyond the limits (:func:`fit_images`) are left out and counted
        in ``data["images_dropped"]`` (a tool that attaches images says so in ``output``
        itself, having fitted them first).
        """
        output, cut = truncate_output(safe_text(self.output), limit)
        error = self.error if self.error is None else truncate_output(safe_text(self.error), limit)[0]
        data = self.data
        if cut:
            data = dict(data or {})
            data["truncated"] = True
            data["output_truncated"] = True
        images, dropped = fit_images(self.images) if self.images else (self.images, [])
        if dropped:
            data = dict(data or {})
            data["images_dropped"] = int(data.get("images_dropped") or 0) + len(dropped)
        files = [quote_path(p) for p in self.files_changed]
        return ToolResult(self.success, output, data, files, error, list(images))
