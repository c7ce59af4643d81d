"""A command that needs more memory than the sandbox's limit is the command's failure
(``outcome: "oom"``, a message saying so), never an infrastructure error, under runc (the
kernel kills the command) and gVisor (the host's cgroup sees the sandbox as one process and
the engine kills it whole: the worker reads that from the container's state and starts a
fresh one). The next call works."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docker.conftest import own_backend, require_runtime
from worker import ToolRegistry

pytestmark = pytest.mark.docker


@pytest.mark.alone  # (gVisor's out-of-memory kill: see scripts/test)
@pytest.mark.parametrize("runtime", ["runc", "runsc"])
@pytest.mark.parametrize(
    "command",
    [
        "python3 -c 'a = bytearray(8 * 1024**3)'",  # one allocation far past the limit
        # grows 16 MiB at a time until it hits the limit
        "python3 -c 'import time\na = []\nwhile True:\n    a.append(bytes(1) * (16 << 20)); time.sleep(0.01)'",
    ],
    ids=["bomb", "slow-grower"],
)
async def test_a_command_past_the_memory_limit_is_an_oom(
    docker_ready: None, workspace: Path, runtime: str, command: str
) -> None:
    require_runtime(runtime)
    async with own_backend(runtime, memory="512m") as backend:
        registry = ToolRegistry(backend=backend)
        r = await registry.execute("shell_execute", {"command": command, "timeout": 120}, workspace)
        assert not r.success, r.output
        data = r.data or {}
        assert data.get("error_kind") != "infrastructure", r.output
        assert data.get("outcome") == "oom", r.output
        assert "memory" in r.output and "limit" in r.output
        r = await registry.execute("shell_execute", {"command": "echo alive"}, workspace)
        assert r.success and "alive" in r.output
