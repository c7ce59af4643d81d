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

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse

from ..changelog import Changelog
from ..result import safe_text
from ..service import Workspaces
from .app import WorkspaceId
from .changelog import DiffOut

MAX_ID = (1 << 63) - 1


def add_routes(app: FastAPI, workspaces: Workspaces, auth: list[Any], responses: dict[int | str, Any]) -> None:
    """Mount the route on ``app`` (whose state holds ``registry``)."""
    responses = {
        **responses,
        404: {"description": "No such workspace, or no entry matches"},
        409: {"description": "This service records no changelog"},
        422: {"description": "Not exactly one of entry, call_id, subtask_id"},
    }

    @app.get("/v1/workspaces/{workspace_id}/changelog/diff", tags=["changelog"], dependencies=auth, responses=responses)
    async def changes(
        request: Request,
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
        path = workspaces.path(workspace_id)
        ws = await request.app.state.registry.workspace(path)
        if not isinstance(ws.recorder, Changelog):
            return JSONResponse({"detail": "This service records no changelog"}, status_code=409)  # type: ignore[return-value]
        text = await ws.recorder.changes(entry=entry, call_id=call_id, subtask_id=subtask_id)
        return DiffOut(diff=safe_text(text))
