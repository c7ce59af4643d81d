"""Many workspaces opened at once start side by side, as many at a time as
``max_parallel_starts`` (LOOM_MAX_PARALLEL_STARTS) allows, with no lock of the pool or
the backend held across a start. The engine is not asked (a start is simulated)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandbox.docker import DockerBackend
from sandbox.errors import SandboxUnavailableError
from worker.registry import ToolRegistry


class SlowStarts(DockerBackend):
    """A backend whose every start takes 50 ms and then fails (no engine here)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.running = 0
        self.peak = 0
        self.started: list[Path] = []

    async def _connect_now(self, ws: Path, *, after_loss: bool = False) -> Any:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(0.05)
            self.started.append(ws)
        finally:
            self.running -= 1
        raise SandboxUnavailableError("simulated: no engine in this test")


@pytest.mark.parametrize("limit", [1, 4, 16])
async def test_starts_overlap_up_to_the_limit(tmp_path: Path, limit: int) -> None:
    roots = []
    for i in range(12):
        (tmp_path / f"ws{i}").mkdir()
        roots.append(tmp_path / f"ws{i}")
    backend = SlowStarts(max_parallel_starts=limit)
    registry = ToolRegistry(backend=backend)
    try:
        results = await asyncio.gather(*(registry.execute("read_file", {"path": "x"}, workspace=str(r)) for r in roots))
    finally:
        await registry.aclose()
    assert all(not r.success and "simulated" in (r.error or "") for r in results)
    assert sorted(backend.started) == sorted(roots)  # every one started, none waited out
    assert backend.peak == min(limit, len(roots))  # side by side, never beyond the limit
    assert backend.engine.threads == limit + 4  # the engine's threads and connections follow it
