"""At shutdown the service stops what it opened side by side, bounded like starts: one at a
time, 350 gVisor forks outlasted any orchestrator's grace and were left running. A stop
that fails (logged, never raised) does not keep the others from stopping."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from worker.http.lifespan import stop_opened

pytestmark = pytest.mark.asyncio


class _Registry:
    def __init__(self, fail: set[Path]) -> None:
        self.fail = fail
        self.stopped: list[Path] = []
        self.running = 0
        self.most = 0

    async def stop(self, path: Path) -> bool:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.01)
            if path in self.fail:
                raise RuntimeError("the engine did not answer")
            self.stopped.append(path)
            return True
        finally:
            self.running -= 1


class _Runner:
    def __init__(self, opened: set[Path]) -> None:
        self.opened = set(opened)

    def forget(self, path: Path) -> None:
        self.opened.discard(path)


@pytest.mark.parametrize("parallel", [1, 4, 16])
async def test_every_opened_sandbox_is_stopped_at_most_parallel_at_once(parallel: int) -> None:
    paths = {Path(f"/ws/{i}") for i in range(12)}
    failing = {Path("/ws/3")}
    registry, runner = _Registry(failing), _Runner(paths)
    await stop_opened(registry, runner, parallel=parallel)  # type: ignore[arg-type]
    assert set(registry.stopped) == paths - failing
    assert runner.opened == set()  # (a failed stop is forgotten too: the service is going)
    assert registry.most == min(parallel, len(paths))


async def test_nothing_opened_is_nothing_to_stop() -> None:
    registry: Any = _Registry(set())
    await stop_opened(registry, _Runner(set()), parallel=8)  # type: ignore[arg-type]
    assert registry.stopped == [] and registry.most == 0
