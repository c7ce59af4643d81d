"""The agent's ``keeper`` request (a warm sandbox's main agent becomes its
container's keeper at its claim, under runc rooted again: sandbox.docker.pool): what it refuses,
and when it keeps its root. That a claimed
sandbox then outlives its worker, and an unclaimed one does not, is
tests/docker/test_warm_pool.py's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import AgentError

_TTL = "ttl must be a positive number of seconds"
_ROOT = "root must be [st_dev, st_ino]"


@pytest.mark.parametrize(
    ("args", "message"),
    [({"ttl": ttl}, _TTL) for ttl in (0, -5, "900", True, None, float("nan"), float("inf"))]
    + [({"ttl": 60, "root": root}, _ROOT) for root in ("1:2", [1], [1, 2, 3], [1, "2"], [True, 2], [1.0, 2])],
)
async def test_a_malformed_keeper_request_is_refused(
    local_backend: Any, workspace: Path, args: dict[str, object], message: str
) -> None:
    """A ttl that is not a positive number of seconds, a root that is not ``[st_dev,
    st_ino]``: refused, and the agent serves on."""
    box = await local_backend.get(workspace)
    conn = await box.connection()
    with pytest.raises(AgentError) as e:
        await conn.request("keeper", args, timeout=5)
    assert e.value.code == "invalid" and message in str(e.value)
    assert (await conn.request("hello", {}, timeout=5))["pid"] > 0  # the agent serves on


async def test_a_keeper_request_keeps_its_root_unless_the_directory_there_is_the_one_named(
    local_backend: Any, workspace: Path, tmp_path: Path
) -> None:
    """A warm runc sandbox's agent opened its root (the slot's empty directory) in the pool;
    its claim binds the workspace over it and names the workspace by device and inode: the
    agent opens its root again only when that is the directory it finds there."""
    (workspace / "f.txt").write_text("the workspace's\n")
    box = await local_backend.get(workspace)
    conn = await box.connection()
    other = os.stat(tmp_path)  # a directory that is not at the agent's root
    with pytest.raises(AgentError) as e:
        await conn.request("keeper", {"ttl": 60, "root": [other.st_dev, other.st_ino]}, timeout=5)
    assert e.value.code == "conflict" and "is not the claimed workspace" in str(e.value)
    assert (await box.read("f.txt")).data == b"the workspace's\n"

    # The directory at the root swapped for another (as a bind over it would): the named
    # one is opened, and paths resolve in it from then on.
    moved = workspace.with_name(workspace.name + "-before")
    workspace.rename(moved)
    workspace.mkdir()
    (workspace / "f.txt").write_text("claimed\n")
    st = os.stat(workspace)
    assert (await box.read("f.txt")).data == b"the workspace's\n"
    got = await conn.request("keeper", {"ttl": 60, "root": [st.st_dev, st.st_ino]}, timeout=5)
    assert got["keeper_ttl"] == 60
    assert (await box.read("f.txt")).data == b"claimed\n"
    shutil.rmtree(moved)
