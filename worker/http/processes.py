"""A workspace's background processes over HTTP.

    GET  /v1/workspaces/{id}/processes                          the processes, oldest first
    GET  /v1/workspaces/{id}/processes/{pid}/output?since=&wait_ms=   what it printed after a cursor
    GET  /v1/workspaces/{id}/processes/{pid}/output?follow=1    ... as Server-Sent Events until it ends
    POST /v1/workspaces/{id}/processes/{pid}/input   {"text", "encoding"?, "eof"?}
    POST /v1/workspaces/{id}/processes/{pid}/kill    {"signal"?: TERM|KILL|INT|HUP}

Reading never moves the model's "last read" mark (``process_output`` without ``since``):
these routes read from the cursor they are given (default: the start), so a dashboard
following a process takes nothing from the agent. Listing never starts a sandbox. Input
and kill go through the registry as the ``process_input`` / ``process_kill`` tools (so
they are in the call history, and a kill records what the process changed).

The stream: ``event: output`` with ``{"stream": "stdout"|"stderr", "text", "cursor",
"dropped"}`` (``id:`` the cursor, so a client resumes with ``Last-Event-ID``), then one
``event: exit`` with ``{"exit_code", "outcome", "signal"}``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from sandbox.base import ProcessInfo
from sandbox.capabilities import background
from sandbox.errors import AgentError, SandboxError

from ..service import result_dict
from ..tools.processes import cursor_text, parse_cursor
from .common import WS_ERRORS, WorkspaceId, sandbox_runs
from .errors import Gone, Invalid
from .state import Service, ServiceDep

ProcessId = PathParam(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
PING_SECONDS = 15


class InputBody(BaseModel):
    # process_input's arguments: as strict as the tool's own (no "true" or 1 for eof).
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str = Field(max_length=(1 << 20) * 4 // 3 + 4, description="Text, or base64 of bytes (encoding).")
    encoding: Literal["utf-8", "base64"] = "utf-8"
    eof: bool = False


class KillBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    signal: Literal["TERM", "KILL", "INT", "HUP"] = "TERM"


def _info(p: ProcessInfo) -> dict[str, Any]:
    return {
        "id": p.id,
        "command": p.command,
        "pid": p.pid,
        "started": p.started,
        "running": p.running,
        "ended": p.ended,
        "exit_code": p.exit_code,
        "outcome": p.outcome,
        "signal": p.signal,
        "stdout_bytes": p.stdout_bytes,
        "stderr_bytes": p.stderr_bytes,
    }


router = APIRouter(tags=["processes"])
_BASE = "/v1/workspaces/{workspace_id}/processes"
_ERRORS = {**WS_ERRORS, 404: {"description": "No such workspace or process"}}


async def running_sandbox(service: Service, workspace_id: str) -> Any:
    """The workspace's sandbox when its container runs (None: no processes then).
    Raises InvalidWorkspaceId, WorkspaceNotFound, SandboxError."""
    path = await service.workspaces.locate(workspace_id)
    registry = service.local
    if not await sandbox_runs(registry.backend, path):
        return None
    return (await registry.workspace(path)).sandbox


@router.get(_BASE, responses=_ERRORS)
async def processes(service: ServiceDep, workspace_id: WorkspaceId) -> dict[str, Any]:
    """The workspace's background processes (running, or ended within their linger
    time), oldest first. Never starts a sandbox."""
    box = await running_sandbox(service, workspace_id)
    try:
        procs = [] if box is None else await background(box).processes()
    except NotImplementedError:  # a backend without background processes: none
        procs = []
    return {"processes": [_info(p) for p in procs]}


@router.get(f"{_BASE}/{{process_id}}/output", responses=_ERRORS)
async def output(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    process_id: str = ProcessId,
    since: str | None = Query(None, max_length=64, description="Cursor stdout:stderr (default: the start)."),
    wait_ms: int = Query(0, ge=0, le=60_000, description="Wait this long for something new."),
    follow: bool = Query(False, description="Stream as Server-Sent Events until the process ends."),
    last_event_id: str | None = Header(None, max_length=64),
) -> Any:
    """What the process printed after ``since``; with ``follow`` a stream of it."""
    try:
        cursor = parse_cursor(since or last_event_id) or (0, 0)
    except ValueError as e:
        raise Invalid(("query", "since"), str(e)) from None
    box = await running_sandbox(service, workspace_id)
    if box is None:
        raise Gone(f"No process {process_id}: the sandbox is not running")
    if follow:
        # an unknown process is a 404 here, as without follow, not a 200 whose stream errs
        await background(box).process_output(process_id, since=cursor, wait=0)
        return EventSourceResponse(_follow(box, process_id, cursor), ping=PING_SECONDS)
    out = await background(box).process_output(process_id, since=cursor, wait=wait_ms / 1000.0)
    return {
        **_info(out.info),
        "stdout": out.stdout.decode("utf-8", "replace"),
        "stderr": out.stderr.decode("utf-8", "replace"),
        "cursor": cursor_text(out.cursor),
        "dropped": list(out.dropped),
        "done": out.done,
    }


async def via_tool(service: Service, workspace_id: str, tool: str, args: dict[str, Any]) -> Any:
    # Straight to the registry, not queued behind the workspace's other calls: a kill
    # must not wait for the very command it may be meant to stop the effects of.
    path = await service.workspaces.locate(workspace_id)
    result = await service.registry.execute(tool, args, path)
    body = result_dict(result)
    if not result.success and (result.data or {}).get("error_code") == "not_found":
        raise Gone(str(result.error), body)
    return body


@router.post(f"{_BASE}/{{process_id}}/input", responses=_ERRORS)
async def write_input(
    service: ServiceDep, workspace_id: WorkspaceId, body: InputBody, process_id: str = ProcessId
) -> Any:
    """Write to its stdin (the ``process_input`` tool's result)."""
    return await via_tool(service, workspace_id, "process_input", {"process_id": process_id, **body.model_dump()})


@router.post(f"{_BASE}/{{process_id}}/kill", responses=_ERRORS)
async def kill(
    service: ServiceDep, workspace_id: WorkspaceId, process_id: str = ProcessId, body: KillBody | None = None
) -> Any:
    """Stop it and everything it started (the ``process_kill`` tool's result)."""
    sig = (body or KillBody()).signal
    return await via_tool(service, workspace_id, "process_kill", {"process_id": process_id, "signal": sig})


async def _follow(box: Any, process_id: str, cursor: tuple[int, int]) -> AsyncIterator[ServerSentEvent]:
    while True:
        try:
            out = await background(box).process_output(process_id, since=cursor, wait=10.0)
        except (AgentError, SandboxError) as e:
            yield ServerSentEvent(data=json.dumps({"detail": str(e)}), event="error")
            return
        cursor = out.cursor
        cid = cursor_text(cursor)
        for stream, data, dropped in (
            ("stdout", out.stdout, out.dropped[0]),
            ("stderr", out.stderr, out.dropped[1]),
        ):
            if data or dropped:
                text = data.decode("utf-8", "replace")
                payload = {"stream": stream, "text": text, "cursor": cid, "dropped": dropped}
                yield ServerSentEvent(data=json.dumps(payload), event="output", id=cid)
        if out.done:
            info = out.info
            end = {"exit_code": info.exit_code, "outcome": info.outcome, "signal": info.signal}
            yield ServerSentEvent(data=json.dumps(end), event="exit", id=cid)
            return
