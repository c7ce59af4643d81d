"""A disk that fills during a snapshot or a fork (a small tmpfs), on the real engine under
runc and gVisor: the operation fails cleanly, its partial copy is removed, nothing is
recorded, and neither the workspace nor the snapshot loses anything."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import own_registry
from tests.docker.fork_volumes import remove_fork_volumes
from tests.mounts import tmpfs
from tests.treehash import tree_hash
from worker.snapshots import SnapshotDiskFullError, Snapshots

pytestmark = pytest.mark.docker

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "tinycalc"


@pytest.fixture(params=["runc", "runsc"])
async def reg(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[Any]:
    async with own_registry(tmp_path, request.param, durability="process") as registry:
        yield registry


@pytest.fixture
def project(tmp_path: Path) -> Path:
    ws = tmp_path / "ws" / "proj"
    shutil.copytree(FIXTURE, ws)
    (ws / "data").mkdir()
    for i in range(3):  # 12 MiB that do not compress or share
        (ws / "data" / f"blob{i}.bin").write_bytes(os.urandom(4 << 20))
    return ws


async def test_disk_full_during_a_snapshot(reg: Any, project: Path, tmp_path: Path) -> None:
    r = await reg.execute("shell_execute", {"command": "echo ready > state.txt"}, project)
    assert r.success, r.output
    want = tree_hash(project)
    with tmpfs(tmp_path / "data" / "snapshots", "8m") as store:
        snaps = Snapshots(reg, tmp_path / "data")
        try:
            with pytest.raises(SnapshotDiskFullError, match="full"):
                await snaps.create(project, "too big")
            assert [p.name for p in store.iterdir() if p.name.startswith("snap-")] == []  # nothing half-made
            assert await snaps.list(project) == []
        finally:
            snaps.close()
    assert tree_hash(project) == want
    r = await reg.execute("shell_execute", {"command": "cat state.txt"}, project)  # not left paused
    assert r.success and r.output.strip() == "ready", r.output


async def test_disk_full_during_a_fork(reg: Any, project: Path, tmp_path: Path) -> None:
    """A fork that is a copy (the ``copy`` strategy, ext4's before overlay forks) runs out
    of room in its destination: the partial copies go."""
    snaps = Snapshots(reg, tmp_path / "data", prefer="copy")
    try:
        snap = await snaps.create(project)
        tree = snaps.index.directory(snap.id) / "tree"
        want = tree_hash(project)
        with tmpfs(tmp_path / "small", "16m") as small:
            with pytest.raises(SnapshotDiskFullError):
                await snaps.fork(snap.id, 2, into=small)
            assert list(small.iterdir()) == []  # the partial copies are gone
        assert (await snaps.get(snap.id)).forks == []
        assert tree_hash(project) == want and tree_hash(tree) == want
        (fork,) = await snaps.fork(snap.id, 1)  # with room, the same snapshot forks
        assert tree_hash(fork) == want
        await reg.stop(fork)
    finally:
        snaps.close()


async def test_disk_full_during_an_overlay_fork(reg: Any, project: Path, tmp_path: Path) -> None:
    """An overlay fork writes only its layers' directories (in the data directory): with no
    room for them, the fork fails as a full disk, all or nothing (the forks it made, their
    volumes and layers removed), and with room the same snapshot forks."""
    data = tmp_path / "data"
    snaps = Snapshots(reg, data, prefer="overlay")
    try:
        snap = await snaps.create(project)
        want = tree_hash(project)
        # 6 inodes: the root and the first fork's three directories, then none
        with tmpfs(data / "fork-layers", "1m", inodes=6) as layers:
            with pytest.raises(SnapshotDiskFullError, match="full"):
                await snaps.fork(snap.id, 3, into=tmp_path / "attempts")
            assert list(layers.iterdir()) == []  # the forks made before are gone too
        assert (await snaps.get(snap.id)).forks == []
        assert list((tmp_path / "attempts").iterdir()) == []
        assert await asyncio.to_thread(remove_fork_volumes, data) == 0  # no volume left
        (fork,) = await snaps.fork(snap.id, 1, into=tmp_path / "attempts")
        await snaps.mount(fork)  # (its sandbox started: the engine mounts the tree)
        assert tree_hash(fork) == want
        await snaps.remove_fork(fork)
    finally:
        snaps.close()
        await asyncio.to_thread(remove_fork_volumes, data)
