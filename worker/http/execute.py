"""Tool calls in a workspace:

    POST /v1/workspaces/{id}/execute     {"tool", "arguments", "call_id"?, "subtask_id"?}  -> the ToolResult
    POST /v1/workspaces/{id}/tool_calls  [OpenAI tool_calls]  -> the tool messages, in order

(The same call answered with Server-Sent Events, ``.../execute/stream``: :mod:`.stream`.)
Calls to one workspace run one at a time in arrival order; a full service is a 429.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import Field

from ..service import encode_json, parse_tool_arguments, result_dict, tool_message_content
from .common import CALL_ERRORS, StrictModel, WorkspaceId
from .state import ServiceDep

router = APIRouter(tags=["tools"])


class ExecuteRequest(StrictModel):
    tool: str = Field(min_length=1, max_length=128, description="Tool name, e.g. read_file.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")
    call_id: str | None = Field(None, max_length=256)
    subtask_id: str | None = Field(None, max_length=256)


class ImageOut(StrictModel):
    """An image for the model to see (``ToolResult.images``: a chart ``run_code`` drew)."""

    mime_type: str = Field(description="image/png, image/jpeg, image/gif or image/webp.")
    data: str = Field(description="The image's bytes, base64.")
    width: int | None = Field(None, description="Pixels, when known.")
    height: int | None = Field(None, description="Pixels, when known.")


class ToolResultOut(StrictModel):
    success: bool
    output: str
    data: dict[str, Any] | None = None
    files_changed: list[str] = Field(default_factory=list)
    error: str | None = None
    images: list[ImageOut] | None = Field(None, description="Present when the tool returned images (run_code).")


class FunctionCall(StrictModel):
    name: str = Field(min_length=1, max_length=128)
    arguments: str | dict[str, Any] | None = Field(
        "{}", description="The JSON string the model produced (an object is accepted too)."
    )


class ToolCall(StrictModel):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall
    index: int | None = Field(None, description="Ignored (present in streamed tool calls).")


class ToolMessage(StrictModel):
    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str


# The hot routes answer with bytes encoded once from the result: validating the result
# into a response model and re-encoding it would cost more than the tool call itself
# for a small read. ``response_model`` keeps the OpenAPI document as it was.
@router.post("/v1/workspaces/{workspace_id}/execute", responses=CALL_ERRORS, response_model=ToolResultOut)
async def execute(service: ServiceDep, workspace_id: WorkspaceId, body: ExecuteRequest) -> Response:
    path = await service.workspaces.locate(workspace_id)
    runner = service.runner
    async with runner.slot():
        result = await runner.execute(
            body.tool,
            body.arguments,
            path,
            call_id=body.call_id,
            subtask_id=body.subtask_id,
        )
    return Response(encode_json(result_dict(result)), media_type="application/json")


@router.post("/v1/workspaces/{workspace_id}/tool_calls", responses=CALL_ERRORS, response_model=list[ToolMessage])
async def tool_calls(service: ServiceDep, workspace_id: WorkspaceId, calls: list[ToolCall]) -> Response:
    """Run an assistant message's ``tool_calls`` in order; returns the tool messages
    to append to the conversation. A malformed arguments string becomes a message
    explaining it, so the model can correct itself."""
    path = await service.workspaces.locate(workspace_id)
    runner = service.runner
    out = []
    async with runner.slot():
        for call in calls:
            args = parse_tool_arguments(call.function.name, call.function.arguments)
            if isinstance(args, str):
                content = args
            else:
                # (the runner's known tools follow the registry's: a call may add tools)
                result = await runner.execute(call.function.name, args, path, call_id=call.id)
                content = tool_message_content(result)
            out.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return Response(encode_json(out), media_type="application/json")
