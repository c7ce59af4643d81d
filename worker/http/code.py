"""A workspace's code contexts and executions (:mod:`worker.kernels`) over HTTP::

    POST   /v1/workspaces/{id}/code/contexts               {"language"?, "cwd"?, "env"?}  201 CodeContext
    GET    /v1/workspaces/{id}/code/contexts               {"contexts": [CodeContext, ...]}, oldest first
    POST   /v1/workspaces/{id}/code/contexts/{cid}/restart  CodeContext (a new kernel: its state is lost)
    DELETE /v1/workspaces/{id}/code/contexts/{cid}          204
    POST   /v1/workspaces/{id}/code/execute                {"code", "context"?, "language"?, "timeout"?, "call_id"?}

``execute`` answers a streamed body of newline-delimited JSON (``application/x-ndjson``),
one object per line as it happens: ``{"type": "stdout" | "stderr", "text", "timestamp"}``,
``{"type": "result", "text"?, "html"?, "png"?, ..., "is_main_result"}`` (a display, or
the last expression's value), and last ``{"type": "execution", "results", "logs",
"error", "execution_count", "context_id", "call_id", "files_changed", "outcome",
"message", "duration_ms"}``. The code's own failures (an exception, a timeout, a kernel
that died) are in that last line with a 200; what refuses the request before it runs is
a status from the service's error table: 422 a bad field (``detail[0].loc`` names it: a
language no kernel speaks, a context id), 404 no such workspace or context, 409 an image without a kernel (``error``:
``kernel_unavailable``; the detail says how to add one) or too many background
processes (``limit``), 429 busy, 503 the sandbox is unavailable, 507 no room to record
the changes (``LOOM_CHANGELOG_RESERVE_BYTES``; nothing ran).

The execution takes a slot and the workspace's turn until it ends. A client that goes
away does not stop it: it runs to its end or timeout and its changes are recorded.
Listing never starts a sandbox (a sandbox not running has no contexts).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Response
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse
from pydantic import Field
from starlette.types import Receive, Scope, Send

from .. import kernels
from ..jsontext import json_line
from . import errors
from .common import CALL_ERRORS, WS_ERRORS, StrictModel, WorkspaceId, sandbox_runs
from .state import Service, ServiceDep

router = APIRouter(tags=["code"])
_BASE = "/v1/workspaces/{workspace_id}/code"
ContextId = PathParam(pattern=r"^ctx-[A-Za-z0-9_-]{1,60}$", description="Context id (ctx-...).")
_ERRORS: dict[int | str, dict[str, Any]] = {
    **CALL_ERRORS,
    404: {"description": "No such workspace or context"},
    409: {"description": "The image has no kernel (error kernel_unavailable), or too many background processes"},
}
#: The media type of the execution's stream.
NDJSON = "application/x-ndjson"


class ContextBody(StrictModel):
    language: str = Field(kernels.DEFAULT_LANGUAGE, max_length=32, description="The kernel's language: python.")
    cwd: str = Field(".", min_length=1, max_length=4096, description="Working directory, relative to the workspace.")
    env: dict[str, str] | None = Field(None, description="Variables on top of the sandbox's.")


class CodeContextOut(StrictModel):
    id: str
    language: str
    cwd: str = Field(description="Its working directory, as the sandbox names it.")
    running: bool = Field(description="Its kernel is up (else it starts again at the next execution).")


class ContextList(StrictModel):
    contexts: list[CodeContextOut]


class ExecuteBody(StrictModel):
    code: str = Field(max_length=kernels.MAX_CODE, description="The code to run.")
    context: str | None = Field(None, max_length=64, description="A context's id; omitted: the language's default.")
    language: str | None = Field(None, max_length=32, description="python (the default context's language).")
    timeout: float = Field(
        kernels.DEFAULT_TIMEOUT,
        gt=0,
        le=kernels.MAX_TIMEOUT,
        description="Seconds; then the kernel is interrupted (and restarted if that does not stop it).",
    )
    call_id: str | None = Field(None, max_length=256, description="Recorded with its changes (changelog, undo).")


def _out(c: kernels.CodeContext) -> CodeContextOut:
    return CodeContextOut(id=c.id, language=c.language, cwd=c.cwd, running=c.running)


@router.post(f"{_BASE}/contexts", status_code=201, responses=_ERRORS, response_model=CodeContextOut)
async def create_context(service: ServiceDep, workspace_id: WorkspaceId, body: ContextBody) -> CodeContextOut:
    """Start a code context: a kernel of ``language`` whose state (variables, imports)
    lasts between executions, in the workspace's sandbox (started if it is not)."""
    path = await service.workspaces.locate(workspace_id)
    runner = service.runner
    runner.opened.add(path)  # stopped with the service (an image without a kernel has started it)
    async with runner.slot():
        ctx = await service.local.sandbox(path).create_code_context(body.language, body.cwd, body.env)
    return _out(ctx)


@router.get(f"{_BASE}/contexts", responses=WS_ERRORS, response_model=ContextList)
async def list_contexts(service: ServiceDep, workspace_id: WorkspaceId) -> ContextList:
    """The workspace's code contexts, oldest first. Never starts a sandbox."""
    path = await service.workspaces.locate(workspace_id)
    registry = service.local
    if not await sandbox_runs(registry.backend, path):
        return ContextList(contexts=[])
    return ContextList(contexts=[_out(c) for c in await registry.sandbox(path).code_contexts()])


async def _running(service: Service, workspace_id: str, context_id: str) -> Path:
    """The workspace's path when its sandbox runs (contexts end with it: a stopped one is
    not started to say there is none). Raises Gone, InvalidWorkspaceId, WorkspaceNotFound."""
    path: Path = await service.workspaces.locate(workspace_id)
    if not await sandbox_runs(service.local.backend, path):
        raise errors.Gone(f"No code context {context_id}: the sandbox is not running")
    return path


@router.post(f"{_BASE}/contexts/{{context_id}}/restart", responses=_ERRORS, response_model=CodeContextOut)
async def restart_context(
    service: ServiceDep, workspace_id: WorkspaceId, context_id: str = ContextId
) -> CodeContextOut:
    """A new kernel for the context: its variables and imports are lost."""
    path = await _running(service, workspace_id, context_id)
    async with service.runner.slot():
        return _out(await service.local.sandbox(path).restart_code_context(context_id))


@router.delete(f"{_BASE}/contexts/{{context_id}}", status_code=204, responses=_ERRORS)
async def delete_context(service: ServiceDep, workspace_id: WorkspaceId, context_id: str = ContextId) -> Response:
    """End the context's kernel; what it changed in the workspace is recorded as its own."""
    path = await _running(service, workspace_id, context_id)
    async with service.runner.slot():
        await service.local.sandbox(path).delete_code_context(context_id)
    return Response(status_code=204)


@router.post(
    f"{_BASE}/execute",
    responses={
        **_ERRORS,
        200: {"content": {NDJSON: {}}, "description": "stdout/stderr/result lines, then execution"},
        507: {"description": "No room to record the changes (LOOM_CHANGELOG_RESERVE_BYTES): nothing ran"},
    },
    response_class=StreamingResponse,
)
async def execute(service: ServiceDep, workspace_id: WorkspaceId, body: ExecuteBody) -> StreamingResponse:
    """Run code in a context (the language's default one when none is named: made at its
    first use) and stream what it prints and displays as NDJSON, then its execution."""
    path = await service.workspaces.locate(workspace_id)
    runner = service.runner
    stack = contextlib.AsyncExitStack()
    await stack.enter_async_context(runner.slot())  # (a full service is a 429 before any byte)
    try:
        handle = service.local.sandbox(path)
        # What refuses the call (a field, a context, an image without a kernel) is an error
        # status, before the stream starts.
        kernels.check_code(body.code, body.timeout)
        runner.opened.add(path)  # stopped with the service (a refusal below may come once it started)
        ctx = await handle.code_context(body.context, body.language)
        await handle.check_reserve()  # (a 507, not a 200 whose first line says it)
        events = handle.run_code_stream(body.code, ctx.id, body.language, body.timeout, body.call_id, hold=stack)
    except BaseException:
        await stack.aclose()
        raise
    return _Stream(events, stack)


class _Stream(StreamingResponse):
    """An execution's lines. The slot in ``stack`` is the execution's once it starts
    (released at its end, a client gone or not); if the response ends before the stream
    even started (the client went at once: Starlette cancels it before its first step, and
    never closes the iterator), it is released here, shielded from that cancellation."""

    def __init__(self, events: AsyncIterator[kernels.CodeEvent], stack: contextlib.AsyncExitStack) -> None:
        self.stack = stack
        super().__init__(
            _lines(events), media_type=NDJSON, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.stack.aclose()


async def _lines(events: AsyncIterator[kernels.CodeEvent]) -> AsyncIterator[bytes]:
    """The events as lines; a failure after the first byte (the sandbox lost) is a last
    line ``{"type": "error", "status", "detail"}``, the status the error table gives it.
    (The slot is :class:`_Stream`'s to release.)"""
    try:
        async for ev in events:
            yield (json_line(ev.to_dict()) + "\n").encode()
    except Exception as e:
        answer = errors.answer(e)
        body = json.loads(bytes(answer.body))
        detail = body.get("detail") if isinstance(body, dict) else None
        yield (json_line({"type": "error", "status": answer.status_code, "detail": detail}) + "\n").encode()
