"""Many workspaces opened at once start side by side, as many at a time as
``max_parallel_starts`` (LOOM_MAX_PARALLEL_STARTS) allows, with no lock of the pool or
the backend held across a start; the agents of started containers boot in slots of their
own, so the engine starts the next containers meanwhile. The engine is not asked (a
start is simulated)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandbox.docker import DockerBackend
from sandbox.errors import SandboxTimeoutError, SandboxUnavailableError
from worker.registry import ToolRegistry


class SlowStarts(DockerBackend):
    """A backend whose every start takes 50 ms and then fails (no engine here)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.running = 0
        self.peak = 0
        self.started: list[Path] = []

    async def _ensure_container(self, ws: Path, warm: bool = True) -> Any:
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


class _Container:
    def __init__(self, name: str) -> None:
        self.name = name


class SlowAgents(DockerBackend):
    """Containers start at once (simulated); each agent takes 50 ms to boot, then fails.
    The backend's own ``_connect`` runs between the two."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.booting = 0
        self.peak = 0
        self.starts_while_booting = 0

        async def attach_agent(container: Any, spec: Any) -> Any:
            self.booting += 1
            self.peak = max(self.peak, self.booting)
            try:
                await asyncio.sleep(0.05)
            finally:
                self.booting -= 1
            # (an error the backend does not handle by removing the container: no engine here)
            raise SandboxTimeoutError("simulated: no agent in this test")

        self.channels.attach_agent = attach_agent  # type: ignore[method-assign]

    async def _ensure_container(self, ws: Path, warm: bool = True) -> Any:
        if self.booting:
            self.starts_while_booting += 1
        name = f"c-{ws.name}"
        self._fresh.add(name)
        return _Container(name)


@pytest.mark.parametrize("limit", [1, 4])
async def test_agents_boot_in_their_own_slots_while_the_engine_starts_more(tmp_path: Path, limit: int) -> None:
    roots = []
    for i in range(8):
        (tmp_path / f"ws{i}").mkdir()
        roots.append(tmp_path / f"ws{i}")
    backend = SlowAgents(max_parallel_starts=limit)
    registry = ToolRegistry(backend=backend)
    try:
        results = await asyncio.gather(*(registry.execute("read_file", {"path": "x"}, workspace=str(r)) for r in roots))
    finally:
        await registry.aclose()
    assert all(not r.success and "simulated" in (r.error or "") for r in results)
    assert backend.peak == limit  # agents boot side by side, never beyond the limit
    # the engine was asked for more containers while agents were booting
    assert backend.starts_while_booting >= len(roots) - limit
