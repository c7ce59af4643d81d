"""The harness API over HTTP (:mod:`worker.harness`): a workspace's sandbox as an
evaluation harness drives it, beside the model's tools of ``.../execute``::

    POST /v1/workspaces/{id}/sandbox/exec     {"cmd", "stdin"?, "cwd"?, "env"?, "user"?, ...}
    GET  /v1/workspaces/{id}/sandbox/files?path=P[&max_bytes=N]   -> the file's bytes
    PUT  /v1/workspaces/{id}/sandbox/files?path=P[&mode=&call_id=]  (body: the bytes)

Under ``/sandbox`` (the workspace's box as a whole: ``GET .../sandbox`` is its state)
because, unlike the tools, these reach anywhere the sandbox's user may: any absolute
path, any working directory, another user. Files travel as raw bytes (no JSON, no
base64); a command's stdin and output are text or base64 (``*_encoding``).

Errors are HTTP statuses with ``{"detail", "error"}`` (``error``: the agent's code),
decided by the service's error table (:mod:`.errors`): 404 no such file, 403 refused (a
permission, a user the workspace may not run as), 409 a directory or other non-file where
a file is needed, 413 too large, 422 bad input, 503 the sandbox is unavailable. A command
that fails, times out or is refused by the command policy is a 200 with its ``outcome``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import Field

from ..harness import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_READ,
    MAX_OUTPUT,
    MAX_READ,
    MAX_STDIN,
    MAX_TIMEOUT,
    MAX_WRITE,
    ExecOutput,
)
from ..harness.handle import HarnessArgumentError
from .common import CALL_ERRORS, StrictModel, WorkspaceId
from .state import ServiceDep

router = APIRouter(tags=["sandbox"])
_BASE = "/v1/workspaces/{workspace_id}/sandbox"
#: The largest request bodies of these routes (the service's LOOM_MAX_BODY_BYTES is for
#: tool calls): a file of up to 1 GiB, a command's stdin of up to 64 MiB as base64 in JSON.
FILE_BODY_LIMIT = MAX_WRITE
EXEC_BODY_LIMIT = MAX_STDIN * 4 // 3 + (1 << 20)
Encoding = Literal["utf-8", "base64"]


class HarnessProblem(StrictModel):
    detail: str
    error: str | None = None


_ERRORS: dict[int | str, dict[str, Any]] = {
    **CALL_ERRORS,
    403: {"model": HarnessProblem, "description": "Refused: a permission, a user the workspace may not run as"},
    409: {"model": HarnessProblem, "description": "A directory (or FIFO, device) where a file is needed"},
    413: {"model": HarnessProblem, "description": "Too large (the file, the body)"},
    503: {"model": HarnessProblem, "description": "The sandbox is unavailable"},
}


class ExecBody(StrictModel):
    cmd: list[str] | str = Field(
        description="An argv, run as it is (no shell), or one shell string (run with sh -c). Any length."
    )
    stdin: str | None = Field(None, description="The command's standard input (default /dev/null).")
    stdin_encoding: Encoding = Field("utf-8", description="utf-8 text, or base64 of the exact bytes.")
    cwd: str | None = Field(None, description="Working directory: relative to the workspace, or absolute.")
    env: dict[str, str] | None = Field(None, description="Variables on top of the sandbox's.")
    user: str | None = Field(
        None, max_length=64, description="A user of the image (name or uid[:gid]); root where the workspace allows it."
    )
    timeout: float | None = Field(None, gt=0, le=MAX_TIMEOUT, description="Seconds (default 3600).")
    max_output: int = Field(DEFAULT_MAX_OUTPUT, ge=0, le=MAX_OUTPUT, description="Bytes kept of each stream.")
    output_encoding: Encoding = Field(
        "utf-8", description="stdout/stderr as UTF-8 text (invalid bytes as U+FFFD) or base64."
    )
    call_id: str | None = Field(None, max_length=256, description="Recorded with its changes (changelog, undo).")


class ExecOut(StrictModel):
    returncode: int | None = Field(description="Its exit code; null when it did not exit (see outcome).")
    stdout: str
    stderr: str
    encoding: Encoding
    outcome: str = Field(description="exit, timeout, oom, output_limit, disk_limit, signal, refused (policy).")
    success: bool
    truncated: bool = Field(description="A stream was larger than max_output: its head and tail are kept.")
    stdout_bytes: int
    stderr_bytes: int
    duration_ms: float
    signal: int | None = None
    launch_error: str | None = Field(None, description="It never started: not_found, permission, cwd, user, exec.")
    call_id: str | None = None
    files_changed: list[str] = Field(description="Workspace files it changed (recorded, undoable).")


class FileOut(StrictModel):
    path: str = Field(description="The file in the sandbox (links followed).")
    size: int
    created: bool
    recorded: bool = Field(description="In the workspace: recorded in its changelog; elsewhere: not (scratch space).")
    call_id: str | None = None


def _text(data: bytes, encoding: Encoding) -> str:
    return base64.b64encode(data).decode("ascii") if encoding == "base64" else data.decode("utf-8", "replace")


@router.post(f"{_BASE}/exec", responses=_ERRORS, response_model=ExecOut)
async def sandbox_exec(service: ServiceDep, workspace_id: WorkspaceId, body: ExecBody) -> Any:
    """Run a command in the workspace's sandbox as a harness does: an argv or a shell
    string of any length, with stdin, any working directory, variables, another user.
    What it changes in the workspace is recorded in its changelog (``files_changed``)."""
    path = service.workspaces.path(workspace_id)
    stdin: bytes | None = None
    if body.stdin is not None:
        try:
            stdin = (
                base64.b64decode(body.stdin, validate=True) if body.stdin_encoding == "base64" else body.stdin.encode()
            )
        except (binascii.Error, ValueError):
            raise HarnessArgumentError("stdin: not valid base64") from None
    runner = service.runner
    runner.opened.add(path)  # (stopped with the service, even when the call fails once it started it)
    async with runner.slot(), runner.lock(path):
        out: ExecOutput = await service.local.sandbox(path).exec(
            body.cmd,
            input=stdin,
            cwd=body.cwd,
            env=body.env,
            user=body.user,
            timeout=body.timeout,
            max_output=body.max_output,
            call_id=body.call_id,
        )
    return ExecOut(
        returncode=out.returncode,
        stdout=_text(out.stdout, body.output_encoding),
        stderr=_text(out.stderr, body.output_encoding),
        encoding=body.output_encoding,
        outcome=out.outcome,
        success=out.success,
        truncated=out.truncated,
        stdout_bytes=out.stdout_bytes,
        stderr_bytes=out.stderr_bytes,
        duration_ms=round(out.duration_ms, 3),
        signal=out.signal,
        launch_error=out.launch_error,
        call_id=out.call_id,
        files_changed=out.files_changed,
    )


@router.get(
    f"{_BASE}/files",
    responses={**_ERRORS, 200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes"}},
    response_class=Response,
)
async def sandbox_read_file(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    path: str = Query(min_length=1, max_length=4096, description="Relative to the workspace, or absolute."),
    max_bytes: int = Query(DEFAULT_MAX_READ, ge=0, le=MAX_READ, description="413 for a larger file."),
) -> Response:
    """A file anywhere the sandbox's user can read, its bytes exactly."""
    ws = service.workspaces.path(workspace_id)
    runner = service.runner
    async with runner.slot():
        data = await service.local.sandbox(ws).read_file(path, max_bytes=max_bytes)
    return Response(data, media_type="application/octet-stream")


@router.put(f"{_BASE}/files", responses=_ERRORS, response_model=FileOut)
async def sandbox_write_file(
    request: Request,
    service: ServiceDep,
    workspace_id: WorkspaceId,
    path: str = Query(min_length=1, max_length=4096, description="Relative to the workspace, or absolute."),
    mode: int | None = Query(None, ge=0, le=0o777, description="A new file's permission bits (e.g. 420 = 0o644)."),
    call_id: str | None = Query(None, max_length=256, description="Recorded with the change."),
) -> Any:
    """Write the body's bytes to a file where the sandbox's user can write (the workspace,
    /tmp, $HOME), with its permissions; inside the workspace the change is recorded in
    its changelog (``recorded``), elsewhere it is not."""
    ws = service.workspaces.path(workspace_id)
    data = await request.body()  # bounded by FILE_BODY_LIMIT (see app.py)
    runner = service.runner
    runner.opened.add(ws)  # (stopped with the service, even when the write fails once it started it)
    async with runner.slot(), runner.lock(ws):
        out = await service.local.sandbox(ws).write_file(path, data, mode=mode, call_id=call_id)
    return FileOut(path=out.path, size=out.size, created=out.created, recorded=out.recorded, call_id=out.call_id)


def body_limit(path: str) -> int | None:
    """The body limit of these routes (None: the service's own)."""
    if path.startswith("/v1/workspaces/") and path.endswith("/sandbox/files"):
        return FILE_BODY_LIMIT
    if path == "/files":  # E2B's envd upload (worker.integrations.e2b.files: spooled, not held)
        return FILE_BODY_LIMIT
    if path.startswith("/v1/workspaces/") and path.endswith("/sandbox/exec"):
        return EXEC_BODY_LIMIT
    return None
