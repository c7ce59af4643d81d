"""The agent's ``keeper`` request (a warm gVisor sandbox's main agent becomes its
container's keeper at its claim: sandbox.docker.pool): what it refuses. That a claimed
sandbox then outlives its worker, and an unclaimed one does not, is
tests/docker/test_warm_pool.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import AgentError


@pytest.mark.parametrize("ttl", [0, -5, "900", True, None, float("nan"), float("inf")])
async def test_a_keeper_request_without_a_positive_ttl_is_refused(
    local_backend: Any, workspace: Path, ttl: object
) -> None:
    box = await local_backend.get(workspace)
    conn = await box.connection()
    with pytest.raises(AgentError) as e:
        await conn.request("keeper", {"ttl": ttl}, timeout=5)
    assert e.value.code == "invalid" and "ttl must be a positive number of seconds" in str(e.value)
    assert (await conn.request("hello", {}, timeout=5))["pid"] > 0  # the agent serves on
