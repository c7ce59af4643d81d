"""A call whose deadline passes while it waits for another call's change to the same
workspace (one change at a time) is told so: a timeout, never "the sandbox did not
answer" (the infrastructure channel), which it was not asked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from worker.registry import ToolRegistry
from worker.result import ToolResult
from worker.tool import Tool, ToolContext


class HoldArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float
    deadline: float


async def _hold(args: HoldArgs, ctx: ToolContext) -> ToolResult:
    assert ctx.workspace is not None
    async with ctx.workspace.mutating():
        await asyncio.sleep(args.seconds)
    return ToolResult.ok("held")


# Its own limit is enforced elsewhere (as shell_execute's in the sandbox): its deadline
# passing is otherwise the infrastructure's failure.
HOLD = Tool(
    name="hold", description="Hold the workspace", args_model=HoldArgs, fn=_hold, timeout_for=lambda a: a.deadline
)


async def test_a_deadline_passed_waiting_for_the_workspace_is_a_timeout(tmp_path: Path, local_backend: Any) -> None:
    registry = ToolRegistry(backend=local_backend)
    registry.register(HOLD)
    try:
        first = asyncio.create_task(registry.execute("hold", {"seconds": 1.5, "deadline": 30.0}, tmp_path))
        await asyncio.sleep(0.3)  # it holds the workspace now
        second = await registry.execute("hold", {"seconds": 0.0, "deadline": 0.3}, tmp_path)
        assert not second.success and second.data is not None
        assert "waiting for another call's change to this workspace" in str(second.error)
        assert second.data.get("timed_out") is True and second.data.get("error_kind") != "infrastructure"
        assert (await first).success
        # Its own work past the deadline, the workspace free: the infrastructure's, as before.
        own = await registry.execute("hold", {"seconds": 1.0, "deadline": 0.3}, tmp_path)
        assert not own.success and own.data is not None and own.data.get("error_kind") == "infrastructure"
        assert "did not answer in time" in str(own.error)
    finally:
        await registry.aclose()
