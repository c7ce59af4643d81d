"""Anthropic's text editor (``text_editor_20250728``, named ``str_replace_based_edit_tool``),
executed on the workspace.

Commands ``view``, ``create``, ``str_replace`` and ``insert`` with the inputs and the
answers of Anthropic's reference implementation (anthropic-quickstarts'
``computer_use_demo/tools/edit.py``, whose error strings inspect copies): the same
wording for a path that is not absolute, does not exist, already exists for ``create``,
a directory used with another command than ``view``, ``old_str`` not found or found
more than once, an ``insert_line`` or ``view_range`` out of range.

How it maps onto the workspace: paths are absolute as the model sees them in the
sandbox (``/workspace/...``; the host's path of the workspace is accepted too), made
workspace-relative by :func:`worker.policy.paths.normalize` (a path elsewhere is refused as a
safety violation); files are read through the sandbox and every change is written by
:meth:`worker.workspace.Workspace.write`, so the changelog records the before-image first
and ``undo --call <tool_use id>`` reverts it. A write is conditional on the hash the file
had when read, as ``edit_file``'s is.

Where we differ from the reference (each also in ``docs/native-tools.md``): tabs are kept
as they are (the reference expands them, rewriting a Makefile's tabs as spaces); the
"found more than once" lines are where each occurrence starts (the reference lists
lines containing the whole ``old_str``, none for a multi-line one); ``create`` makes
missing parent directories; files that are not UTF-8 text are refused with a clear
message; ``view`` without the tool's ``max_characters`` is clipped at the reference's
16 000 characters.
"""

from __future__ import annotations

import posixpath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from sandbox.errors import ConflictError, NotADirError, NotAFileError, PathNotFoundError

from ..policy.paths import CONTAINER_ROOT, normalize
from ..result import ToolResult
from ..tool import Tool, ToolContext, ToolError
from ..tools.files import MAX_EDIT_BYTES, MAX_WRITE_BYTES
from ..workspace import Workspace

NAME = "str_replace_based_edit_tool"
COMMANDS = ("view", "create", "str_replace", "insert")
SNIPPET_LINES = 4
#: The reference's clip for a view (``maybe_truncate``), used when the tool definition
#: gives no ``max_characters``.
DEFAULT_MAX_CHARACTERS = 16000
TRUNCATED_MESSAGE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You should "
    "retry this tool after you have searched inside the file with `grep -n` in order to find the line "
    "numbers of what you are looking for.</NOTE>"
)


class EditorArgs(BaseModel):
    """Anthropic's input schema of ``str_replace_based_edit_tool`` (plus ``insert_text``,
    which the models send for ``insert`` as often as ``new_str``)."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(
        description="The commands to run. Allowed options are: `view`, `create`, `str_replace`, `insert`.",
        json_schema_extra={"enum": list(COMMANDS)},
    )
    path: str = Field(description="Absolute path to file or directory, e.g. `/workspace/file.py` or `/workspace`.")
    file_text: str | None = Field(
        None, description="Required parameter of `create` command, with the content of the file to be created."
    )
    view_range: list[int] | None = Field(
        None,
        description=(
            "Optional parameter of `view` command when `path` points to a file. If none is given, the full file "
            "is shown. If provided, the file will be shown in the indicated line number range, e.g. [11, 12] "
            "will show lines 11 and 12. Indexing at 1 to start. Setting `[start_line, -1]` shows all lines from "
            "`start_line` to the end of the file."
        ),
    )
    old_str: str | None = Field(
        None, description="Required parameter of `str_replace` command containing the string in `path` to replace."
    )
    new_str: str | None = Field(
        None,
        description=(
            "Optional parameter of `str_replace` command containing the new string (if not given, no string will "
            "be added). Required parameter of `insert` command containing the string to insert."
        ),
    )
    insert_line: int | None = Field(
        None,
        description=(
            "Required parameter of `insert` command. The `new_str` will be inserted AFTER the line `insert_line` "
            "of `path` (0 inserts at the top)."
        ),
    )
    insert_text: str | None = Field(
        None, description="The text to insert with `insert` (the same as `new_str`; either may be given)."
    )
    # Not the model's: the tool definition's max_characters, passed by the adapters.
    max_characters: SkipJsonSchema[int | None] = Field(None, ge=1)


def workspace_path(ws: Workspace, path: str) -> str:
    """``path`` (absolute, as the model sees it) as a workspace-relative path.

    Raises ToolError with the reference's message for a relative path, PolicyError for a
    path outside the workspace.
    """
    if not path.startswith("/"):
        suggested = posixpath.join(CONTAINER_ROOT, path)
        raise ToolError(
            f"The path {path} is not an absolute path, it should start with `/`. Maybe you meant {suggested}?"
        )
    return normalize(path, str(ws.root))


def make_output(content: str, descriptor: str, init_line: int = 1, max_characters: int | None = None) -> str:
    """The reference's ``cat -n`` rendering (6-wide line numbers, a tab), clipped first."""
    limit = max_characters or DEFAULT_MAX_CHARACTERS
    if len(content) > limit:
        content = content[:limit] + TRUNCATED_MESSAGE
    numbered = "\n".join(f"{i + init_line:6}\t{line}" for i, line in enumerate(content.split("\n")))
    return f"Here's the result of running `cat -n` on {descriptor}:\n" + numbered + "\n"


def _not_found(path: str) -> ToolError:
    return ToolError(f"The path {path} does not exist. Please provide a valid path.")


def _is_dir(path: str) -> ToolError:
    return ToolError(f"The path {path} is a directory and only the `view` command can be used on directories")


async def _read_text(ws: Workspace, rel: str, path: str) -> tuple[str, bytes, str | None]:
    """The file's text, bytes and sha256. Raises ToolError (missing, a directory, binary,
    not UTF-8, too large)."""
    try:
        r = await ws.sandbox.read(rel, max_bytes=MAX_EDIT_BYTES)
    except PathNotFoundError:
        raise _not_found(path) from None
    except (NotAFileError, IsADirectoryError):
        st = await ws.sandbox.stat(rel)
        if st.type == "dir":
            raise _is_dir(path) from None
        raise ToolError(f"The path {path} is not a regular file") from None
    if r.truncated or r.sha256 is None:
        raise ToolError(f"The file {path} is larger than {MAX_EDIT_BYTES} bytes; the text editor cannot open it")
    if r.binary:
        raise ToolError(f"The file {path} is a binary file; the text editor reads and writes UTF-8 text only")
    try:
        text = r.data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ToolError(
            f"The file {path} is not valid UTF-8 text (invalid byte at offset {e.start}); "
            "the text editor reads and writes UTF-8 text only"
        ) from None
    if r.sha256 is not None:
        ws.remember(rel, r.data, r.sha256)
    return text, r.data, r.sha256


def _encode(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > MAX_WRITE_BYTES:
        raise ToolError(f"The new content is {len(data)} bytes, over the {MAX_WRITE_BYTES}-byte limit")
    return data


async def _view(ws: Workspace, rel: str, args: EditorArgs) -> str:
    path = args.path
    try:
        st = await ws.sandbox.stat(rel)
    except PathNotFoundError:
        raise _not_found(path) from None
    if st.type == "dir":
        if args.view_range:
            raise ToolError("The `view_range` parameter is not allowed when `path` points to a directory.")
        return await _view_dir(ws, rel, path)
    text, _data, _sha = await _read_text(ws, rel, path)
    init_line = 1
    if args.view_range:
        view_range = args.view_range
        if len(view_range) != 2:
            raise ToolError("Invalid `view_range`. It should be a list of two integers.")
        lines = text.split("\n")
        n_lines = len(lines)
        init_line, final_line = view_range
        if init_line < 1 or init_line > n_lines:
            raise ToolError(
                f"Invalid `view_range`: {view_range}. Its first element `{init_line}` should be within the range "
                f"of lines of the file: {[1, n_lines]}"
            )
        if final_line > n_lines:
            raise ToolError(
                f"Invalid `view_range`: {view_range}. Its second element `{final_line}` should be smaller than the "
                f"number of lines in the file: `{n_lines}`"
            )
        if final_line != -1 and final_line < init_line:
            raise ToolError(
                f"Invalid `view_range`: {view_range}. Its second element `{final_line}` should be larger or equal "
                f"than its first `{init_line}`"
            )
        text = "\n".join(lines[init_line - 1 :] if final_line == -1 else lines[init_line - 1 : final_line])
    return make_output(text, path, init_line, args.max_characters)


async def _view_dir(ws: Workspace, rel: str, path: str) -> str:
    """What the reference's ``find PATH -maxdepth 2 -not -path '*/\\.*'`` lists, sorted."""
    try:
        listing = await ws.sandbox.list(rel, depth=2, exclude=())
    except NotADirError:
        raise ToolError(f"The path {path} is not a directory") from None
    shown = path.rstrip("/") or "/"
    prefix = "" if rel == "." else rel + "/"
    rows = [shown]
    for entry in sorted(listing.entries, key=lambda e: e.path):
        sub = entry.path[len(prefix) :] if entry.path.startswith(prefix) else entry.path
        if any(part.startswith(".") for part in sub.split("/")):
            continue
        rows.append(posixpath.join(shown, sub))
    if listing.truncated:
        rows.append(f"[... more entries than the {len(listing.entries)} listed ...]")
    listed = "\n".join(rows)
    return f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n{listed}\n"


async def _create(ws: Workspace, rel: str, args: EditorArgs, ctx: ToolContext) -> tuple[str, list[str]]:
    if args.file_text is None:
        raise ToolError("Parameter `file_text` is required for command: create")
    data = _encode(args.file_text)
    try:
        await ws.write(rel, data, expect_absent=True, tool=NAME, call_id=ctx.call_id, subtask_id=ctx.subtask_id)
    except (ConflictError, NotAFileError, IsADirectoryError):
        raise ToolError(
            f"File already exists at: {args.path}. Cannot overwrite files using command `create`."
        ) from None
    return f"File created successfully at: {args.path}", [rel]


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _replace(text: str, old: str, new: str, path: str) -> tuple[str, str]:
    """The new text and the reference's answer. Raises ToolError (not found, not unique)."""
    count = text.count(old)
    if count == 0:
        raise ToolError(f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}.")
    if count > 1:
        starts, at = [], text.find(old)
        while at != -1:
            starts.append(_line_of(text, at))
            at = text.find(old, at + 1)
        raise ToolError(
            f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines {starts}. "
            "Please ensure it is unique"
        )
    new_text = text.replace(old, new)
    replacement_line = text.split(old)[0].count("\n")
    start = max(0, replacement_line - SNIPPET_LINES)
    end = replacement_line + SNIPPET_LINES + new.count("\n")
    snippet = "\n".join(new_text.split("\n")[start : end + 1])
    answer = (
        f"The file {path} has been edited. "
        + make_output(snippet, f"a snippet of {path}", start + 1)
        + "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )
    return new_text, answer


def _insert(text: str, line: int, new: str) -> tuple[str, str]:
    """The new text and the reference's answer. Raises ToolError (line out of range)."""
    lines = text.split("\n")
    n_lines = len(lines)
    if line < 0 or line > n_lines:
        raise ToolError(
            f"Invalid `insert_line` parameter: {line}. It should be within the range of lines of the file: "
            f"{[0, n_lines]}"
        )
    new_lines = new.split("\n")
    result = "\n".join(lines[:line] + new_lines + lines[line:])
    snippet = "\n".join(lines[max(0, line - SNIPPET_LINES) : line] + new_lines + lines[line : line + SNIPPET_LINES])
    answer = (
        "The file {path} has been edited. "
        + make_output(snippet, "a snippet of the edited file", max(1, line - SNIPPET_LINES + 1))
        + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
        "Edit the file again if necessary."
    )
    return result, answer


async def _modify(ws: Workspace, rel: str, args: EditorArgs, ctx: ToolContext) -> tuple[str, list[str]]:
    """``str_replace`` or ``insert``: read (or start from what this worker last saw, as
    ``edit_file`` does), change, write conditionally on the hash read."""
    if args.command == "str_replace":
        if args.old_str is None:
            raise ToolError("Parameter `old_str` is required for command: str_replace")
        old, new = args.old_str, args.new_str or ""

        def change(text: str) -> tuple[str, str]:
            return _replace(text, old, new, args.path)
    else:
        if args.insert_line is None:
            raise ToolError("Parameter `insert_line` is required for command: insert")
        text_in = args.insert_text if args.insert_text is not None else args.new_str
        if text_in is None:
            raise ToolError("Parameter `insert_text` is required for command: insert")
        line = args.insert_line

        def change(text: str) -> tuple[str, str]:
            new_text, answer = _insert(text, line, text_in)
            return new_text, answer.replace("{path}", args.path, 1)

    known = ws.known(rel)
    if known is not None:
        try:
            return await _write(ws, rel, known[0].decode("utf-8"), known[1], change, ctx)
        except (ToolError, ConflictError, UnicodeDecodeError, PathNotFoundError, NotAFileError):
            ws.forget([rel])  # a guess from memory: judge on the file itself below
    text, _data, sha = await _read_text(ws, rel, args.path)
    try:
        return await _write(ws, rel, text, sha, change, ctx)
    except ConflictError:
        raise ToolError(f"The file {args.path} changed while it was being edited; view it and try again") from None


async def _write(
    ws: Workspace, rel: str, text: str, sha: str | None, change: Any, ctx: ToolContext
) -> tuple[str, list[str]]:
    new_text, answer = change(text)
    if new_text != text:
        await ws.write(
            rel, _encode(new_text), expect_sha256=sha, tool=NAME, call_id=ctx.call_id, subtask_id=ctx.subtask_id
        )
    return answer, [rel] if new_text != text else []


async def text_editor(args: EditorArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    if args.command not in COMMANDS:
        raise ToolError(
            f"Unrecognized command {args.command}. The allowed commands for the {NAME} tool are: " + ", ".join(COMMANDS)
        )
    rel = workspace_path(ws, args.path)
    changed: list[str] = []
    if args.command == "view":
        text = await _view(ws, rel, args)
    elif rel == ".":
        raise _is_dir(args.path)
    elif args.command == "create":
        text, changed = await _create(ws, rel, args, ctx)
    else:
        text, changed = await _modify(ws, rel, args, ctx)
    return ToolResult.ok(text, {"text": text, "command": args.command, "path": args.path}, changed)


TOOL = Tool(
    name=NAME,
    description=(
        "Anthropic's text editor (text_editor_20250728): view a file with line numbers or list a directory, "
        "create a file, replace a unique string, insert text after a line. Paths are absolute (/workspace/...). "
        "Every change is recorded and can be undone."
    ),
    args_model=EditorArgs,
    fn=text_editor,
    timeout=30.0,
    mutating=True,
    tags=("native", "anthropic", "file_io", "write"),
)
