"""The vendors' own tools over HTTP, with each API's JSON (see ``docs/native-tools.md``).

    GET  /v1/native/tools?vendor=anthropic|openai&max_characters=N   the request's ``tools`` entries
    POST /v1/workspaces/{id}/native/anthropic?session=&max_characters=&bash_timeout=
         body: a ``tool_use`` block of ``bash`` / ``str_replace_based_edit_tool``
         answer: its ``tool_result`` block
    POST /v1/workspaces/{id}/native/openai
         body: a ``shell_call`` or ``apply_patch_call`` item
         answer: its ``shell_call_output`` / ``apply_patch_call_output`` item

Calls run through the service's runner (its concurrency slots, per-workspace order and
metrics) and the registry (journal, changelog, policy), like ``/execute``. The app applies
its bearer-token check to this router when it includes it. Vendor blocks may carry fields
added by later API versions: those are ignored, as the SDKs' own models ignore them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ..native import calls
from ..native.bash import MAX_TIMEOUT
from .common import WorkspaceId
from .state import ServiceDep


class _Vendor(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ToolUseBlock(_Vendor):
    """Anthropic's ``tool_use`` content block."""

    type: Literal["tool_use"] = "tool_use"
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(BaseModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: list[dict[str, Any]]
    is_error: bool


class ShellAction(_Vendor):
    commands: list[str] = Field(min_length=1)
    timeout_ms: int | None = Field(None, gt=0)
    max_output_length: int | None = Field(None, ge=0)


class ShellCall(_Vendor):
    """OpenAI's ``shell_call`` output item."""

    type: Literal["shell_call"]
    call_id: str = Field(min_length=1, max_length=256)
    action: ShellAction


class PatchOperation(_Vendor):
    type: Literal["create_file", "update_file", "delete_file"]
    path: str = Field(min_length=1)
    diff: str | None = None


class ApplyPatchCall(_Vendor):
    """OpenAI's ``apply_patch_call`` output item."""

    type: Literal["apply_patch_call"]
    call_id: str = Field(min_length=1, max_length=256)
    operation: PatchOperation


OpenAICall = Annotated[ShellCall | ApplyPatchCall, Field(discriminator="type")]

router = APIRouter(tags=["native"])


@router.get("/v1/native/tools")
async def native_tools(
    vendor: Literal["anthropic", "openai"] = Query(description="Whose tool definitions."),
    max_characters: int | None = Query(None, ge=1, description="The text editor's max_characters (anthropic)."),
) -> list[dict[str, Any]]:
    """The ``tools`` entries to put in a request to that vendor's API."""
    if vendor == "anthropic":
        return calls.anthropic_tools(max_characters=max_characters)
    return calls.openai_tools()


@router.post("/v1/workspaces/{workspace_id}/native/anthropic", response_model=ToolResultBlock)
async def native_anthropic(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    block: ToolUseBlock,
    session: str = Query("default", pattern=r"^[A-Za-z0-9_]{1,32}$", description="The bash session."),
    max_characters: int | None = Query(None, ge=1, description="The text editor definition's max_characters."),
    bash_timeout: float | None = Query(None, gt=0, le=MAX_TIMEOUT, description="Seconds one bash command may take."),
) -> dict[str, Any]:
    """Run one ``tool_use`` block; answers its ``tool_result`` block."""
    path = await service.workspaces.locate(workspace_id)
    runner = service.runner
    async with runner.slot():
        return await calls.run_anthropic(
            runner.registry,
            block.model_dump(),
            workspace=path,
            session=session,
            max_characters=max_characters,
            bash_timeout=bash_timeout,
            execute=runner.execute,
        )


@router.post("/v1/workspaces/{workspace_id}/native/openai")
async def native_openai(service: ServiceDep, workspace_id: WorkspaceId, item: OpenAICall) -> dict[str, Any]:
    """Run one ``shell_call`` or ``apply_patch_call``; answers its output item."""
    path = await service.workspaces.locate(workspace_id)
    runner = service.runner
    async with runner.slot():
        return await calls.run_openai(
            runner.registry, item.model_dump(exclude_none=True), workspace=path, execute=runner.execute
        )
