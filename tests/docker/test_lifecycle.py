"""Container reuse across processes, recovery from a dead agent or container, idle TTL, gc."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import docker
import pytest

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend, container_name
from sandbox.docker.engine import Engine
from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import make_backend

pytestmark = pytest.mark.docker


async def test_calls_reuse_one_container(docker_backend: DockerBackend, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    first = await box.info()
    await box.exec(ExecRequest("true"))
    attrs1 = await docker_backend.inspect(workspace)
    second = await (await docker_backend.get(workspace)).info()
    attrs2 = await docker_backend.inspect(workspace)
    assert attrs1 is not None and attrs2 is not None
    assert attrs1["Id"] == attrs2["Id"]
    assert first.pid == second.pid  # same agent, same stream


PEER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from sandbox.base import ExecRequest
    from sandbox.docker import DockerBackend
    from sandbox.spec import SandboxSpec

    async def main():
        b = DockerBackend(SandboxSpec(image=sys.argv[2]), worker_id="peer")
        box = await b.get(Path(sys.argv[1]))
        r = await box.exec(ExecRequest("cat /proc/1/cpuset /etc/hostname; echo $((1+1))"))
        print((await b.inspect(Path(sys.argv[1])))["Id"])
        print(r.stdout.decode().strip().splitlines()[-1])
        await b.aclose()

    asyncio.run(main())
    """
)


async def test_two_processes_share_one_container(docker_backend: DockerBackend, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    await box.info()
    attrs = await docker_backend.inspect(workspace)
    assert attrs is not None
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", PEER, str(workspace), SANDBOX_IMAGE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert out.returncode == 0, out.stderr
    peer_id, two = out.stdout.split()[-2:]
    assert peer_id == attrs["Id"] and two == "2"
    # our own stream still works after the peer's agent came and went
    assert (await box.exec(ExecRequest("echo still"))).stdout == b"still\n"


async def test_two_processes_starting_at_once_end_with_one_container(docker_ready: None, workspace: Path) -> None:
    procs = [
        subprocess.Popen(  # noqa: ASYNC220 - three peers must start at the same instant
            [sys.executable, "-c", PEER, str(workspace), SANDBOX_IMAGE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parents[2],
        )
        for _ in range(3)
    ]
    ids = set()
    try:
        for p in procs:
            out, err = await asyncio.to_thread(p.communicate, timeout=120)
            assert p.returncode == 0, err
            ids.add(out.split()[-2])
        assert len(ids) == 1
    finally:
        client = docker.from_env()
        for c in client.containers.list(all=True, filters={"name": container_name(workspace)}):
            c.remove(force=True)
        client.close()


async def test_container_killed_during_a_call_reports_sandbox_lost_then_recovers(
    docker_backend: DockerBackend, workspace: Path
) -> None:
    box = await docker_backend.get(workspace)
    await box.write("keep.txt", b"kept")
    call = asyncio.create_task(box.exec(ExecRequest("sleep 30", timeout=60)))
    await asyncio.sleep(1.0)
    client = docker.from_env()
    try:
        await asyncio.to_thread(client.containers.get(container_name(workspace)).kill)
    finally:
        client.close()
    r = await asyncio.wait_for(call, 20)
    assert r.outcome == "sandbox_lost"
    again = await box.exec(ExecRequest("cat keep.txt"))
    assert again.outcome == "exit" and again.stdout == b"kept"


async def test_agent_killed_from_inside_resets_the_sandbox(docker_backend: DockerBackend, workspace: Path) -> None:
    """A second worker's agent (started with exec) is killed by its own command: what the
    command started could have escaped its tree-kill, so the sandbox is replaced, and
    both workers carry on in the new one."""
    first = await docker_backend.get(workspace)
    await first.info()  # the first worker owns the main agent
    peer = make_backend()
    try:
        box = await peer.get(workspace)
        info = await box.info()
        before = await peer.inspect(workspace)
        r = await box.exec(ExecRequest(f"kill -9 {info.pid}"))
        assert r.outcome == "sandbox_lost" and b"restarted" in r.stderr
        assert (await box.exec(ExecRequest("echo back"))).stdout == b"back\n"
        after = await peer.inspect(workspace)
        assert before is not None and after is not None and before["Id"] != after["Id"]
        assert (await first.exec(ExecRequest("echo first"))).stdout == b"first\n"
    finally:
        await peer.aclose()


async def test_dead_container_is_replaced(docker_ready: None, workspace: Path) -> None:
    """Even if the whole container dies (its main process killed), the next call gets a fresh one."""
    backend = make_backend()
    try:
        box = await backend.get(workspace)
        # kill the container's main process (the init's child): the container stops
        first = await box.exec(ExecRequest("kill -9 $(cat /proc/1/task/1/children); sleep 5", timeout=20))
        assert first.outcome == "sandbox_lost", first
        r = await box.exec(ExecRequest("echo fresh"))
        assert r.stdout == b"fresh\n", r
    finally:
        await backend.remove_all_started()
        await backend.aclose()


@pytest.mark.slow
async def test_idle_container_exits_by_itself(docker_ready: None, workspace: Path) -> None:
    backend = make_backend(idle_ttl=10)
    try:
        box = await backend.get(workspace)
        await box.exec(ExecRequest("true"))
        await box.close()  # the worker goes away; nothing touches the container any more
        for _ in range(60):
            attrs = await backend.inspect(workspace)
            if attrs is None or attrs["State"]["Status"] != "running":
                break
            await asyncio.sleep(1)
        assert attrs is None or attrs["State"]["Status"] == "exited"
        removed = await backend.gc()
        assert container_name(workspace) in removed
    finally:
        await backend.remove_all_started()
        await backend.aclose()


async def test_gc_removes_only_our_stale_containers(docker_ready: None, workspace: Path, tmp_path: Path) -> None:
    backend = make_backend()
    client = docker.from_env()
    foreign = client.containers.create(SANDBOX_IMAGE, ["true"], labels={"other": "1"})
    gone = tmp_path / "gone"
    gone.mkdir()
    try:
        live = await backend.get(workspace)
        await live.info()
        await (await backend.get(gone)).info()
        gone.rmdir()  # its workspace vanished: stale
        removed = await backend.gc()
        assert container_name(gone) in removed
        assert container_name(workspace) not in removed
        foreign.reload()  # still there
        assert (await live.exec(ExecRequest("echo ok"))).stdout == b"ok\n"
    finally:
        foreign.remove(force=True)
        client.close()
        await backend.remove_all_started()
        await backend.aclose()


async def test_config_change_replaces_the_container(docker_ready: None, workspace: Path) -> None:
    a = make_backend(pids=128)
    b = make_backend(pids=100)
    try:
        await (await a.get(workspace)).info()
        first = await a.inspect(workspace)
        await (await b.get(workspace)).info()
        second = await b.inspect(workspace)
        assert first is not None and second is not None
        assert first["Id"] != second["Id"] and second["HostConfig"]["PidsLimit"] == 100
    finally:
        await a.aclose()
        await b.remove_all_started()
        await b.aclose()


async def test_a_peer_container_not_yet_started_is_adopted_not_removed(docker_ready: None, workspace: Path) -> None:
    """Create and start are two engine calls: a process that finds the workspace's
    container still "created" (a peer is between the two) waits for it to run and adopts
    it; removing it would make the peer's start fail ("marked for removal")."""
    peer = make_backend()
    backend = make_backend()
    client = docker.from_env()
    try:
        await peer.prepare()
        created = await asyncio.to_thread(client.containers.create, **peer.container_config(workspace.resolve()))

        async def start_late() -> None:
            await asyncio.sleep(0.4)
            await asyncio.to_thread(created.start)

        starter = asyncio.create_task(start_late())
        adopted = await backend.ensure_container(workspace.resolve())
        await starter
        assert adopted.id == created.id
        created.reload()
        assert created.status == "running"
    finally:
        for c in client.containers.list(all=True, filters={"name": container_name(workspace.resolve())}):
            c.remove(force=True)
        client.close()
        await backend.aclose()
        await peer.aclose()


async def test_a_container_its_creator_never_started_is_replaced(
    docker_ready: None, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = make_backend()
    client = docker.from_env()
    real = Engine.started_by_peer

    async def short_wait(self: Engine, name: str, wait: float = 5.0) -> bool:
        return await real(self, name, wait=0.3)

    monkeypatch.setattr(Engine, "started_by_peer", short_wait)
    try:
        await backend.prepare()
        orphan = await asyncio.to_thread(client.containers.create, **backend.container_config(workspace.resolve()))
        box = await backend.get(workspace)
        assert (await box.exec(ExecRequest("echo up"))).stdout == b"up\n"
        attrs = await backend.inspect(workspace)
        assert attrs is not None and attrs["Id"] != orphan.id and attrs["State"]["Running"]
    finally:
        for c in client.containers.list(all=True, filters={"name": container_name(workspace.resolve())}):
            c.remove(force=True)
        client.close()
        await backend.aclose()


async def test_a_start_cancelled_during_its_create_leaves_no_container(docker_ready: None, workspace: Path) -> None:
    """The engine's create runs on in its thread when the start is cancelled (a caller
    closing the sandbox, shutdown): the container it makes is removed, not left created
    and unstarted under the workspace's name."""
    import time

    backend = make_backend()
    real = backend._create
    in_create = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_create(client: object, cfg: dict[str, object]) -> object:
        loop.call_soon_threadsafe(in_create.set)
        time.sleep(0.5)  # the caller is cancelled meanwhile
        return real(client, cfg)

    backend._create = slow_create  # type: ignore[method-assign]
    try:
        start = asyncio.create_task(backend.ensure_container(workspace))
        await in_create.wait()
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        assert await backend.engine.find(container_name(workspace)) is None
    finally:
        await backend.remove_all_started()
        await backend.aclose()
