"""Forks on ext4 as overlay volumes the engine mounts (issue 44, item 3), runc and gVisor:
O(1) forks whose trees are independent, whose lower layer (the snapshot) never changes,
where renaming a directory of the snapshot works, whose changelog undoes, and whose
volume goes with the fork. The other fork tests (test_snapshots_docker.py) run through
this strategy too on this host's ext4; these check what is particular to it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox.errors import SandboxUnavailableError
from tests.docker.conftest import own_registry
from tests.docker.fork_volumes import remove_fork_volumes
from tests.treehash import tree_diff, tree_hash, tree_state
from worker.changelog import Changelog
from worker.snapshots import Snapshots, overlay

pytestmark = pytest.mark.docker


def _fstype(path: Path) -> str:
    import subprocess

    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()


@pytest.fixture(params=["runc", "runsc"])
async def env(
    request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path
) -> AsyncIterator[tuple[Any, Snapshots]]:
    if _fstype(tmp_path) in ("btrfs", "xfs"):
        pytest.fail("this test is about ext4-like hosts; tmp_path is on a copy-on-write filesystem")
    async with own_registry(tmp_path, request.param, durability="process") as reg:
        snaps = Snapshots(reg, tmp_path / "data")
        try:
            yield reg, snaps
        finally:
            snaps.close()
    await asyncio.to_thread(remove_fork_volumes, tmp_path)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    ws = tmp_path / "ws" / "proj"
    (ws / "pkg" / "sub").mkdir(parents=True)
    (ws / "pkg" / "sub" / "mod.py").write_text("X = 1\n")
    (ws / "README.md").write_text("readme\n")
    for p in (ws.parent, ws, *ws.rglob("*")):
        os.lchown(p, 1000, 1000)
    return ws


async def sh(reg: Any, ws: Path, command: str) -> str:
    r = await reg.execute("shell_execute", {"command": command}, ws)
    assert r.success, (command, r.output[-2000:])
    return str(r.output)


async def test_overlay_forks_are_independent_and_leave_the_snapshot_alone(
    env: tuple[Any, Snapshots], project: Path
) -> None:
    reg, snaps = env
    snap = await snaps.create(project, "base")
    tree = snaps.index.directory(snap.id) / "tree"
    before = tree_hash(tree)
    a, b = await snaps.fork(snap.id, 2)
    try:
        for f in (a, b):
            assert f.is_symlink() and overlay.is_overlay_fork(os.path.realpath(f))
            assert (await snaps.origin(f)) is not None and (await snaps.origin(f)).strategy == "overlay"  # type: ignore[union-attr]
        # A directory of the lower layer renamed with rename(2) (redirect_dir), a file of it
        # removed, one appended to in place, a new one: in fork a only.
        await sh(
            reg,
            a,
            'python3 -c \'import os; os.rename("pkg", "lib")\' && rm README.md && echo 2 >> lib/sub/mod.py '
            "&& echo new > new.txt",
        )
        assert (await sh(reg, a, "cat lib/sub/mod.py; ls")).split() == ["X", "=", "1", "2", "lib", "new.txt"]
        assert (await sh(reg, b, "cat pkg/sub/mod.py README.md")).split() == ["X", "=", "1", "readme"]
        assert tree_hash(tree) == before  # the lower layer is never written
        assert (a / "lib" / "sub" / "mod.py").read_text() == "X = 1\n2\n"  # the host sees the merged tree
        assert not (b / "new.txt").exists() and (b / "README.md").exists()
        assert (await sh(reg, b, "stat -c %u .")).strip() == "1000"  # the owner's, as the snapshot's root
        # Undo in the fork, through its changelog.
        ws = await reg.workspace(a)
        assert isinstance(ws.recorder, Changelog)
        r = await reg.execute("write_file", {"path": "lib/sub/mod.py", "content": "Y = 3\n"}, a)
        assert r.success, r.output
        undone = await ws.recorder.undo(ws.sandbox, entry=await ws.recorder.last_entry())
        assert not undone.failed
        assert (await sh(reg, a, "cat lib/sub/mod.py")).split() == ["X", "=", "1", "2"]
        # A snapshot of an overlay fork (its merged tree), and a fork of that: overlays nest.
        s2 = await snaps.create(a, "child")
        (c,) = await snaps.fork(s2.id)
        # beside fork a and named after it (not "_data-fork-..." in the engine's volume directory)
        assert c.parent == a.parent and c.name.startswith(f"{a.name[:40]}-fork-"), c
        assert (await sh(reg, c, "cat lib/sub/mod.py new.txt")).split() == ["X", "=", "1", "2", "new"]
        assert s2.parent == snap.id
        # Restore fork a to the base snapshot, through its sandbox.
        done = await snaps.restore(a, snap.id)
        assert done.plan.failed == []
        assert tree_hash(a) == before, tree_diff(tree_state(tree), tree_state(a))
        await snaps.remove_fork(c)
    finally:
        for f in (a, b):
            await reg.stop(f)


async def test_a_forks_changes_are_recorded_across_a_new_mount(env: tuple[Any, Snapshots], project: Path) -> None:
    """The engine mounts a fork's overlay afresh at each start of its sandbox (here the
    container is removed under it, as a crash would): the changelog still sees every
    command's changes (under gVisor the host scans the mount, never the bare directory
    under it, and never trusts watches of the previous mount), so a restore undoes them."""
    from sandbox.docker.config import container_name

    reg, snaps = env
    snap = await snaps.create(project)
    tree = snaps.index.directory(snap.id) / "tree"
    (a,) = await snaps.fork(snap.id)
    try:
        await sh(reg, a, "mkdir made && echo 1 > made/one")
        real = Path(os.path.realpath(a))
        client = docker.from_env()
        try:
            await asyncio.to_thread(client.containers.get(container_name(real)).remove, force=True)
        finally:
            client.close()
        assert not os.path.ismount(real)  # the engine let go of the overlay
        await sh(reg, a, "echo 2 > made/two && rm README.md")
        assert sorted(os.listdir(a / "made")) == ["one", "two"]
        done = await snaps.restore(a, snap.id)
        assert done.plan.failed == [] and "made" in done.plan.removed, done.plan
        assert tree_hash(a) == tree_hash(tree), tree_diff(tree_state(tree), tree_state(a))
    finally:
        await reg.stop(a)


async def test_nothing_planted_in_a_forks_repository_runs_on_the_host(
    env: tuple[Any, Snapshots], project: Path
) -> None:
    """An overlay fork's .git has no protective mounts (see sandbox/docker/config.py): the
    host's guard holds it, trusting what its snapshot held (the owner's hook stays
    executable), disabling what the sandbox plants after each call, and never taking its
    trust afresh when the engine mounts the fork again (a new device number each start)."""
    from sandbox.docker.config import container_name

    reg, snaps = env
    git = project / ".git"
    for d in ("objects", "refs", "hooks"):
        (git / d).mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (git / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (git / "hooks" / "pre-commit").chmod(0o755)
    for p in (git, *git.rglob("*")):
        os.lchown(p, 1000, 1000)
    snap = await snaps.create(project)
    (a,) = await snaps.fork(snap.id)
    try:
        plant = "printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > .git/hooks/{0} && chmod +x .git/hooks/{0}"
        await sh(
            reg,
            a,
            plant.format("post-checkout") + " && git config --file .git/config core.hooksPath /tmp || "
            "printf '\\thooksPath = /tmp\\n' >> .git/config",
        )
        assert os.stat(a / ".git" / "hooks" / "pre-commit").st_mode & 0o111  # the owner's, trusted
        assert not os.stat(a / ".git" / "hooks" / "post-checkout").st_mode & 0o111
        assert "hooksPath" not in (a / ".git" / "config").read_text()
        client = docker.from_env()
        try:
            await asyncio.to_thread(client.containers.get(container_name(Path(os.path.realpath(a)))).remove, force=True)
        finally:
            client.close()
        await sh(reg, a, plant.format("pre-push"))  # on the next mount
        assert not os.stat(a / ".git" / "hooks" / "pre-push").st_mode & 0o111
        assert not os.stat(a / ".git" / "hooks" / "post-checkout").st_mode & 0o111
    finally:
        await reg.stop(a)


async def test_deleting_forks_removes_their_volumes_and_the_kept_snapshot(
    env: tuple[Any, Snapshots], project: Path, tmp_path: Path
) -> None:
    reg, snaps = env
    snap = await snaps.create(project)
    (a,) = await snaps.fork(snap.id)
    await sh(reg, a, "echo x > x")  # running: the engine must be made to let go of it
    real = Path(os.path.realpath(a))
    volume = real.parent.name
    assert await snaps.delete(snap.id, force=True) == [str(a)]  # named by its directory
    tree = snaps.index.directory(snap.id) / "tree"
    assert tree.is_dir()  # kept: the fork's lower layer
    assert (await sh(reg, a, "cat x README.md")).split() == ["x", "readme"]
    await snaps.remove_fork(a)
    client = docker.from_env()
    try:
        with pytest.raises(docker.errors.NotFound):
            client.volumes.get(volume)
    finally:
        client.close()
    assert not os.path.lexists(a) and not tree.exists()
    assert not (tmp_path / "data" / overlay.LAYERS_DIR / volume).exists()


async def test_overlay_forks_over_http_are_the_services_workspaces(env: tuple[Any, Snapshots], tmp_path: Path) -> None:
    """The HTTP service's forks on this host are links under its root to the engine's
    mountpoints: each is a workspace of the service (found, listed, called), every answer
    names it by its directory under the root (snapshots, forks, origin: the dashboard's
    fork tree links them), and deleting it with its files removes the fork whole."""
    from tests.unit.test_http import running

    reg, _snaps = env
    root = tmp_path / "root"
    async with running(root, reg, data_dir=tmp_path / "data") as s:
        c = s.client
        await s.workspace("w1")
        await s.execute("w1", "write_file", path="a.txt", content="one\n")
        r = await c.post("/v1/workspaces/w1/fork", json={"count": 1})
        assert r.status_code == 201, r.text
        (f,) = r.json()["workspaces"]
        fid, fpath = f["id"], Path(f["path"])
        assert fpath == root.resolve() / fid and fpath.is_symlink()
        volume = Path(os.path.realpath(fpath)).parent.name
        assert (await s.execute(fid, "write_file", path="a.txt", content="two\n"))["success"]
        assert (root / "w1" / "a.txt").read_text() == "one\n" and (fpath / "a.txt").read_text() == "two\n"
        assert fid in [w["id"] for w in (await c.get("/v1/workspaces")).json()]
        r = await c.get(f"/v1/workspaces/{fid}/snapshots")
        assert r.status_code == 200 and r.json()["origin"]["workspace"] == str(fpath), r.text
        (base,) = (await c.get("/v1/workspaces/w1/snapshots")).json()["snapshots"]
        assert base["live_forks"] == [str(fpath)]
        r = await c.post(f"/v1/workspaces/{fid}/snapshots", json={"name": "child"})
        assert r.status_code == 201 and r.json()["workspace"] == str(fpath), r.text
        assert (await c.get(f"/v1/workspaces/{fid}/snapshots/child")).status_code == 200
        r = await c.post(f"/v1/workspaces/{fid}/fork", json={"snapshot": "child"})
        assert r.status_code == 201, r.text
        (g,) = r.json()["workspaces"]
        r = await c.post(
            f"/v1/workspaces/{g['id']}/execute", json={"tool": "read_file", "arguments": {"path": "a.txt"}}
        )
        assert r.status_code == 200 and "two" in r.text, r.text
        # A fork of the fork as it is now (no snapshot given): named after the fork, not "_data".
        r = await c.post(f"/v1/workspaces/{fid}/fork", json={"count": 1})
        assert r.status_code == 201, r.text
        (h,) = r.json()["workspaces"]
        assert h["id"].startswith(f"{fid}-") and Path(h["path"]) == root.resolve() / h["id"], h
        r = await c.post(
            f"/v1/workspaces/{h['id']}/execute", json={"tool": "read_file", "arguments": {"path": "a.txt"}}
        )
        assert r.status_code == 200 and "two" in r.text, r.text
        for w in (fid, g["id"], h["id"]):
            r = await c.delete(f"/v1/workspaces/{w}?delete_files=true")
            assert r.status_code == 200, r.text
        assert not os.path.lexists(fpath) and fid not in [w["id"] for w in (await c.get("/v1/workspaces")).json()]
    client = docker.from_env()
    try:
        with pytest.raises(docker.errors.NotFound):
            client.volumes.get(volume)
    finally:
        client.close()
    assert not (tmp_path / "data" / overlay.LAYERS_DIR / volume).exists()


async def test_gc_removes_the_fork_volumes_no_fork_is_and_never_a_live_fork(
    env: tuple[Any, Snapshots], project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc: a volume whose layers are gone (with the sandbox still using it) and one no
    fork record names (a fork that crashed before recording it) go; a live fork stays,
    engine-wide too."""
    reg, snaps = env
    data = tmp_path / "data"
    snap = await snaps.create(project)
    live, lost = await snaps.fork(snap.id, 2)
    await sh(reg, lost, "echo x > x")  # its sandbox runs
    lost_volume = Path(os.path.realpath(lost)).parent.name
    tree = snaps.index.directory(snap.id) / "tree"
    unrecorded = await overlay.make(reg.backend, tree, data, snap.id, tmp_path / "crashed")
    await asyncio.to_thread(lambda: __import__("shutil").rmtree(data / overlay.LAYERS_DIR / lost_volume))

    async def recorded(mountpoint: str) -> bool:
        return await snaps.origin(mountpoint) is not None

    # within the grace a volume without a record may be a fork being made: left alone
    assert await overlay.gc(reg.backend, data, recorded) == [lost_volume]
    monkeypatch.setattr(overlay, "UNRECORDED_GRACE", 0.0)
    assert await overlay.gc(reg.backend, data, recorded) == [unrecorded.parent.name]
    # engine-wide: also other data directories' volumes whose layers are gone, never a live fork
    assert Path(os.path.realpath(live)).parent.name not in await overlay.gc(
        reg.backend, data, recorded, engine_wide=True
    )
    client = docker.from_env()
    try:
        names = {v.name for v in client.volumes.list(filters={"name": "loom-fork-"})}
    finally:
        client.close()
    assert not {lost_volume, unrecorded.parent.name} & names
    assert Path(os.path.realpath(live)).parent.name in names
    assert (await sh(reg, live, "cat README.md")).strip() == "readme"


async def test_a_sandbox_never_writes_into_a_bare_mountpoint(env: tuple[Any, Snapshots], tmp_path: Path) -> None:
    reg, _snaps = env
    # A volume with a fork volume's name that is not one of ours (no overlay, no label):
    # its mountpoint is never used as the workspace.
    client = docker.from_env()
    vol = client.volumes.create("loom-fork-test" + os.urandom(4).hex())
    try:
        mountpoint = Path(vol.attrs["Mountpoint"])
        with pytest.raises(SandboxUnavailableError, match="no such fork volume"):
            await reg.backend.ensure_container(mountpoint)
        assert os.listdir(mountpoint) == []
    finally:
        vol.remove(force=True)
        client.close()
