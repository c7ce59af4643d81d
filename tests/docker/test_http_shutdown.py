"""``serve``'s shutdown stops every sandbox it opened (``LOOM_STOP_SANDBOXES_ON_EXIT``), side
by side: none of them is left running for its idle TTL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.conftest import sandboxes_under
from tests.docker.conftest import require_runtime, served

pytestmark = [pytest.mark.docker, pytest.mark.asyncio]


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_shutdown_stops_every_sandbox_the_service_opened(
    docker_ready: None, tmp_path: Path, runtime: str
) -> None:
    require_runtime(runtime)
    root = tmp_path / "root"
    async with served(tmp_path, "shutdown-token", workspace="w0", runtime=runtime, max_parallel_starts=4) as c:
        for i in range(1, 6):
            r = await c.post("/v1/workspaces", json={"name": f"w{i}"})
            assert r.status_code == 201, r.text
        answers = await asyncio.gather(
            *(
                c.post(f"/v1/workspaces/w{i}/execute", json={"tool": "shell_execute", "arguments": {"command": "true"}})
                for i in range(6)
            )
        )
        assert all(a.status_code == 200 and a.json()["success"] for a in answers), [a.text[:300] for a in answers]
        assert len(sandboxes_under(root)) == 6
    assert sandboxes_under(root) == []


async def test_shutdown_stops_sandboxes_that_routes_started_without_a_tool_call(
    docker_ready: None, tmp_path: Path
) -> None:
    """A sandbox started by a harness read, or by a code execution refused once
    the sandbox had started (no room for the changelog: a 507), is stopped with the service
    as a tool call's is."""
    root = tmp_path / "root"
    async with served(tmp_path, "shutdown-token", workspace="w0", changelog_reserve_bytes=1 << 60) as c:
        for i in (1,):
            assert (await c.post("/v1/workspaces", json={"name": f"w{i}"})).status_code == 201
        (root / "w0" / "f.txt").write_text("x")
        r = await c.get("/v1/workspaces/w0/sandbox/files", params={"path": "f.txt"})
        assert r.status_code == 200 and r.content == b"x", r.text
        r = await c.post("/v1/workspaces/w1/code/execute", json={"code": "1"})
        assert r.status_code == 507, r.text
        assert len(sandboxes_under(root)) == 2
    assert sandboxes_under(root) == []
