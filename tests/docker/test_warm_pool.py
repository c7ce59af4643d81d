"""Warm sandboxes (issue 44): a claimed one serves its workspace as a fresh one does, keeps
nothing of anyone before, is found by another process as the workspace's own, respects the
pool's limits, and is gone after ``gc --all`` and after shutdown; under runc and gVisor.
Under gVisor (whose gofer serves only the directory it opened at start) the claim moves
the slot's directory into the place of an empty workspace; any other starts cold."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.docker import container_name, freezer, slots
from sandbox.docker.channel import _mounted_channel as channel_of
from sandbox.results import ExecRequest
from tests.conftest import TEST_OWNER
from tests.docker.conftest import POOL_ROOT, make_backend, own_backend, pooled_backend, require_runtime, wait_ready

pytestmark = pytest.mark.docker

RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "runsc"])


@pytest.fixture
def second_workspace() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="loom-ws-")).resolve()
    try:
        yield d
    finally:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


async def _sh(backend: object, ws: Path, command: str) -> str:
    box = await backend.get(ws)  # type: ignore[attr-defined]
    res = await box.exec(ExecRequest(command=command))
    assert res.outcome == "exit", res
    return str(res.stdout.decode())


def _mounted_slots() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if f" {POOL_ROOT}/" in line and "/.stage" not in line]


def _gvisor_slots() -> list[Path]:
    """The gVisor slots left on the host (made beside the pool's directory)."""
    from sandbox.docker.pool import PoolConfig

    moved = PoolConfig(root=POOL_ROOT).moved_root
    return [p for p in moved.iterdir() if (p / slots.SLOT_MARK).exists()] if moved.exists() else []


def _no_slots_left() -> bool:
    return _mounted_slots() == [] and _gvisor_slots() == []


async def _ours_pooled(backend: object, owner: str = TEST_OWNER) -> list[dict[str, object]]:
    """The warm sandboxes of this file's pools (their slots under POOL_ROOT, gVisor's under
    its sibling): the run's other files, beside this one, pool under their own data
    directories with the same owner."""
    return [
        i
        for i in await backend.list_sandboxes()  # type: ignore[attr-defined]
        if i["pooled"]
        and i["owner"] == owner
        and str((i["container"].labels or {}).get(slots.LABEL_SLOT, "")).startswith(str(POOL_ROOT))
    ]


async def test_a_claimed_sandbox_is_the_workspaces_own(docker_ready: None, workspace: Path) -> None:
    (workspace / "hello.txt").write_text("hi\n")
    os.chown(workspace, 1000, 1000)
    async with pooled_backend(uid=1000, gid=1000) as backend:
        out = await _sh(backend, workspace, "cat hello.txt; id -u; id -g; pwd; echo $HOME; echo made > new.txt")
        assert out.split() == ["hi", "1000", "1000", "/workspace", "/home/sandbox"]
        assert (workspace / "new.txt").read_text() == "made\n"
        status = backend.pool_status()
        assert status is not None and status["claims"] == 1 and status["misses"] == 0
        # Found by its workspace's name and labels, as a fresh one: another process (no
        # pool) reuses it instead of replacing it.
        container = await backend.engine.find(container_name(workspace))
        assert container is not None and slots.workspace_of(container.labels) == str(workspace)
        other = make_backend(uid=1000, gid=1000)
        try:
            assert "hi" in await _sh(other, workspace, "cat hello.txt")
            again = await other.engine.find(container_name(workspace))
            assert again is not None and again.id == container.id
        finally:
            await other.aclose()
        # Stopped: the container is removed and the workspace's bind undone on the host.
        slot = slots.slot_of(container.labels)
        assert slot is not None and str(slot / "ws") in _mounted_slots()
        await backend.stop(workspace)
        assert str(slot / "ws") not in _mounted_slots()
        assert not slot.exists()
        assert (workspace / "hello.txt").read_text() == "hi\n"  # the workspace itself untouched


async def test_a_claim_that_loses_its_name_to_a_peer_adopts_the_peers(docker_ready: None, workspace: Path) -> None:
    """The claim's rename runs while its agent boots: a peer process that makes the
    workspace's container meanwhile wins the name, and the claimant serves the workspace
    from the peer's container; the warm one and its slot's binds are gone."""
    async with pooled_backend() as backend:
        assert backend.pool is not None
        other = make_backend()
        rename = backend.pool._rename
        warm: list[object] = []

        async def racing(container: object, name: str, ws: Path, pool_name: str | None) -> bool:
            warm.append(container)
            await other.ensure_container(ws)  # the peer makes the workspace's container first
            return await rename(container, name, ws, pool_name)

        backend.pool._rename = racing  # type: ignore[method-assign]
        try:
            assert "ok" in await _sh(backend, workspace, "echo ok")
            served = await backend.engine.find(container_name(workspace))
            peers = await other.engine.find(container_name(workspace))
            assert served is not None and peers is not None and served.id == peers.id
            assert slots.LABEL_SLOT not in (served.labels or {})  # the peer's own, cold
            assert len(warm) == 1
            # named by its pool name again (its removal waited for that name, not the peer's)
            assert warm[0].name.startswith(slots.POOL_PREFIX)  # type: ignore[attr-defined]
            slot = warm[0].labels[slots.LABEL_SLOT]  # type: ignore[attr-defined]
            assert slot.startswith(str(POOL_ROOT)) and not Path(slot).exists()
            assert not any(m.startswith(slot) for m in _mounted_slots())
            assert await backend.engine.find(warm[0].id) is None  # type: ignore[attr-defined]
            status = backend.pool_status()
            assert status is not None and status["failures"] == 1, status
        finally:
            await other.remove_all_started()
            await other.aclose()


async def _names_listed(backend: Any) -> None:
    for _ in range(200):
        if backend.pool._names is not None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the pool never listed the engine's sandbox names")


async def test_a_runc_claim_looks_for_no_container_only_where_none_was_there(
    docker_ready: None, workspace: Path, second_workspace: Path
) -> None:
    """Under runc a new workspace's claim skips the engine's look for a container of its
    name when none had it as the pool started (one engine call less): a container another
    process made since is found by the claim's rename instead, and adopted. A workspace
    whose container was there before is looked for first, and no warm sandbox is spent."""
    other = make_backend()
    try:
        assert "before" in await _sh(other, workspace, "echo before")  # there before the pool
        async with pooled_backend(size=2) as backend:
            assert backend.pool is not None
            await _names_listed(backend)
            looked: list[str] = []
            find = backend.engine.find

            async def counting(name: str) -> Any:
                looked.append(name)
                return await find(name)

            backend.engine.find = counting  # type: ignore[method-assign]
            theirs = await other.engine.find(container_name(workspace))
            assert "ok" in await _sh(backend, workspace, "echo ok")
            served = await backend.engine.find(container_name(workspace))
            assert theirs is not None and served is not None and served.id == theirs.id
            assert looked[:1] == [container_name(workspace)]
            status = backend.pool_status()
            assert status is not None and status["claims"] == 0 and status["failures"] == 0, status

            # Made by the other process after the pool listed the engine: the claim's rename
            # finds it; the claimed one is removed with its binds, the other's is served.
            await other.ensure_container(second_workspace)
            looked.clear()
            assert "ok" in await _sh(backend, second_workspace, "echo ok")
            served = await backend.engine.find(container_name(second_workspace))
            peers = await other.engine.find(container_name(second_workspace))
            assert served is not None and peers is not None and served.id == peers.id
            assert slots.LABEL_SLOT not in (served.labels or {})
            status = backend.pool_status()
            assert status is not None and status["claims"] == 1 and status["failures"] == 1, status
            assert _mounted_slots() == []  # (nothing is claimed: the removed one's binds are undone)

            # A new workspace nobody made: claimed without a look.
            third = second_workspace.with_name(second_workspace.name + "-3")
            third.mkdir()
            try:
                looked.clear()
                assert "ok" in await _sh(backend, third, "echo ok")
                assert container_name(third) not in looked
                claimed = await backend.engine.find(container_name(third))
                assert claimed is not None and slots.LABEL_SLOT in (claimed.labels or {})
            finally:
                await backend.stop(third)
                third.rmdir()
    finally:
        await other.remove_all_started()
        await other.aclose()


@RUNTIMES
async def test_leftovers_never_reach_the_next_claimant(
    docker_ready: None, workspace: Path, second_workspace: Path, runtime: str
) -> None:
    require_runtime(runtime)
    async with pooled_backend(runtime, size=2) as backend:
        first = await _sh(
            backend,
            workspace,
            "echo secret-1 > /tmp/leftover; echo secret-1 > $HOME/leftover; "
            "export LEFTOVER=secret-1; (setsid sleep 600 >/dev/null 2>&1 &); hostname",
        )
        assert first.strip() == "sandbox"
        box = await backend.get(workspace)
        await box.exec(ExecRequest(command="true"))
        await backend.stop(workspace)
        # (The needles are built in the shell: the command's own text shows in ps.)
        listing = await _sh(backend, second_workspace, "ls -A /tmp $HOME")
        assert "leftover" not in listing
        env = await _sh(backend, second_workspace, "env")
        assert "LEFTOVER" not in env and "secret-1" not in env
        procs_text = await _sh(backend, second_workspace, "ps -eo args=")
        assert "sleep 600" not in procs_text
        found = await _sh(backend, second_workspace, 'grep -rls "secret-$((0+1))" /tmp $HOME /workspace || echo clean')
        assert found.strip() == "clean"
        # Nothing ran in the claimant's container before its claim: init, its agent, this command.
        procs = [line for line in (await _sh(backend, second_workspace, "ps -eo args=")).splitlines() if line]
        assert len(procs) <= 5, procs
        status = backend.pool_status()
        assert status is not None and status["claims"] == 2


async def test_a_git_workspace_keeps_its_protections(docker_ready: None, workspace: Path) -> None:
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / ".git" / "config").write_text("[core]\n")
    async with pooled_backend() as backend:
        out = await _sh(
            backend,
            workspace,
            "(echo evil > .git/hooks/post-checkout) 2>&1; (echo x >> .git/config) 2>&1; mv .git g 2>&1; echo done",
        )
        assert backend.pool_status()["claims"] == 1  # type: ignore[index]
        assert "Read-only file system" in out and "busy" in out.lower()
        assert not (workspace / ".git" / "hooks" / "post-checkout").exists()
        assert (workspace / ".git" / "config").read_text() == "[core]\n"


@RUNTIMES
async def test_the_pool_respects_its_limits_and_gc_all_empties_it(
    docker_ready: None, workspace: Path, runtime: str
) -> None:
    require_runtime(runtime)
    # An owner of its own: gc of every running sandbox of the run's owner would also
    # remove the sandboxes of the files running beside this one (a terminal's, mid-call).
    owner = TEST_OWNER + "-limits"
    async with pooled_backend(runtime, size=4, max_total=2, ready=2, owner=owner) as backend:
        await asyncio.sleep(1.5)  # the refill had its chances to go past the limit
        status = backend.pool_status()
        assert status is not None and status["ready"] + status["starting"] <= 2, status
        assert len(await _ours_pooled(backend, owner)) == 2
        await _sh(backend, workspace, "true")  # one claimed: the pool refills up to its limit
        await wait_ready(backend, 2)
        assert len(await _ours_pooled(backend, owner)) == 3  # 2 warm + 1 claimed
        assert backend.pool_status()["claims"] == 1  # type: ignore[index]
        removed = await backend.gc(all_running=True)
        assert len(removed) >= 3
        assert await _ours_pooled(backend, owner) == []
        assert _no_slots_left()
        assert workspace.is_dir()  # a gVisor claim's workspace is its slot's directory: kept


async def test_auto_keeps_warm_as_many_as_the_claims_within_one_refill(docker_ready: None, tmp_path: Path) -> None:
    """``LOOM_WARM_POOL=auto``: none warm before anyone asks; after one claim, two (one for
    the claim that comes while the refill runs); after a burst, as many as the burst asked
    for within one refill time, plus one; never more than that."""
    owner = TEST_OWNER + "-auto"  # (its own: the burst's sandboxes are this test's alone)
    async with pooled_backend("runc", size=12, max_total=12, ready=0, mode="demand", owner=owner) as backend:
        pool = backend.pool
        assert pool is not None
        await asyncio.sleep(1.2)  # (the refill had its chances)
        status = pool.status()
        assert status["ready"] + status["starting"] == 0, status

        def dirs(prefix: str, n: int) -> list[Path]:
            out = [tmp_path / f"{prefix}{i}" for i in range(n)]
            for d in out:
                d.mkdir()
            return out

        (first,) = dirs("one", 1)
        await _sh(backend, first, "true")  # a miss (nothing warm): a cold start
        (cls,) = pool._classes.values()
        assert pool.target(cls) == 2
        await wait_ready(backend, 2)
        await asyncio.sleep(1.2)
        assert pool.status()["ready"] == 2, pool.status()

        burst = dirs("burst", 6)
        await asyncio.gather(*(_sh(backend, d, "true") for d in burst))
        want = pool.target(cls)
        assert 7 <= want <= 8, (want, cls.demand)  # six at once, plus one (and the first claim, if a refill ago)
        await wait_ready(backend, want)
        await asyncio.sleep(1.2)
        status = pool.status()
        assert status["ready"] == want and status["starting"] == 0, status
        # (warm ones, and the claimed that came from the pool; the rest started cold)
        assert status["claims"] >= 2 and len(await _ours_pooled(backend, owner)) == want + status["claims"]


@RUNTIMES
async def test_plain_gc_removes_unclaimed_and_keeps_claimed(docker_ready: None, workspace: Path, runtime: str) -> None:
    require_runtime(runtime)
    async with pooled_backend(runtime, size=2) as backend:
        await _sh(backend, workspace, "true")
        other = make_backend(runtime=runtime)  # another process of the same installation: `loom-worker gc`
        try:
            removed = await other.gc()
        finally:
            await other.aclose()
        assert any(name.startswith(slots.POOL_PREFIX) for name in removed)
        claimed = [i for i in await _ours_pooled(backend) if i["workspace"] is not None]
        assert [i["workspace"] for i in claimed] == [str(workspace)]
        assert "ok" in await _sh(backend, workspace, "echo ok")  # still served


@RUNTIMES
async def test_shutdown_removes_the_warm_sandboxes(docker_ready: None, runtime: str) -> None:
    require_runtime(runtime)
    async with pooled_backend(runtime, size=2) as backend:
        assert len(await _ours_pooled(backend)) == 2
    probe = make_backend()
    try:
        assert await _ours_pooled(probe) == []
    finally:
        await probe.aclose()
    assert _no_slots_left()


async def test_gc_all_undoes_the_pool_directorys_own_mounts(
    docker_ready: None, workspace: Path, tmp_path: Path
) -> None:
    """Left behind, the pool's shared mount is copied into every container started after
    it and keeps its data directory from being removed: ``loom-worker gc --all`` (another
    process, with the pool off now: ``LOOM_WARM_POOL`` unset) undoes it once no sandbox has
    a slot there."""
    from sandbox.docker import DockerBackend
    from sandbox.docker.hostmounts import mount_propagation
    from sandbox.docker.pool import PoolConfig
    from sandbox.spec import SandboxSpec
    from tests.conftest import SANDBOX_IMAGE
    from tests.workers import cli, cli_env
    from worker.owner import OWNER_FILE

    owner = TEST_OWNER + "-gcroot"
    data = tmp_path / "data"
    data.mkdir()
    (data / OWNER_FILE).write_text(owner + "\n")
    root = data / "pool"  # (the data directory's default)
    spec = SandboxSpec(image=SANDBOX_IMAGE, runtime="runc", owner=owner)
    backend = DockerBackend(spec, worker_id="test", pool=PoolConfig(mode="fixed", size=1, max_total=2, root=root))
    try:
        await wait_ready(backend, 1)
        assert "in" in await _sh(backend, workspace, "echo in")  # one claimed
        assert mount_propagation(root) == "shared"
    finally:
        await backend.aclose()  # (the claimed one goes on, as a workspace's does)
    env = cli_env(str(tmp_path / "run"), data, LOOM_CLI_DAEMON="0")
    p = await asyncio.to_thread(cli, env, "gc", "--all")
    assert p.returncode == 0, p.stderr.decode()
    assert "removed 1 sandbox container(s)" in p.stdout.decode(), p.stdout.decode()  # the claimed one
    assert mount_propagation(root) is None and mount_propagation(root / ".stage") is None
    assert _mounted_slots() == []


async def test_a_running_pool_refills_after_another_process_gc_all(
    docker_ready: None, workspace: Path, tmp_path: Path
) -> None:
    """``loom-worker gc --all`` in another process removes a running worker's warm
    sandboxes and, no slot left, undoes the pool directory's mounts: the worker's pool
    notices, makes its mounts and its warm sandboxes again, and its status never counts the
    dead ones as ready (it did, and every fill failed on the missing shared mount)."""
    from sandbox.docker import DockerBackend
    from sandbox.docker.hostmounts import mount_propagation
    from sandbox.docker.pool import PoolConfig
    from sandbox.spec import SandboxSpec
    from tests.conftest import SANDBOX_IMAGE
    from tests.workers import cli, cli_env
    from worker.owner import OWNER_FILE

    owner = TEST_OWNER + "-regc"
    data = tmp_path / "data"
    data.mkdir()
    (data / OWNER_FILE).write_text(owner + "\n")
    root = data / "pool"
    spec = SandboxSpec(image=SANDBOX_IMAGE, runtime="runc", owner=owner)
    backend = DockerBackend(spec, worker_id="test", pool=PoolConfig(mode="fixed", size=1, max_total=2, root=root))
    env = cli_env(str(tmp_path / "run"), data, LOOM_CLI_DAEMON="0")
    try:
        await wait_ready(backend, 1)
        pool = backend.pool
        assert pool is not None
        # (the refill held off for a while, so that gc finds no slot and undoes the mounts;
        # it sleeps until then)
        pool._quiet_until = time.monotonic() + 15
        await asyncio.sleep(1.2)
        p = await asyncio.to_thread(cli, env, "gc", "--all")
        assert p.returncode == 0 and "removed 1 sandbox container(s)" in p.stdout.decode(), p.stdout.decode()
        assert mount_propagation(root) is None  # (no slot left: gc undid the pool's mounts)
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # the dead one is not ready; a new one is made
            status = backend.pool_status()
            assert status is not None and status["failures"] == 0, status
            warm = [i for i in await backend.list_sandboxes() if i["pooled"] and i["owner"] == owner]
            if status["ready"] == 1 and len(warm) == 1:
                break
            assert asyncio.get_running_loop().time() < deadline, (status, warm)
            await asyncio.sleep(0.1)
        assert mount_propagation(root) == "shared"
        assert "in" in await _sh(backend, workspace, "echo in")
        status = backend.pool_status()
        assert status is not None and status["claims"] == 1 and status["misses"] == 0, status
    finally:
        await backend.remove_all_started()
        await backend.aclose()
        await asyncio.to_thread(cli, env, "gc", "--all")  # (the pool's mounts, for tmp_path's removal)


async def test_gvisor_claims_an_empty_workspace_by_moving_its_directory_into_place(
    docker_ready: None, workspace: Path
) -> None:
    require_runtime("runsc")
    os.chown(workspace, 1000, 1000)
    os.chmod(workspace, 0o750)
    async with pooled_backend("runsc", uid=1000, gid=1000) as backend:
        out = await _sh(backend, workspace, "id -u; pwd; echo made > new.txt; mkdir d; echo deep > d/f")
        assert out.split() == ["1000", "/workspace"]
        status = backend.pool_status()
        assert status is not None and status["claims"] == 1 and status["declined"] == 0, status
        # The workspace is now the slot's directory, as its owner and mode were.
        st = workspace.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1000, 1000, 0o750)
        assert (workspace / "d" / "f").read_text() == "deep\n"
        (workspace / "from-host.txt").write_text("host\n")  # the host's edits are seen
        assert "host" in await _sh(backend, workspace, "cat from-host.txt")
        container = await backend.engine.find(container_name(workspace))
        assert container is not None and slots.workspace_of(container.labels) == str(workspace)
        other = make_backend(runtime="runsc", uid=1000, gid=1000)  # another process reuses it
        try:
            assert "made" in await _sh(other, workspace, "cat new.txt")
            again = await other.engine.find(container_name(workspace))
            assert again is not None and again.id == container.id
        finally:
            await other.aclose()
        slot = slots.slot_of(container.labels)
        assert slot is not None and not (slot / "ws").exists()
        await backend.stop(workspace)
        assert not slot.exists()
        assert sorted(p.name for p in workspace.iterdir()) == ["d", "from-host.txt", "new.txt"]


async def test_gvisor_declines_a_workspace_with_files_and_keeps_the_warm_one(
    docker_ready: None, workspace: Path, second_workspace: Path
) -> None:
    """A workspace with files in it cannot be replaced by the slot: it starts cold, and the
    warm sandbox, untouched, serves the next empty one."""
    require_runtime("runsc")
    (workspace / "hello.txt").write_text("hi\n")
    async with pooled_backend("runsc") as backend:
        warm = await _ours_pooled(backend)
        assert "hi" in await _sh(backend, workspace, "cat hello.txt")
        status = backend.pool_status()
        assert status is not None and status["claims"] == 0 and status["declined"] == 1, status
        cold = await backend.engine.find(container_name(workspace))
        assert cold is not None and slots.LABEL_SLOT not in (cold.labels or {})
        assert "ok" in await _sh(backend, second_workspace, "echo ok")
        served = await backend.engine.find(container_name(second_workspace))
        assert served is not None and served.id == warm[0]["container"].id  # type: ignore[attr-defined]
        assert backend.pool_status()["claims"] == 1  # type: ignore[index]


async def test_a_claimed_gvisor_sandbox_talks_over_its_slots_direct_channel(
    docker_ready: None, workspace: Path, tmp_path: Path
) -> None:
    """gVisor's direct channel directory is mounted at start: a warm sandbox's is its
    slot's, and its claimant listens there (not in the workspace's, which it never saw)."""
    require_runtime("runsc")
    channels = tmp_path / "channels"
    async with pooled_backend("runsc", channel_dir=str(channels)) as backend:
        box = await backend.get(workspace)
        conn = await box.connection()  # type: ignore[attr-defined]
        assert conn.direct, conn.close_reason
        assert backend.pool_status()["claims"] == 1  # type: ignore[index]
        assert "ok" in await _sh(backend, workspace, "echo ok")
        container = await backend.engine.find(container_name(workspace))
        assert container is not None
        slot_channel = channel_of(container)
        assert slot_channel is not None and slot_channel.parent == channels and slot_channel.is_dir()
        # The slot's channel directory goes with its sandbox (a workspace's own is kept
        # for its next start; a slot has none).
        await backend.stop(workspace)
        assert not slot_channel.exists()
    assert list(channels.iterdir()) == []  # the warm ones' too, at shutdown


@RUNTIMES
async def test_a_warm_sandbox_waits_booted_ends_with_its_worker_and_keeps_once_claimed(
    docker_ready: None, workspace: Path, tmp_path: Path, runtime: str
) -> None:
    """The pool boots a warm sandbox's agent all the way: its claimant gets a checked
    agent on the direct channel (under runc rooted again, at the claim, at the workspace
    bound over its slot). Until then it is nobody's keeper: a worker that dies (its
    connections closed) takes its warm sandboxes with it, except a gVisor one, which waits
    frozen (its idle kernel costs CPU) and is reaped by the next worker instead (the test
    below). Once claimed, the sandbox outlives its worker as every sandbox does."""
    require_runtime(runtime)
    (workspace / "mine.txt").write_text("the workspace's\n")
    if runtime == "runsc":
        workspace.joinpath("mine.txt").unlink()  # (gVisor claims only an empty workspace)
    channels: dict[str, Any] = {"channel_dir": str(tmp_path / "channels")} if runtime == "runsc" else {}
    async with pooled_backend(runtime, size=2, freeze=True, **channels) as backend:
        assert backend.pool is not None
        (cls,) = backend.pool._classes.values()
        assert len(cls.ready) == 2 and all(w.conn is not None and w.conn.direct for w in cls.ready)
        box = await backend.get(workspace)
        claimed = cls.ready[0]
        assert await box.connection() is claimed.conn  # type: ignore[attr-defined]
        assert "ok" in await _sh(backend, workspace, "echo ok")
        if runtime == "runc":  # its root is the workspace now, not the slot it opened first
            assert (await box.read("mine.txt")).data == b"the workspace's\n"
            assert "mine.txt" in await _sh(backend, workspace, "ls")
        orphan = cls.ready[-1]
        assert orphan is not claimed
        assert claimed.frozen is None  # thawed by its claim
        if runtime == "runsc":
            assert orphan.frozen is not None and freezer.frozen(orphan.frozen)
        cls.ready.clear()  # as if its worker died: nobody removes it, its connections close
        assert orphan.conn is not None
        await orphan.conn.close("worker gone")
        await orphan.transport.close()
        for _ in range(30 if runtime == "runsc" else 100):
            found = await backend.engine.find(orphan.container.name)
            if found is None or found.status != "running":
                break
            await asyncio.sleep(0.1)
        if runtime == "runsc":  # frozen: it saw nothing (removed, below, thawed first)
            assert found is not None and found.status == "running", found
            assert orphan.frozen is not None and freezer.frozen(orphan.frozen)
        else:
            assert found is None or found.status != "running", found.status
        await backend.engine.remove(orphan.container)
        await asyncio.to_thread(slots.release, slots.labels_of(orphan.container))
        container = await backend.engine.find(container_name(workspace))
        await backend.aclose()  # the claimed one's worker goes
        await asyncio.sleep(2)
        other = make_backend(runtime=runtime, **channels)
        try:
            assert "ok" in await _sh(other, workspace, "echo ok")
            again = await other.engine.find(container_name(workspace))
            assert container is not None and again is not None and again.id == container.id
        finally:
            await other.aclose()


async def test_a_runc_claim_whose_root_is_not_the_workspace_starts_cold(docker_ready: None, workspace: Path) -> None:
    """A runc warm sandbox's agent opened its root in the pool; at the claim it opens it
    again and checks, by device and inode, that it is the workspace bound there. When it
    is not (here: the host names another directory), the agent refuses, the warm sandbox
    is removed with its slot's binds, and the workspace starts cold: the call succeeds."""
    (workspace / "mine.txt").write_text("cold\n")
    async with pooled_backend() as backend:
        assert backend.pool is not None
        bind = backend.pool._bind_workspace
        warm: list[Path] = []

        def wrong(claimed: Any, ws: Path) -> tuple[int, int]:
            warm.append(claimed.slot)
            dev, ino = bind(claimed, ws)
            return dev, ino + 1

        backend.pool._bind_workspace = wrong  # type: ignore[method-assign,assignment]
        assert "cold" in await _sh(backend, workspace, "cat mine.txt")
        served = await backend.engine.find(container_name(workspace))
        assert served is not None and slots.LABEL_SLOT not in (served.labels or {})  # a cold one
        assert len(warm) == 1 and not warm[0].exists()
        assert not any(m.startswith(str(warm[0])) for m in _mounted_slots())
        status = backend.pool_status()
        assert status is not None and status["claims"] == 1, status


@RUNTIMES
async def test_a_restarted_worker_removes_what_its_killed_predecessors_pool_left(
    docker_ready: None, runtime: str
) -> None:
    """A worker killed with its pool (no shutdown) leaves its warm sandboxes: under runc
    exited (their agents end with its connections, the containers stay), under gVisor
    running and frozen (they cannot see it end; its hold on their slots ended with it).
    The next worker's pool removes them (thawed first) and releases their slots, instead
    of leaving them to pile up until ``gc``; a live worker's are kept."""
    require_runtime(runtime)
    async with pooled_backend(runtime, size=2, freeze=True) as first:
        assert first.pool is not None
        (cls,) = first.pool._classes.values()
        orphan = cls.ready.pop()  # as if its worker died: nobody removes it
        live = cls.ready[0]  # a live worker's, sharing the pool's directory: kept
        slot = slots.slot_of(slots.labels_of(orphan.container))
        assert slot is not None and slot.is_dir()
        if orphan.conn is not None:
            await orphan.conn.close("worker gone")
        await orphan.transport.close()
        assert orphan.owner is not None
        os.close(orphan.owner)  # (what the kernel does when its worker dies)
        orphan.owner = None
        for _ in range(30 if runtime == "runsc" else 100):
            found = await first.engine.find(orphan.container.name)
            if found is None or found.status != "running":
                break
            await asyncio.sleep(0.1)
        want = "running" if runtime == "runsc" else "exited"
        assert found is not None and found.status == want, found and found.status
        async with pooled_backend(runtime, size=1) as second:
            for _ in range(100):
                if await second.engine.find(orphan.container.name) is None:
                    break
                await asyncio.sleep(0.1)
            assert await second.engine.find(orphan.container.name) is None
            assert not slot.exists()
            kept = await second.engine.find(live.container.name)
            assert kept is not None and kept.status == "running"


_POOL_HOLDER = """
import asyncio, json, sys
from pathlib import Path
from tests.docker import conftest

conftest.POOL_ROOT = Path(sys.argv[1])  # (the test's pool directory: its next worker's)

async def main():
    async with conftest.pooled_backend("runsc", size=2, freeze=True) as backend:
        (cls,) = backend.pool._classes.values()
        print(json.dumps([[w.container.id, w.container.name, str(w.frozen)] for w in cls.ready]), flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


def _cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


async def test_gvisor_warm_sandboxes_wait_frozen_and_a_killed_workers_are_reaped(docker_ready: None) -> None:
    """gVisor's idle kernel costs CPU (its systrap monitor wakes every 400 µs), so with
    ``freeze`` (LOOM_WARM_POOL_FREEZE) its warm sandboxes wait frozen: their runtime
    processes get no CPU at all. A worker killed
    with kill -9 leaves them running and frozen, which they cannot notice; its hold on
    their slots ended with it, so the next worker's pool thaws and removes them and
    releases their slots."""
    import json
    import sys

    from sandbox.docker import stuck

    require_runtime("runsc")
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _POOL_HOLDER,
        str(POOL_ROOT),
        stdout=asyncio.subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), 120)
        warm = json.loads(line)
        assert len(warm) == 2, line
        for cid, _name, path in warm:
            assert freezer.frozen(Path(path)), (cid, path)
        pids = [p for cid, _n, _p in warm for p in stuck.runtime_pids(cid)]
        assert len(pids) >= 4  # (a Sentry and a gofer each)
        before = _cpu_ticks(pids)
        await asyncio.sleep(1.0)
        assert _cpu_ticks(pids) == before  # frozen: not one tick (unfrozen: ~2.5 % of a core each)
    finally:
        holder.kill()
        await holder.wait()
    async with own_backend("runsc") as probe:
        for _cid, name, path in warm:
            found = await probe.engine.find(name)
            assert found is not None and found.status == "running" and freezer.frozen(Path(path)), name
    async with pooled_backend("runsc", size=1) as second:
        assert second.pool is not None  # (frozen only when asked: LOOM_WARM_POOL_FREEZE)
        assert all(w.frozen is None for c in second.pool._classes.values() for w in c.ready)
        for _ in range(100):
            if all([await second.engine.find(name) is None for _c, name, _p in warm]):
                break
            await asyncio.sleep(0.1)
        assert [name for _c, name, _p in warm if await second.engine.find(name) is not None] == []
        assert not any(stuck.runtime_pids(cid) for cid, _n, _p in warm)
    assert _no_slots_left()
