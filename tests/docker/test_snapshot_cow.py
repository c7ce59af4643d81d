"""Copy-on-write snapshots and forks on the filesystems that allow them, loop-mounted for
the test (this host's own disk is ext4): btrfs (read-only subvolume snapshots, forks as
writable snapshots) and XFS (reflinks). The sandbox, under runc and gVisor, works in the
fork through its bind mount, and 8 untouched forks cost a few percent of the tree."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import own_registry
from tests.mounts import loop_fs
from tests.treehash import tree_hash
from worker.snapshots import Snapshots
from worker.snapshots.strategy import is_subvolume

pytestmark = pytest.mark.docker

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "tinycalc"


@pytest.fixture(params=["btrfs", "xfs"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with loop_fs(tmp_path / "fs", request.param) as mounted:
        yield request.param, mounted


@pytest.fixture(params=["runc", "runsc"])
async def env(request: pytest.FixtureRequest, docker_ready: None, disk: tuple[str, Path]) -> AsyncIterator[Any]:
    fstype, mounted = disk
    async with own_registry(mounted, request.param, durability="process") as reg:
        snaps = Snapshots(reg, mounted / "data")
        try:
            yield fstype, mounted, reg, snaps
        finally:
            snaps.close()


def _used(path: Path) -> int:
    os.sync()
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


async def test_forks_share_the_snapshot_and_the_sandbox_sees_them(env: Any) -> None:
    fstype, mounted, reg, snaps = env
    ws = mounted / "ws" / "proj"
    shutil.copytree(FIXTURE, ws)
    (ws / "data").mkdir()
    for i in range(4):  # 64 MiB that neither compress nor share
        (ws / "data" / f"blob{i}.bin").write_bytes(os.urandom(16 << 20))
    size = sum(p.stat().st_size for p in ws.rglob("*") if p.is_file())
    snap = await snaps.create(ws, "base")
    tree = snaps.index.directory(snap.id) / "tree"
    assert snap.strategy == ("btrfs" if fstype == "btrfs" else "reflink")
    if fstype == "btrfs":  # a read-only subvolume: immutable, even to root
        assert is_subvolume(tree)
        with pytest.raises(OSError):
            (tree / "new.txt").write_text("x")
    before = _used(mounted)
    forks = await snaps.fork(snap.id, 8)
    extra = _used(mounted) - before
    assert extra <= 0.05 * size, (extra, size)  # 8 untouched forks: at most 5 % of the tree
    try:
        assert all(tree_hash(f) == tree_hash(ws) for f in forks)
        if fstype == "btrfs":
            assert all(is_subvolume(f) for f in forks)
        command = "sha256sum data/blob0.bin | cut -c1-16 && echo mine > data/blob0.bin"
        r = await reg.execute("shell_execute", {"command": command}, forks[0])
        assert r.success, r.output
        assert (forks[0] / "data" / "blob0.bin").read_text() == "mine\n"
        assert (ws / "data" / "blob0.bin").stat().st_size == 16 << 20  # parent and snapshot untouched
        assert (tree / "data" / "blob0.bin").stat().st_size == 16 << 20
        assert tree_hash(forks[1]) == tree_hash(ws)
        child = await snaps.create(forks[0], "child")  # a fork's snapshot, and a fork of the fork
        assert child.parent == snap.id and child.strategy == snap.strategy
        (grand,) = await snaps.fork(child.id)
        assert (grand / "data" / "blob0.bin").read_text() == "mine\n"
        forks.append(grand)
    finally:
        for f in forks:
            await reg.stop(f)
    for f in forks:  # a subvolume goes with rm -r, as any directory
        await asyncio.to_thread(subprocess.run, ["rm", "-rf", str(f)], check=True)
    await snaps.delete(child.id)
    await snaps.delete(snap.id)
    assert not tree.exists()
