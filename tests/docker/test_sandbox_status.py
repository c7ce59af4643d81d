"""DockerBackend.status (GET /v1/workspaces/{id}/sandbox): a workspace's container as the
engine sees it, without ever starting one; CPU and memory while it runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.docker.conftest import own_backend
from worker import ToolRegistry

pytestmark = pytest.mark.docker

BUSY = "end=$(($(date +%s) + 3)); while [ $(date +%s) -lt $end ]; do :; done"


async def test_status_of_a_workspace_without_and_with_its_sandbox(docker_ready: None, workspace: Path) -> None:
    async with own_backend(memory="256m", pids=128) as backend:
        assert await backend.status(workspace) is None  # looking starts nothing
        assert await backend.status(workspace) is None
        reg = ToolRegistry(backend=backend)
        assert (await reg.execute("shell_execute", {"command": "true"}, workspace)).success
        idle = await backend.status(workspace)
        assert idle is not None and idle["running"] and idle["status"] == "running"
        assert idle["limits"] == {"cpus": 1.0, "memory_bytes": 256 << 20, "pids": 128}
        assert idle["runtime"] == "runc" and idle["container"].startswith("loom-sbx-")
        usage = idle["usage"]
        assert 0 < usage["memory_bytes"] < 256 << 20 and usage["memory_limit_bytes"] == 256 << 20
        assert usage["pids"] >= 1 and usage["cpu_percent"] is not None
        # CPU now, while a command keeps it busy (the engine is asked beside the call)
        busy = asyncio.create_task(reg.execute("shell_execute", {"command": BUSY}, workspace))
        await asyncio.sleep(1.0)
        await backend.status(workspace)
        await asyncio.sleep(1.0)
        during = await backend.status(workspace)
        assert (await busy).success
        assert during is not None and during["usage"]["cpu_percent"] > 10
        await backend.stop(workspace)
        assert await backend.status(workspace) is None
