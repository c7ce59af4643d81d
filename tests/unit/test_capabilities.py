"""The capability Protocols of a sandbox (:mod:`sandbox.capabilities`): the agent sandbox
has them all; a sandbox with only the core contract is refused where a capability is used,
with the error its callers handle, except staged writes, which it gets on the host."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import HostStaging, Sandbox, staged_writes
from sandbox.capabilities import (
    BackgroundProcesses,
    HarnessFiles,
    StagedWrites,
    Tunnels,
    background,
    harness_files,
    tunnels,
)
from sandbox.errors import AgentError, ConflictError, SandboxUnavailableError


class CoreOnly:
    """A sandbox of the core contract only: the local agent's files, nothing more."""

    def __init__(self, box: Sandbox) -> None:
        self._box = box

    async def stat(self, path: str) -> Any:
        return await self._box.stat(path)

    async def write(self, path: str, data: bytes, **kw: Any) -> Any:
        return await self._box.write(path, data, **kw)


async def test_the_agent_sandbox_has_every_capability(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    for capability in (StagedWrites, BackgroundProcesses, Tunnels, HarnessFiles):
        assert isinstance(box, capability)
    assert background(box) is box and tunnels(box) is box and harness_files(box) is box
    assert staged_writes(box) is box


async def test_a_missing_capability_is_the_error_its_callers_handle(local_backend: Any, workspace: Path) -> None:
    core: Any = CoreOnly(await local_backend.get(workspace))
    with pytest.raises(NotImplementedError, match="no background processes"):
        background(core)
    with pytest.raises(NotImplementedError, match="no file API outside the workspace"):
        harness_files(core)
    with pytest.raises(SandboxUnavailableError, match="CoreOnly cannot open tunnels"):
        tunnels(core)


async def test_staged_writes_of_a_core_sandbox_wait_on_the_host(local_backend: Any, workspace: Path) -> None:
    core: Any = CoreOnly(await local_backend.get(workspace))
    staging = staged_writes(core)
    assert isinstance(staging, HostStaging) and staged_writes(core) is staging  # one per sandbox
    (workspace / "a.txt").write_bytes(b"old")
    staged = await staging.stage_write("a.txt", b"new", expect_sha256=hashlib.sha256(b"old").hexdigest())
    assert staged.path == "a.txt" and (workspace / "a.txt").read_bytes() == b"old"
    result = await staged_writes(core).commit_write(staged, expect_path="a.txt")
    assert (workspace / "a.txt").read_bytes() == b"new" and not result.created
    with pytest.raises(AgentError, match="No staged write"):
        await staging.commit_write(staged)  # committed once
    # The conditions are checked at commit, by the write itself.
    staged = await staging.stage_write("a.txt", b"newer", expect_sha256=hashlib.sha256(b"old").hexdigest())
    with pytest.raises(ConflictError):
        await staging.commit_write(staged)
    staged = await staging.stage_write("b.txt", b"x", expect_absent=True)
    await staging.abort_write(staged)
    await staging.abort_write(staged)  # never raises
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt"]
