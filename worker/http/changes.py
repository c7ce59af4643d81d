"""``GET /v1/workspaces/{id}/changelog/diff``: what one entry, call or subtask changed.

``GET .../diff`` shows the workspace's cumulative change (first before-image to the file
now); this shows what the selected entries did, each from its recorded before-image to
its recorded after-image, so "what did this call do" has an answer even after later
calls changed the same file, or after it was undone. Paths are quoted as everywhere else
in the API; a binary file is ``Binary files ... differ``; content the changelog did not
keep is said as such.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, model_validator

from ..result import safe_text
from .changelog import DiffOut, is_changelog
from .common import WS_ERRORS, WorkspaceId
from .errors import NoChangelog
from .state import ServiceDep

MAX_ID = (1 << 63) - 1

router = APIRouter(tags=["changelog"])
_RESPONSES = {
    **WS_ERRORS,
    404: {"description": "No such workspace, or no entry matches"},
    409: {"description": "This service records no changelog"},
    422: {"description": "Not exactly one of entry, call_id, subtask_id"},
}


class ChangesQuery(BaseModel):
    """Exactly one selector: ``entry``, ``call_id`` or ``subtask_id``."""

    entry: int | None = Field(None, ge=1, le=MAX_ID, description="One entry.")
    call_id: str | None = Field(None, min_length=1, max_length=256, description="Every entry of a call.")
    subtask_id: str | None = Field(None, min_length=1, max_length=256, description="Every entry of a subtask.")

    @model_validator(mode="after")
    def _one_selector(self) -> ChangesQuery:
        if sum(x is not None for x in (self.entry, self.call_id, self.subtask_id)) != 1:
            raise ValueError("give exactly one of entry, call_id, subtask_id")
        return self


@router.get("/v1/workspaces/{workspace_id}/changelog/diff", responses=_RESPONSES)
async def changes(
    service: ServiceDep, workspace_id: WorkspaceId, selector: Annotated[ChangesQuery, Query()]
) -> DiffOut:
    """The unified diff of what the selected entries changed (give exactly one of
    ``entry``, ``call_id``, ``subtask_id``), oldest entry first."""
    path = await service.workspaces.locate(workspace_id)
    ws = await service.local.workspace(path)
    if not is_changelog(ws.recorder):
        raise NoChangelog
    recorder: Any = ws.recorder  # this process's Changelog, or a cluster node's stand-in
    text = await recorder.changes(entry=selector.entry, call_id=selector.call_id, subtask_id=selector.subtask_id)
    return DiffOut(diff=safe_text(text))
