"""The history of a workspace's tool calls over HTTP, by page and live.

    GET /v1/workspaces/{id}/calls?before=CURSOR&limit=50   newest first
    GET /v1/workspaces/{id}/calls/stream?after=CURSOR      Server-Sent Events, one per new call

Both read the workspace's call journal (:mod:`worker.calls`), which every process using
the workspace writes (this service, the CLI, the Python API, an MCP server), so the
stream shows calls made elsewhere too: this process's own calls wake it at once, other
processes' within :data:`POLL_SECONDS`.

The stream's events are ``event: call``, ``id:`` the call's cursor and ``data:`` the call
as ``GET .../calls`` shows it; a client that reconnects sends ``Last-Event-ID`` (or
``?after=``) and gets what it missed. Without a cursor it starts with the calls made from
then on. A browser's ``EventSource`` cannot send an ``Authorization`` header, so the
dashboard reads the stream with ``fetch()``; scripts use ``curl -N``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from ..calls import CallJournal, Tail, page
from ..registry.contract import HoldsWorkspaces
from ..result import json_line
from ..service import encode_json
from .common import WS_ERRORS, WorkspaceId
from .errors import NoCallHistory
from .state import ServiceDep

#: How often a stream looks for calls other processes appended.
POLL_SECONDS = 0.05
#: Seconds between keep-alive comments on an idle stream (proxies close silent ones).
PING_SECONDS = 15
MAX_CURSOR = (1 << 62) - 1


class CallOut(BaseModel):
    """One tool call as the journal keeps it (arguments shortened and redacted: never
    file contents or credentials)."""

    model_config = ConfigDict(extra="allow")

    cursor: int = Field(description="Its place in the journal: grows with every call; use as before/after.")
    ts: float = Field(description="When it finished (Unix time).")
    started: float
    duration_ms: float
    tool: str
    call_id: str | None
    subtask_id: str | None
    args: dict[str, Any] = Field(description="The arguments, shortened: contents as their size, secrets masked.")
    success: bool
    outcome: str | None = Field(description="shell_execute's outcome: exit, timeout, oom, output_limit, ...")
    exit_code: int | None
    error: str | None
    error_kind: str | None = Field(description="infrastructure or internal when not the call's own failure.")
    files_changed: list[str] = Field(description="The first 20 paths it changed, quoted as the tools quote them.")
    files_count: int
    pid: int | None = Field(None, description="The process that ran it.")
    outputs: list[dict[str, Any]] | None = Field(
        None,
        description=(
            "An execution of code (run_code): what it showed, in order and bounded (stdout, stderr, each "
            "result in its richest format, images as base64, the error; worker.calls.outputs)."
        ),
    )


class CallsPage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    calls: list[CallOut] = Field(description="Newest first.")
    next: int | None = Field(description="The `before` of the next (older) page; null at the oldest call kept.")


def journal_of(registry: HoldsWorkspaces) -> CallJournal:
    """The registry's call journal. Raises NoCallHistory (a 409) without one."""
    journal = registry.journal
    if journal is None:
        raise NoCallHistory
    return journal


router = APIRouter(tags=["calls"])
_RESPONSES = {**WS_ERRORS, 409: {"description": "This service records no call history"}}
_WS_PATH = "/v1/workspaces/{workspace_id}"


# The records are answered as read (encoded once), not validated into models again:
# ``response_model`` documents them.
@router.get(f"{_WS_PATH}/calls", responses=_RESPONSES, response_model=CallsPage)
async def calls(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    before: int | None = Query(None, ge=0, le=MAX_CURSOR, description="Only calls older than this cursor."),
    limit: int = Query(50, ge=1, le=500),
) -> Response:
    """The workspace's tool calls, newest first, a page at a time (follow ``next``)."""
    path = await service.workspaces.locate(workspace_id)
    journal = journal_of(service.local)
    journal.flush()  # this process's calls of this very loop turn too
    found, nxt = page(journal.directory(path), before=before, limit=limit)
    return Response(encode_json({"calls": found, "next": nxt}), media_type="application/json")


@router.get(
    f"{_WS_PATH}/calls/stream",
    responses={**_RESPONSES, 200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}},
    response_class=EventSourceResponse,
)
async def stream(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    after: int | None = Query(
        None, ge=-1, le=MAX_CURSOR, description="Send the calls after this cursor first (-1: all kept)."
    ),
    last_event_id: str | None = Header(None, max_length=32, description="Set by a reconnecting client."),
) -> EventSourceResponse:
    """Each new call as an SSE event ``call`` (``id:`` its cursor, ``data:`` as in
    ``GET .../calls``), from this and every other process using the workspace."""
    path = await service.workspaces.locate(workspace_id)
    journal = journal_of(service.local)
    if after is None and last_event_id is not None and last_event_id.strip().isdigit():
        after = min(int(last_event_id), MAX_CURSOR)
    return EventSourceResponse(_events(journal, path, after), ping=PING_SECONDS, headers={"Cache-Control": "no-store"})


async def _events(journal: CallJournal, path: Any, after: int | None) -> AsyncIterator[ServerSentEvent]:
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def wake_up() -> None:
        loop.call_soon_threadsafe(wake.set)

    unsubscribe = journal.subscribe(path, wake_up)
    tail = Tail(journal.directory(path), after)
    try:
        yield ServerSentEvent(comment="ready")  # headers out now: the client knows it is connected
        while True:
            wake.clear()
            journal.flush()
            for rec in tail.read():
                yield ServerSentEvent(data=json_line(rec), event="call", id=str(rec["cursor"]))
            try:
                await asyncio.wait_for(wake.wait(), POLL_SECONDS)
            except TimeoutError:
                pass
    finally:
        unsubscribe()
        tail.close()


__all__ = ["journal_of", "router"]
