"""OpenAI's ``apply_patch`` tool (and Codex's ``*** Begin Patch`` envelope) on the workspace.

A call carries either one ``apply_patch_call`` ``operation`` (``create_file`` / ``update_file``
with a V4A ``diff``, ``delete_file``) or a whole envelope (``patch``) with several files.
Either way the patch is applied in two phases, so a patch that fails part-way changes
nothing:

1. *plan*: every file it touches is read through the sandbox and every hunk applied in
   memory (:mod:`worker.native.v4a`); a path outside the workspace, a missing file, a
   file that is not UTF-8 text or a hunk that does not match fails the call here, naming
   the file and the hunk;
2. *commit*: the new contents are written by :meth:`Workspace.write` (the changelog
   records each before-image first; each write is conditional on the hash read in the
   plan), then deleted and moved-away files are removed by one recorded ``rm``. All of it
   carries the call's id: ``undo --call <call_id>`` reverts the patch as a unit. Should a
   write still fail (the file changed since the plan), what was written is put back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox.base import ExecRequest
from sandbox.errors import ConflictError, NotAFileError, PathNotFoundError

from ..policy.paths import require_file_path
from ..result import ToolResult
from ..tool import Tool, ToolContext, ToolError
from ..tools.files import MAX_EDIT_BYTES, MAX_WRITE_BYTES
from ..workspace import Workspace
from .bash import quote
from .v4a import FileOp, PatchError, apply_chunks, parse_create_diff, parse_patch, parse_update_diff

NAME = "apply_patch"


class Operation(BaseModel):
    """An ``apply_patch_call``'s ``operation``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["create_file", "update_file", "delete_file"] = Field(description="What to do with the file.")
    path: str = Field(description="The file, relative to the workspace root.")
    diff: str | None = Field(None, description="The V4A diff (create_file: '+' lines; update_file: hunks).")


class ApplyPatchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operation: Operation | None = Field(None, description="One file operation, as an apply_patch_call carries it.")
    patch: str | None = Field(
        None, description="A whole '*** Begin Patch' ... '*** End Patch' envelope (several files), as Codex sends it."
    )

    @model_validator(mode="after")
    def _one(self) -> ApplyPatchArgs:
        if (self.operation is None) == (self.patch is None):
            raise ValueError("give either operation or patch")
        if self.operation is not None and self.operation.type != "delete_file" and self.operation.diff is None:
            raise ValueError(f"operation.diff is required for {self.operation.type}")
        return self


def operations(args: ApplyPatchArgs) -> list[FileOp]:
    """The file operations of the call. Raises PatchError."""
    op = args.operation
    if op is None:
        assert args.patch is not None
        return parse_patch(args.patch)
    if op.type == "create_file":
        return [FileOp("add", op.path, contents=parse_create_diff(op.diff or ""))]
    if op.type == "delete_file":
        return [FileOp("delete", op.path)]
    return [FileOp("update", op.path, chunks=parse_update_diff(op.diff or ""))]


@dataclass
class _File:
    shown: str  # the path as the patch names it
    existed: bool
    original: str | None = None
    sha256: str | None = None
    content: str | None = None  # None: absent at the end


class _Plan:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.files: dict[str, _File] = {}
        self.summary: list[str] = []

    async def load(self, path: str, purpose: str) -> tuple[str, _File]:
        """The file's entry (read once). Raises PolicyError, ToolError."""
        rel = require_file_path(path, str(self.ws.root))
        f = self.files.get(rel)
        if f is not None:
            return rel, f
        try:
            r = await self.ws.sandbox.read(rel, max_bytes=MAX_EDIT_BYTES)
        except PathNotFoundError:
            f = self.files[rel] = _File(path, existed=False)
            return rel, f
        except (NotAFileError, IsADirectoryError):
            raise ToolError(f"Failed to {purpose} {path}: it is a directory") from None
        if r.truncated or r.sha256 is None:
            raise ToolError(f"Failed to {purpose} {path}: larger than {MAX_EDIT_BYTES} bytes")
        try:
            text = r.data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"Failed to {purpose} {path}: it is not UTF-8 text") from None
        f = self.files[rel] = _File(path, existed=True, original=text, sha256=r.sha256, content=text)
        return rel, f

    async def add(self, op: FileOp) -> None:
        _rel, f = await self.load(op.path, "write file")
        f.content = op.contents
        self.summary.append(f"A {op.path}")

    async def delete(self, op: FileOp) -> None:
        _rel, f = await self.load(op.path, "delete file")
        if f.content is None:
            raise ToolError(f"Failed to delete file {op.path}: it does not exist")
        f.content = None
        self.summary.append(f"D {op.path}")

    async def update(self, op: FileOp) -> None:
        _rel, f = await self.load(op.path, "read file to update")
        if f.content is None:
            raise ToolError(f"Failed to read file to update {op.path}: No such file or directory")
        try:
            new = apply_chunks(f.content, op.chunks, op.path)
        except PatchError as e:
            raise ToolError(str(e)) from None
        if op.move_to is not None:
            _dest_rel, dest = await self.load(op.move_to, "write file")
            if dest is f:
                f.content = new
            else:
                dest.content = new
                f.content = None
            self.summary.append(f"M {op.move_to}")
        else:
            f.content = new
            self.summary.append(f"M {op.path}")


async def apply_patch(args: ApplyPatchArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    try:
        ops = operations(args)
    except PatchError as e:
        raise ToolError(str(e)) from None
    if not ops:
        raise ToolError("No files were modified.")
    plan = _Plan(ws)
    for op in ops:
        await {"add": plan.add, "delete": plan.delete, "update": plan.update}[op.kind](op)
    changed = await _commit(ws, plan, ctx)
    text = "Success. Updated the following files:\n" + "\n".join(plan.summary) + "\n"
    return ToolResult.ok(text, {"text": text, "files": plan.summary}, changed)


def _encoded(f: _File) -> bytes:
    assert f.content is not None
    data = f.content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise ToolError(f"Failed to write file {f.shown}: {len(data)} bytes is over the {MAX_WRITE_BYTES}-byte limit")
    return data


async def _commit(ws: Workspace, plan: _Plan, ctx: ToolContext) -> list[str]:
    """Write, then remove; on a failed write, put back what was written. Raises ToolError."""
    writes = [(rel, f) for rel, f in plan.files.items() if f.content is not None and f.content != f.original]
    removes = [rel for rel, f in plan.files.items() if f.content is None and f.existed]
    payloads = [(rel, f, _encoded(f)) for rel, f in writes]
    done: list[tuple[str, _File]] = []
    record = {"tool": NAME, "call_id": ctx.call_id, "subtask_id": ctx.subtask_id}
    try:
        for rel, f, data in payloads:
            await ws.write(rel, data, expect_sha256=f.sha256, expect_absent=not f.existed, **record)  # type: ignore[arg-type]
            done.append((rel, f))
    except (ConflictError, NotAFileError, PathNotFoundError) as e:
        await _put_back(ws, done, record)
        raise ToolError(
            f"Failed to write file {plan.files[rel].shown}: it changed while the patch was applied ({e}); "
            "nothing was changed, read it again and retry"
        ) from None
    changed = [rel for rel, _f in done]
    if removes:
        res, files = await ws.run_shell(ExecRequest("rm -f -- " + " ".join(quote(r) for r in removes)), **record)  # type: ignore[arg-type]
        if res.exit_code != 0:
            await _put_back(ws, done, record)
            raise ToolError(f"Failed to delete files: {res.stderr.decode('utf-8', 'replace').strip()}")
        changed += files
    return sorted(set(changed))


async def _put_back(ws: Workspace, done: list[tuple[str, _File]], record: dict[str, str | None]) -> None:
    created = [rel for rel, f in done if not f.existed]
    for rel, f in done:
        if f.existed and f.original is not None:
            await ws.write(rel, f.original.encode("utf-8"), **record)  # type: ignore[arg-type]
    if created:
        await ws.run_shell(ExecRequest("rm -f -- " + " ".join(quote(r) for r in created)), **record)  # type: ignore[arg-type]


TOOL = Tool(
    name=NAME,
    description=(
        "OpenAI's apply_patch tool: create, update (V4A hunks) or delete files; or a whole '*** Begin Patch' "
        "envelope. All or nothing; recorded as one change that can be undone."
    ),
    args_model=ApplyPatchArgs,
    fn=apply_patch,
    timeout=60.0,
    mutating=True,
    tags=("native", "openai", "file_io", "write"),
)
