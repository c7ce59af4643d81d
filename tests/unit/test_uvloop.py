"""The service runs under uvloop when it is installed (uvicorn picks it): the transports
must not assume asyncio's own classes. Same calls on the default loop are everywhere else."""

from __future__ import annotations

import asyncio
from pathlib import Path

import uvloop  # a declared dependency (pyproject): never skipped


async def _session(backend: object, workspace: Path) -> None:
    from worker import ToolRegistry

    async with ToolRegistry(backend=backend) as reg:  # type: ignore[arg-type]
        w = await reg.execute("write_file", {"path": "a.txt", "content": "hi\n"}, workspace)
        assert w.success, w.error
        e = await reg.execute("edit_file", {"path": "a.txt", "old_str": "hi", "new_str": "ho"}, workspace)
        assert e.success, e.error
        r = await reg.execute("read_file", {"path": "a.txt"}, workspace)
        assert r.success and r.output == "ho\n"
        s = await reg.execute("shell_execute", {"command": "cat a.txt; echo err >&2"}, workspace)
        assert s.success and s.data["stdout"] == "ho\n" and s.data["stderr"] == "err\n"
        p = await (await reg.workspace(workspace)).sandbox.spawn(["sh", "-c", "echo spawned"])
        assert await p.read_line() == b"spawned\n"


def test_local_backend_under_uvloop(workspace: Path) -> None:
    from sandbox.local import LocalProcessBackend

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_session(LocalProcessBackend(), workspace))
