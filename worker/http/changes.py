"""``GET /v1/workspaces/{id}/changelog/diff``: what one entry, call or subtask changed.

``GET .../diff`` shows the workspace's cumulative change (first before-image to the file
now); this shows what the selected entries did, each from its recorded before-image to
its recorded after-image, so "what did this call do" has an answer even after later
calls changed the same file, or after it was undone. Paths are quoted as everywhere else
in the API; a binary file is ``Binary files ... differ``; content the changelog did not
keep is said as such.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from ..result import safe_text
from .changelog import DiffOut, is_changelog
from .common import WS_ERRORS, WorkspaceId
from .state import ServiceDep

MAX_ID = (1 << 63) - 1

router = APIRouter(tags=["changelog"])
_RESPONSES = {
    **WS_ERRORS,
    404: {"description": "No such workspace, or no entry matches"},
    409: {"description": "This service records no changelog"},
    422: {"description": "Not exactly one of entry, call_id, subtask_id"},
}


@router.get("/v1/workspaces/{workspace_id}/changelog/diff", responses=_RESPONSES)
async def changes(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    entry: int | None = Query(None, ge=1, le=MAX_ID, description="One entry."),
    call_id: str | None = Query(None, min_length=1, max_length=256, description="Every entry of a call."),
    subtask_id: str | None = Query(None, min_length=1, max_length=256, description="Every entry of a subtask."),
) -> DiffOut:
    """The unified diff of what the selected entries changed (give exactly one of
    ``entry``, ``call_id``, ``subtask_id``), oldest entry first."""
    if sum(x is not None for x in (entry, call_id, subtask_id)) != 1:
        return JSONResponse(  # type: ignore[return-value]
            {
                "detail": [
                    {
                        "loc": ["query"],
                        "type": "value_error",
                        "msg": "give exactly one of entry, call_id, subtask_id",
                    }
                ]
            },
            status_code=422,
        )
    path = await service.workspaces.locate(workspace_id)
    ws = await service.local.workspace(path)
    if not is_changelog(ws.recorder):
        return JSONResponse({"detail": "This service records no changelog"}, status_code=409)  # type: ignore[return-value]
    recorder: Any = ws.recorder  # this process's Changelog, or a cluster node's stand-in
    text = await recorder.changes(entry=entry, call_id=call_id, subtask_id=subtask_id)
    return DiffOut(diff=safe_text(text))
