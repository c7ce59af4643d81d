"""The changelog over HTTP: ``GET .../changelog``, ``GET .../changelog/{entry}/members``,
``GET .../diff``, ``POST .../undo``.

Same options as ``loom-worker log|diff|undo``. The changelog of a workspace is the recorder
its registry workspace writes through (so the service records every change a tool makes,
shell commands included); :class:`ChangelogPool` hands the registry one per workspace.
Diff and undo run through the workspace's sandbox, under the same per-workspace lock and
global limit as tool calls.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..changelog import (
    Changelog,
    Durability,
    Entry,
    Limits,
    Summary,
    UndoResult,
)
from ..quoting import quote_path, unquote_path
from ..result import safe_text
from .common import WS_ERRORS, WorkspaceId
from .errors import NoChangelog
from .state import Service, ServiceDep


class ChangelogPool:
    """One open :class:`Changelog` per workspace, for ``ToolRegistry(recorder_factory=...)``."""

    def __init__(self, data_dir: Path, durability: Durability = "full", *, limits: Limits | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.durability: Durability = durability
        self.limits = limits
        self._open: dict[Path, Changelog] = {}
        self._opening = threading.Lock()  # (the registry opens a workspace's in a thread)

    def recorder(self, root: Path) -> Changelog:
        """The changelog of ``root``. Raises ChangelogStorageError."""
        with self._opening:
            cl = self._open.get(root)
            if cl is None:
                cl = self._open[root] = Changelog.open(
                    self.data_dir, root, limits=self.limits, durability=None if self.limits else self.durability
                )
            return cl

    async def aclose(self) -> None:
        for cl in self._open.values():
            await cl.aclose()
        self._open.clear()


class UndoRequest(BaseModel):
    """Exactly one selector: entry, call_id, subtask_id, to, all, or last."""

    model_config = ConfigDict(extra="forbid")

    entry: int | None = Field(None, ge=1, le=(1 << 63) - 1, description="One entry.")
    call_id: str | None = Field(None, min_length=1, max_length=256, description="Every entry of a call id.")
    subtask_id: str | None = Field(None, min_length=1, max_length=256, description="Every entry of a subtask.")
    to: int | None = Field(None, ge=0, le=(1 << 63) - 1, description="Everything after entry N (0 = everything).")
    all: bool = Field(False, description="Everything.")
    last: int | None = Field(
        None, ge=1, le=1_000_000, description="The last N groups not yet reverted (calls, an agent's turns)."
    )
    dry_run: bool = Field(False, description="Return the diff it would apply; change nothing.")
    force: bool = Field(False, description="Overwrite files that changed since the entry.")

    @model_validator(mode="after")
    def _one_selector(self) -> UndoRequest:
        given = (self.entry, self.call_id, self.subtask_id, self.to, self.last)
        if sum(x is not None for x in given) + self.all != 1:
            raise ValueError("give exactly one of entry, call_id, subtask_id, to, all, last")
        return self


class DiffOut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    diff: str


def is_changelog(recorder: Any) -> bool:
    """Whether ``recorder`` is a changelog (not a service recording none)."""
    return isinstance(recorder, Changelog)


async def changelog_and_box(service: Service, ws_id: str) -> tuple[Path, Any, Any]:
    """The workspace's path, changelog and sandbox. Raises NoChangelog (a 409) when the
    service records none, InvalidWorkspaceId, WorkspaceNotFound."""
    path = await service.workspaces.locate(ws_id)
    ws = await service.local.workspace(path)
    if not is_changelog(ws.recorder):
        raise NoChangelog
    return path, ws.recorder, ws.sandbox


router = APIRouter(tags=["changelog"])
_RESPONSES = {
    **WS_ERRORS,
    409: {"description": "Undo conflict or refusal, or no changelog recorded by this service"},
    503: {"description": "The sandbox is unavailable"},
}
_WS_PATH = "/v1/workspaces/{workspace_id}"


@router.get(f"{_WS_PATH}/changelog", responses=_RESPONSES)
async def changelog(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    path: str | None = Query(None, max_length=4096, description="Only entries for this path."),
    call_id: str | None = Query(None, max_length=256),
    subtask_id: str | None = Query(None, max_length=256),
    limit: int | None = Query(None, ge=1, le=100_000, description="Only the last N entries."),
) -> list[Entry]:
    _p, cl, _box = await changelog_and_box(service, workspace_id)
    path = None if path is None else unquote_path(path)
    return [e.shown() for e in await cl.log(path=path, call_id=call_id, subtask_id=subtask_id, limit=limit)]


@router.get(f"{_WS_PATH}/changelog/{{entry_id}}/members", responses=_RESPONSES)
async def members(
    service: ServiceDep, workspace_id: WorkspaceId, entry_id: int = PathParam(ge=0, le=(1 << 63) - 1)
) -> list[str]:
    """The paths a group entry stands for (``detail`` says ``group: ...``), quoted as
    the changelog quotes paths; [] for any other entry. 404 for an unknown entry."""
    _p, cl, _box = await changelog_and_box(service, workspace_id)
    return [quote_path(p) for p in await cl.members(entry_id)]


@router.get(f"{_WS_PATH}/diff", responses=_RESPONSES)
async def diff(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    path: str | None = Query(None, max_length=4096, description="Only this workspace-relative path."),
    summary: bool = Query(False, description="Created/modified/deleted/renamed paths instead of a diff."),
) -> DiffOut | Summary:
    p, cl, box = await changelog_and_box(service, workspace_id)
    if summary:
        return (await cl.summary()).shown()
    async with service.runner.lock(p):
        return DiffOut(diff=safe_text(await cl.diff(box, None if path is None else unquote_path(path))))


@router.post(f"{_WS_PATH}/undo", responses=_RESPONSES)
async def undo(service: ServiceDep, workspace_id: WorkspaceId, body: UndoRequest) -> UndoResult:
    p, cl, box = await changelog_and_box(service, workspace_id)
    runner = service.runner
    async with runner.slot(), runner.lock(p), (await service.local.workspace(p)).mutating():
        result = await cl.undo(
            box,
            entry=body.entry,
            call_id=body.call_id,
            subtask_id=body.subtask_id,
            to=body.to,
            all=body.all,
            last=body.last,
            dry_run=body.dry_run,
            force=body.force,
        )
        return result.shown()


__all__ = ["ChangelogPool", "DiffOut", "UndoRequest", "is_changelog", "router"]
