"""``read_file``, ``write_file`` and ``edit_file``: all through the workspace's sandbox.

Writes go through :meth:`worker.workspace.Workspace.write` (so the changelog records the
before-image first) and are atomic in the sandbox (temp file + rename). ``edit_file``
works on the file's bytes decoded with ``surrogateescape``, so CRLF line ends, any
Unicode and even invalid UTF-8 outside the edited text survive byte for byte, and it
writes only if the file still has the hash it had when read.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from sandbox import protocol
from sandbox.base import ReadResult
from sandbox.errors import ConflictError, NotAFileError, PathNotFoundError

from ..policy.paths import require_file_path
from ..quoting import quote_path
from ..result import ToolResult
from ..tool import Tool, ToolArgs, ToolContext, ToolError
from ..workspace import Workspace

#: Largest content write_file / edit_file will write (UTF-8 bytes).
MAX_WRITE_BYTES = 10 << 20
#: Largest file edit_file will load.
MAX_EDIT_BYTES = protocol.MAX_READ_BYTES
#: How file content travels in JSON: text, or the exact bytes as base64.
Encoding = Literal["utf-8", "base64"]


class ReadFileArgs(ToolArgs):
    path: str = Field(description="File path, relative to the workspace root.")
    line_range: list[Annotated[int, Field(ge=1)]] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="Optional [start, end]: 1-based, inclusive line numbers to return.",
    )
    max_bytes: int = Field(
        1 << 20, ge=1, le=protocol.MAX_READ_BYTES, description="Most bytes to return (default 1 MiB)."
    )
    encoding: Encoding = Field(
        "utf-8",
        description="utf-8: data.content is text (invalid bytes replaced, binary files withheld); base64: the "
        "exact bytes of any file, base64-encoded.",
    )

    @field_validator("line_range")
    @classmethod
    def _ordered(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (v[0] < 1 or v[1] < v[0]):
            raise ValueError("line_range must be [start, end] with 1 <= start <= end (out of range)")
        return v


async def read_file(args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    rel = require_file_path(args.path, str(ws.root))
    lr = (args.line_range[0], args.line_range[1]) if args.line_range else None
    r = await ws.sandbox.read(rel, line_range=lr, max_bytes=args.max_bytes)
    data: dict[str, Any] = {"path": quote_path(rel), "size": r.size, "truncated": r.truncated, "binary": r.binary}
    if args.encoding == "base64":
        return _read_base64(rel, r, data, args.max_bytes)
    if r.binary:
        data["content"] = None
        return ToolResult.ok(f"{quote_path(rel)} is a binary file ({r.size} bytes); its content is not shown.", data)
    text = r.data.decode("utf-8", "replace")
    data["content"] = text
    if r.sha256:
        data["sha256"] = r.sha256
        if lr is None and not r.truncated:
            ws.remember(rel, r.data, r.sha256)  # an edit that follows can start from it
    if lr is not None:
        data.update(start_line=lr[0], end_line=min(lr[1], r.total_lines or 0), total_lines=r.total_lines)
    output = text
    if lr is not None and not text and (r.total_lines or 0) < lr[0]:
        output = f"(no lines in range {lr[0]}-{lr[1]}: {quote_path(rel)} has {r.total_lines} lines)"
    elif r.size == 0:
        output = "(empty file)"
    if r.truncated:
        output += f"\n[... truncated at {args.max_bytes} bytes of {r.size}; use line_range to read more ...]"
    return ToolResult.ok(output, data)


def _read_base64(rel: str, r: ReadResult, data: dict[str, Any], max_bytes: int) -> ToolResult:
    """``read_file`` with ``encoding: "base64"``: the bytes exactly, in ``data.content``."""
    data.update(content=base64.b64encode(r.data).decode("ascii"), encoding="base64", bytes=len(r.data))
    if r.sha256:
        data["sha256"] = r.sha256
    output = f"Read {len(r.data)} bytes of {quote_path(rel)} (base64 in data.content)"
    if r.truncated:
        output += f"; truncated at {max_bytes} bytes of {r.size}"
    return ToolResult.ok(output, data)


class WriteFileArgs(ToolArgs):
    path: str = Field(description="File path, relative to the workspace root. Parent directories are created.")
    # Raw bytes too, from Python (``{"content": b"..."}``); JSON callers send base64.
    content: Annotated[str | bytes, WithJsonSchema({"type": "string"})] = Field(
        description="The complete new content of the file (base64 of its bytes with encoding base64)."
    )
    encoding: Encoding = Field(
        "utf-8", description="utf-8: content is text; base64: content is the file's exact bytes, base64-encoded."
    )


def _encode(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolError(f"{what} is not valid Unicode text (lone surrogate at position {e.start})") from None


def content_bytes(content: str | bytes, encoding: str, what: str = "content") -> bytes:
    """The bytes a ``content`` argument stands for (text, base64 text, or bytes from
    Python). Raises ToolError naming ``what`` for text that is not valid Unicode or base64."""
    if isinstance(content, bytes):
        return content
    if encoding == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise ToolError(f"'{what}': not valid base64 (encoding is base64)") from None
    return _encode(content, what)


async def write_file(args: WriteFileArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    rel = require_file_path(args.path, str(ws.root))
    data = content_bytes(args.content, args.encoding)
    if len(data) > MAX_WRITE_BYTES:
        raise ToolError(f"Content too large: {len(data)} bytes exceeds the {MAX_WRITE_BYTES}-byte limit of write_file")
    async with ws.hold(rel):  # not between an edit's read and its write
        res = await ws.write(rel, data, tool="write_file", call_id=ctx.call_id, subtask_id=ctx.subtask_id)
    verb = "Created" if res.created else "Wrote"
    return ToolResult.ok(
        f"{verb} {quote_path(rel)} ({res.size} bytes)",
        {"path": quote_path(rel), "bytes_written": res.size, "created": res.created, "sha256": res.sha256},
        [rel],
    )


class Edit(ToolArgs):
    old_str: str = Field(
        description=(
            "Exact text to find (must occur exactly once unless replace_all). Empty only in the first "
            "edit, to create a missing file."
        )
    )
    new_str: str = Field(description="Replacement text.")
    replace_all: bool = Field(False, description="Replace every occurrence instead of exactly one.")


class EditFileArgs(ToolArgs):
    path: str = Field(description="File path, relative to the workspace root.")
    old_str: str | None = Field(
        None,
        description=(
            "Exact text to replace; it must occur exactly once. Empty only to create a missing file "
            "(refused for an existing one: use write_file to replace a whole file)."
        ),
    )
    new_str: str | None = Field(None, description="Replacement text (with old_str).")
    edits: list[Edit] | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Several edits, applied in order, all or nothing (instead of old_str/new_str).",
    )

    @model_validator(mode="after")
    def _one_form(self) -> EditFileArgs:
        if self.edits is not None:
            if self.old_str is not None or self.new_str is not None:
                raise ValueError("give either old_str/new_str or edits, not both")
        elif self.old_str is None or self.new_str is None:
            raise ValueError("old_str and new_str are required (or give edits)")
        return self

    def edit_list(self) -> list[Edit]:
        if self.edits is not None:
            return self.edits
        assert self.old_str is not None and self.new_str is not None
        return [Edit(old_str=self.old_str, new_str=self.new_str)]


CONTEXT_LINES = 3


def _context(text: str, start: int, length: int) -> str:
    """Numbered lines around ``text[start:start+length]``."""
    lines = text.split("\n")
    first = text.count("\n", 0, start)
    last = first + text.count("\n", start, start + length)
    lo, hi = max(0, first - CONTEXT_LINES), min(len(lines), last + CONTEXT_LINES + 1)
    return "\n".join(f"{n + 1:>6}\t{lines[n].rstrip(chr(13))}" for n in range(lo, hi))


def apply_edits(text: str, edits: list[Edit], path: str, *, exists: bool = True) -> tuple[str, list[str]]:
    """``text`` with ``edits`` applied in order, and a context snippet for each.
    ``exists``: whether the file is there (else ``text`` is empty and the first edit,
    with an empty ``old_str``, creates it).

    Raises ToolError ("not found" / "appears N times" / an empty ``old_str`` anywhere
    but in the first edit of a missing file) without applying anything.
    """
    for i, e in enumerate(edits, 1):
        if e.old_str == "" and (exists or i > 1):
            # Appending there (as an empty old_str once did) is never what was meant.
            raise ToolError(_empty_old_str(f"edit {i}: " if len(edits) > 1 else "", path, exists))
    snippets = []
    for i, e in enumerate(edits, 1):
        label = f"edit {i}: " if len(edits) > 1 else ""
        old = e.old_str
        if old == "":
            text = e.new_str  # the first edit of a missing file creates it
            snippets.append(_context(text, 0, len(e.new_str)))
            continue
        count = text.count(old)
        if count == 0:
            raise ToolError(f"{label}old_str not found in {path}; nothing was changed")
        if count > 1 and not e.replace_all:
            raise ToolError(
                f"{label}old_str appears {count} times in {path}; add surrounding context to make it "
                "unique, or set replace_all. Nothing was changed"
            )
        pos = text.index(old)
        text = text.replace(old, e.new_str) if e.replace_all else text.replace(old, e.new_str, 1)
        more = f"  (and {count - 1} more)" if count > 1 else ""
        snippets.append(_context(text, pos, len(e.new_str)) + more)
    return text, snippets


def _empty_old_str(label: str, path: str, exists: bool) -> str:
    where = f"{path} already exists" if exists else "the file is created by the first edit"
    return (
        f"{label}old_str is empty, but {where}: an empty old_str only creates a missing file. "
        f"Give the exact text to replace as a non-empty old_str, or use write_file to replace the whole "
        "file. Nothing was changed"
    )


class _Stale(Exception):
    """The remembered content an edit started from is not the file's: read it instead."""


async def edit_file(args: EditFileArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    rel = require_file_path(args.path, str(ws.root))
    # From the read to the write this call holds the path: edits of one file sent at
    # once take turns, each starting from what the previous one wrote, so a conflict
    # means a change from outside (a command, another process), never a sibling call.
    async with ws.hold(rel):
        return await _edit_held(ws, ctx, rel, args.edit_list())


async def _edit_held(ws: Workspace, ctx: ToolContext, rel: str, edits: list[Edit]) -> ToolResult:
    creating = edits[0].old_str == ""  # only right for a missing file: ask, not remember
    known = None if creating else ws.known(rel)
    if known is not None and b"\x00" not in known[0][:8192]:
        # Start from what this worker last wrote or read there: the write is conditional
        # on exactly that hash, so a stale guess writes nothing and we start over below.
        try:
            return await _edit(ws, ctx, rel, edits, known[0], known[1], True, speculative=True)
        except _Stale:
            ws.forget([rel])
    try:
        r = await ws.sandbox.read(rel, max_bytes=MAX_EDIT_BYTES)
    except PathNotFoundError:
        if not creating:
            raise
        return await _edit(ws, ctx, rel, edits, b"", None, False, speculative=False)
    if r.binary:
        raise ToolError(f"Cannot edit {quote_path(rel)}: it is a binary file")
    if r.truncated or r.sha256 is None:
        raise ToolError(f"Cannot edit {quote_path(rel)}: the file is larger than {MAX_EDIT_BYTES} bytes")
    return await _edit(ws, ctx, rel, edits, r.data, r.sha256, True, speculative=False)


async def _edit(
    ws: Workspace,
    ctx: ToolContext,
    rel: str,
    edits: list[Edit],
    original: bytes,
    sha: str | None,
    exists: bool,
    *,
    speculative: bool,
) -> ToolResult:
    """Apply ``edits`` to ``original`` and write the result conditionally on ``sha``.
    With ``speculative`` every failure that could come from a stale ``original`` raises
    :class:`_Stale` instead of reaching the model."""
    # surrogateescape: invalid bytes round-trip unchanged instead of becoming U+FFFD.
    text = original.decode("utf-8", "surrogateescape")
    try:
        new_text, snippets = apply_edits(text, edits, rel, exists=exists)
    except ToolError:
        if speculative:
            raise _Stale() from None
        raise
    try:
        new = new_text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ToolError("old_str/new_str contain invalid Unicode (lone surrogates)") from None
    data: dict[str, Any] = {
        "path": quote_path(rel),
        "edits_applied": len(edits),
        "original_bytes": len(original),
        "new_bytes": len(new),
        "created": not exists,
    }
    if exists and new == original:
        if speculative:
            raise _Stale()  # "unchanged" must be about the file, not about our memory of it
        return ToolResult.ok(f"{quote_path(rel)} unchanged: the edits produce the same content", data)
    if len(new) > MAX_WRITE_BYTES:
        raise ToolError(f"Edited content too large: {len(new)} bytes exceeds the {MAX_WRITE_BYTES}-byte limit")
    try:
        await ws.write(
            rel,
            new,
            expect_sha256=sha,
            expect_absent=not exists,
            tool="edit_file",
            call_id=ctx.call_id,
            subtask_id=ctx.subtask_id,
        )
    except ConflictError as e:
        if speculative:
            raise _Stale() from None
        raise ToolError(f"{e} (the file changed between read and write; read it again and retry)") from None
    except (PathNotFoundError, NotAFileError):
        if speculative:
            raise _Stale() from None
        raise
    head = f"{'Created' if not exists else 'Edited'} {quote_path(rel)}: {len(edits)} edit(s) applied"
    body = "\n".join(f"--- change {i} ---\n{s}" for i, s in enumerate(snippets, 1))
    return ToolResult.ok(f"{head}\n{body}", data, [rel])


TOOLS = [
    Tool(
        name="read_file",
        description=(
            "Read a text file in the workspace. Optional line_range [start, end] (1-based, inclusive). "
            "Binary files are reported by size, not dumped; invalid UTF-8 is replaced (encoding base64: the "
            "exact bytes of any file, in data.content)."
        ),
        args_model=ReadFileArgs,
        fn=read_file,
        timeout=10.0,
        tags=("file_io", "read"),
    ),
    Tool(
        name="write_file",
        description=(
            "Create or overwrite a file in the workspace with the given content (atomic; parent "
            "directories are created; encoding base64 for bytes). The previous content is recorded so the "
            "change can be undone."
        ),
        args_model=WriteFileArgs,
        fn=write_file,
        timeout=10.0,
        mutating=True,
        tags=("file_io", "write"),
    ),
    Tool(
        name="edit_file",
        description=(
            "Replace exact text in a file: old_str must occur exactly once (or set replace_all). "
            "Several edits apply in order, all or nothing. An empty old_str creates a missing file "
            "(and is refused for an existing one). "
            "Shows the changed lines."
        ),
        args_model=EditFileArgs,
        fn=edit_file,
        timeout=10.0,
        mutating=True,
        tags=("file_io", "write", "code"),
    ),
]
