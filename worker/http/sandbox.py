"""``GET /v1/workspaces/{id}/sandbox``: a workspace's sandbox as it is now.

Whether its container runs, with which image, runtime and limits, and how much CPU and
memory it uses at this moment. Looking never starts a sandbox. A backend that cannot say
(the in-process test backend) answers ``"backend": null`` with nothing known.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from sandbox.base import StatusReporter

from .common import WS_ERRORS, WorkspaceId
from .state import ServiceDep


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpus: float | None = None
    memory_bytes: int | None = None
    pids: int | None = None


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpu_percent: float | None = Field(None, description="Percent of one CPU since the previous look.")
    memory_bytes: int | None = Field(None, description="Memory in use (without page cache it can drop).")
    memory_limit_bytes: int | None = None
    pids: int | None = None


class SandboxOut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    backend: str | None = Field(description="docker, or null when the backend cannot say.")
    exists: bool = Field(description="Whether the workspace has a container (running or not).")
    running: bool
    status: str | None = Field(None, description="The engine's state: running, exited, created, ...")
    container: str | None = None
    image: str | None = None
    runtime: str | None = None
    started_at: str | None = None
    oom_killed: bool = False
    limits: Limits = Field(default_factory=Limits)
    usage: Usage | None = Field(None, description="While it runs.")


router = APIRouter(tags=["workspaces"])


@router.get(
    "/v1/workspaces/{workspace_id}/sandbox",
    responses={**WS_ERRORS, 503: {"description": "The Docker engine does not answer"}},
)
async def sandbox_status(service: ServiceDep, workspace_id: WorkspaceId) -> SandboxOut:
    """The workspace's sandbox now: running or not, image, runtime, limits, CPU and
    memory in use. Never starts it."""
    path = await service.workspaces.locate(workspace_id)
    backend = service.local.backend
    if not isinstance(backend, StatusReporter):
        return SandboxOut(id=workspace_id, backend=None, exists=False, running=False)
    found: dict[str, Any] | None = await backend.status(path)
    if found is None:
        return SandboxOut(id=workspace_id, backend="docker", exists=False, running=False)
    return SandboxOut(id=workspace_id, backend="docker", exists=True, **found)
