"""E2B's sandbox metrics, from what loom measures of a sandbox now (the engine's figures of
its container, as ``GET /v1/workspaces/{id}/sandbox`` shows them) and of its workspace:

    GET /sandboxes/{id}/metrics?start&end        200 [SandboxMetric]
    GET /sandboxes/metrics?sandbox_ids=a,b       200 {"sandboxes": {id: SandboxMetric}}

Loom keeps no history: the answer is one sample, taken now, while the sandbox's
container runs (none when it does not: paused, idle-stopped, or outside ``start``-``end``).
``cpuUsedPct`` is the percent of the sandbox's CPUs used since the service last looked
(of ``cpuCount``, its CPU limit rounded); ``memUsed`` the memory in use without the page
cache it can drop, ``memTotal`` its limit, ``memCache`` 0 (not measured apart);
``diskUsed`` the bytes the workspace's files take, ``diskTotal`` its filesystem's size.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sandbox.base import StatusReporter

from .answers import E2BError, answered, timestamp
from .plane import Plane, plane_of
from .records import SandboxRecord

router = APIRouter(include_in_schema=False)


def disk_used(root: Path, max_entries: int) -> int:
    """The bytes ``root``'s files take on disk (blocks, as ``du``; links not followed),
    counting at most ``max_entries`` entries (blocking)."""
    total, seen, stack = 0, 0, [str(root)]
    while stack and seen < max_entries:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
    return total


async def sample(plane: Plane, rec: SandboxRecord, path: Path) -> dict[str, Any] | None:
    """E2B's ``SandboxMetric`` of the sandbox now, or None when its container is not
    running. Raises DaemonUnavailableError."""
    if rec.state != "running":
        return None
    backend = plane.service.local.backend
    if not isinstance(backend, StatusReporter):
        return None
    found = await backend.status(path)
    usage = (found or {}).get("usage")
    if not found or not found.get("running") or not usage:
        return None
    limits = found.get("limits") or {}
    cpus = float(limits.get("cpus") or plane.settings.cpus)
    count = max(1, round(cpus))
    percent = usage.get("cpu_percent")

    def disk() -> tuple[int, int]:
        return disk_used(path, plane.settings.changelog_max_files), shutil.disk_usage(path).total

    used, total = await asyncio.to_thread(disk)
    now = time.time()
    return {
        "timestamp": timestamp(now),
        "timestampUnix": int(now),
        "cpuCount": count,
        "cpuUsedPct": 0.0 if percent is None else round(min(100.0, percent / count), 2),
        "memUsed": int(usage.get("memory_bytes") or 0),
        "memTotal": int(usage.get("memory_limit_bytes") or limits.get("memory_bytes") or 0),
        "memCache": 0,
        "diskUsed": used,
        "diskTotal": total,
    }


def _seconds(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise E2BError(400, f"{name}: a Unix time in seconds, not {raw!r}") from None
    if value < 0:
        raise E2BError(400, f"{name}: a Unix time in seconds, not {raw!r}")
    return value


@router.get("/sandboxes/metrics")
@answered
async def many(request: Request) -> Response:
    """The metrics of up to 100 sandboxes at once (those running; others are left out)."""
    plane = await plane_of(request.app).ready()
    ids = [i for v in request.query_params.getlist("sandbox_ids") for i in v.split(",") if i]
    if not ids:
        raise E2BError(400, "sandbox_ids: at least one sandbox id (comma-separated)")
    if len(set(ids)) > 100:
        raise E2BError(400, "sandbox_ids: at most 100")
    out: dict[str, Any] = {}
    for sandbox_id in dict.fromkeys(ids):
        try:
            path, rec = await plane.find(sandbox_id)
        except E2BError:
            continue
        metric = await sample(plane, rec, path)
        if metric is not None:
            out[sandbox_id] = metric
    return JSONResponse({"sandboxes": out})


@router.get("/sandboxes/{sandbox_id}/metrics")
@answered
async def one(request: Request, sandbox_id: str) -> Response:
    """The sandbox's metrics between ``start`` and ``end`` (Unix seconds): loom's one
    sample, now, when that is in the interval and the sandbox runs."""
    plane = await plane_of(request.app).ready()
    start, end = _seconds(request, "start"), _seconds(request, "end")
    if start is not None and end is not None and start > end:
        raise E2BError(400, "start: after end")
    path, rec = await plane.find(sandbox_id)
    now = time.time()
    if (start is not None and now < start) or (end is not None and math.floor(now) > end):
        return JSONResponse([])
    metric = await sample(plane, rec, path)
    return JSONResponse([] if metric is None else [metric])


__all__ = ["disk_used", "router", "sample"]
