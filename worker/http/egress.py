"""``GET /v1/workspaces/{id}/egress``: a workspace's egress allowlist and its log.

The allowlist is a workspace setting (``PATCH /v1/workspaces/{id}`` with ``{"egress":
[...]}``, see :mod:`worker.http.settings`); this route shows what the gateway did with
it: every connection attempt, plain-HTTP request and name lookup, newest first, with the
verdict, the reason, the address the gateway connected to and the bytes each way.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query

from .common import WS_ERRORS, WorkspaceId
from .state import ServiceDep

router = APIRouter(tags=["egress"])


@router.get("/v1/workspaces/{workspace_id}/egress", responses=WS_ERRORS)
async def egress(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    limit: int = Query(100, ge=1, le=10_000, description="The newest N records."),
    verdict: Literal["allowed", "denied", "limited", "error"] | None = Query(None, description="Only these."),
) -> dict[str, Any]:
    """The workspace's egress allowlist (empty: no network), whether this service serves
    its gateway now, and its newest log records, newest first."""
    path = await service.workspaces.locate(workspace_id)
    registry = service.local
    if registry.configs is None:
        return {"policy": [], "enabled": False, "serving": False, "entries": []}
    status = registry.egress_status(path, limit=limit, verdict=verdict)
    return {"id": workspace_id, **status}
