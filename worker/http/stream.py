"""A tool call over HTTP with its output as it happens:

    POST /v1/workspaces/{id}/execute/stream   the body of POST .../execute

answered with Server-Sent Events: ``event: output`` (``data: {"stream": "stdout" |
"stderr", "text": "..."}``, plus ``"dropped": N`` when N bytes of that stream were left
out before it because the client read too slowly) as the command prints, then one
``event: result`` (``data:`` the ToolResult exactly as ``POST .../execute`` returns it).
Only ``shell_execute`` has output; any other tool sends just its result.

Why SSE and not newline-delimited JSON: every stream of the service speaks it (one
parser for a client, the dashboard's included), proxies and ``curl -N`` pass it
untouched, and comments keep an idle stream open (a command that prints nothing for
minutes). A browser reads it with ``fetch()``: ``EventSource`` can neither POST nor send
the ``Authorization`` header. Text is UTF-8 with U+FFFD for bytes that are not; the
result's ``data.stdout``/``data.stderr`` hold the same capture as ever.

The call takes a slot and its place in the workspace's order before the stream starts
(so a full service is a 429 as for ``execute``), and keeps them until it ends: a client
that goes away does not stop the command; it runs to its end or timeout and its changes
are recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter
from sse_starlette import EventSourceResponse, ServerSentEvent

from ..result import ToolResult, json_line
from ..service import result_dict
from ..streaming import ToolOutput, chunk_dict
from .common import WS_ERRORS, WorkspaceId
from .execute import ExecuteRequest
from .state import ServiceDep

#: Seconds between keep-alive comments while a command prints nothing.
PING_SECONDS = 15


router = APIRouter(tags=["tools"])


@router.post(
    "/v1/workspaces/{workspace_id}/execute/stream",
    responses={
        **WS_ERRORS,
        429: {"description": "Too many concurrent calls"},
        200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events: output..., result"},
    },
    response_class=EventSourceResponse,
)
async def execute_stream(service: ServiceDep, workspace_id: WorkspaceId, body: ExecuteRequest) -> EventSourceResponse:
    """Run one tool call; its output as SSE ``output`` events while it runs, then a
    ``result`` event with the ToolResult (as ``POST .../execute`` returns it)."""
    path = await service.workspaces.locate(workspace_id)
    stream = service.runner.execute_stream(
        body.tool,
        body.arguments,
        path,
        call_id=body.call_id,
        subtask_id=body.subtask_id,
    )
    return EventSourceResponse(
        _events(stream), ping=PING_SECONDS, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


async def _events(stream: AsyncIterator[ToolOutput | ToolResult]) -> AsyncIterator[ServerSentEvent]:
    async for item in stream:
        if isinstance(item, ToolOutput):
            if item.text or item.dropped:
                yield ServerSentEvent(data=json_line(chunk_dict(item)), event="output")
        else:
            yield ServerSentEvent(data=json_line(result_dict(item)), event="result")
