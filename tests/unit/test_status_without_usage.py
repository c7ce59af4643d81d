"""A look at whether a sandbox runs samples no usage: Docker 20.10's stats answer after a
second even for one sample (``one-shot``), so listing a workspace's terminals, processes or
code contexts took one to two seconds each, and a client polling them held the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sandbox.docker.engine import Engine
from sandbox.docker.housekeeping import Status
from worker.http.common import sandbox_runs


class _Container:
    name = "loom-sbx-test"
    id = "c0ffee"
    attrs = {"State": {"Status": "running"}, "HostConfig": {"Runtime": "runc"}, "Config": {}}

    def __init__(self) -> None:
        self.sampled = 0

    def stats(self, **_: Any) -> dict[str, Any]:
        self.sampled += 1
        return {"cpu_stats": {"cpu_usage": {"total_usage": 5}}, "memory_stats": {"usage": 1 << 20}}


def test_status_samples_usage_only_when_asked() -> None:
    container = _Container()
    status = Status(Engine(client_factory=lambda: None))
    quick = asyncio.run(status.of(container, usage=False))
    assert quick is not None and quick["running"] is True and quick["usage"] is None
    assert container.sampled == 0
    full = asyncio.run(status.of(container))
    assert full is not None and full["usage"] is not None and full["usage"]["memory_bytes"] == 1 << 20
    assert container.sampled == 2  # the first look: two samples, 0.1 s apart


class _Reporter:
    def __init__(self, found: dict[str, Any] | None) -> None:
        self.found = found
        self.asked: list[tuple[Path, bool]] = []

    async def status(self, workspace: Path, *, usage: bool = True) -> dict[str, Any] | None:
        self.asked.append((workspace, usage))
        return self.found


def test_sandbox_runs_asks_without_usage(tmp_path: Path) -> None:
    for found, runs in (({"running": True}, True), ({"running": False}, False), (None, False)):
        reporter = _Reporter(found)
        assert asyncio.run(sandbox_runs(reporter, tmp_path)) is runs
        assert reporter.asked == [(tmp_path, False)]


def test_sandbox_runs_without_a_status_reporter(tmp_path: Path) -> None:
    assert asyncio.run(sandbox_runs(object(), tmp_path)) is True  # its own calls answer then
