"""An engine that hangs (found under load: Docker 20.10's network controller deadlocked
with 100 sandboxes starting while 200 were removed, and every call about a container
waited forever). The worker talks to the real engine through a proxy that holds one kind
of request unanswered: the call fails at its deadline, as the daemon's failure or a
timeout, and nothing of the worker stays blocked on the engine after ``aclose`` (no
engine thread waits for an answer that will not come, so the process can exit)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.base import ExecRequest
from sandbox.docker.config import container_name
from tests.conftest import TEST_OWNER
from tests.docker.conftest import own_registry
from worker.tools import shell

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_ready")]

ENGINE = "/var/run/docker.sock"


class HangingProxy:
    """Forwards a unix socket to the engine's; a request whose request line matches
    ``hold`` is never forwarded nor answered (its connection stays open)."""

    def __init__(self, path: Path, hold: str) -> None:
        self.path = path
        self.hold = re.compile(hold.encode())
        self.held: list[bytes] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_unix_server(self._client, str(self.path)))
        self._ready.set()
        self._loop.run_forever()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_unix_connection(ENGINE)

        async def up() -> None:
            while data := await cr.read(65536):
                for line in data.split(b"\r\n"):
                    if re.match(rb"^[A-Z]+ /\S* HTTP/1\.1$", line) and self.hold.search(line):
                        self.held.append(line)
                        await asyncio.Event().wait()  # held: until the client goes
                uw.write(data)
                await uw.drain()
            uw.close()

        async def down() -> None:
            while data := await ur.read(65536):
                cw.write(data)
                await cw.drain()
            cw.close()

        try:
            await asyncio.gather(up(), down())
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            cw.close()
            uw.close()

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            # (ended here, on their loop: left to the garbage collector, a held connection's
            # task would close its transports on a closed loop)
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Callable[[str], HangingProxy]]:
    made: list[HangingProxy] = []

    def make(hold: str) -> HangingProxy:
        made.append(HangingProxy(tmp_path / f"engine{len(made)}.sock", hold))
        return made[-1]

    yield make
    for p in made:
        p.close()


def engine_threads_busy() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("docker-engine") and t.is_alive()]


# (a held start is the same engine call under either runtime: runc only; so is the version
# request that making the Docker client sends first, which on the event loop held every call
# of the process for the SDK's 60 s)
@pytest.mark.parametrize(
    ("hold", "runtime"), [("/attach", "runc"), ("/attach", "runsc"), ("/start", "runc"), ("^GET /version", "runc")]
)
async def test_a_start_the_engine_never_answers_fails_at_the_calls_deadline_and_holds_nothing_after(
    tmp_path: Path,
    workspace: Path,
    proxy: Callable[[str], HangingProxy],
    runtime: str,
    hold: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (a deadline of 5 s, not 20: the call fails at it, the test need not wait longer)
    monkeypatch.setattr(shell, "DEADLINE_SLACK", 3.0)
    p = proxy(hold)
    # (held version requests: nothing of the workspace can be stopped through this engine,
    # nor was anything made; the registry after the test's stops what the others left)
    async with own_registry(tmp_path, runtime, stop="version" not in hold, docker_host=f"unix://{p.path}") as reg:
        t = time.monotonic()
        r = await reg.execute("shell_execute", {"command": "true", "timeout": 2}, workspace=str(workspace))
        took = time.monotonic() - t
        assert p.held, "the proxy held nothing: the test did not test the hang"
        assert not r.success
        # The engine's failure, never the command's limit (which was never reached: it never ran).
        assert (r.data or {}).get("error_kind") == "infrastructure", (r.error, r.data)
        assert "did not answer" in (r.error or "") or "unavailable" in (r.error or "").lower(), r.error
        deadline = 2 + shell.DEADLINE_SLACK  # shell_execute's with timeout 2
        assert took < deadline + 10, (took, deadline)  # the call's own deadline, not the engine's 60 s
    # After aclose nothing waits on the engine: a thread still in a call would keep the
    # process from exiting until the engine answered.
    for _ in range(100):
        if not engine_threads_busy():
            break
        await asyncio.sleep(0.05)
    busy = engine_threads_busy()
    if hold == "/attach":
        assert busy == [], busy  # the attach runs on the loop and ends with its call
    else:
        # A create or start the engine holds: the SDK's own 60 s read timeout bounds it.
        assert len(busy) <= 1, busy
    # What the held calls left behind is removed through the engine itself.
    async with own_registry(tmp_path, runtime) as reg2:
        await reg2.stop(workspace)


# -- an engine stuck on one container --------------------------------------------------------------


def _shim_of(container_id: str) -> int:
    """The pid of the containerd shim that runs ``container_id``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and container_id.encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no shim runs {container_id}")


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_a_container_the_engine_is_stuck_on_holds_up_no_listing_no_other_workspace_and_no_gc(
    tmp_path: Path, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in CI: a gVisor sandbox whose removal hung in the engine (its runtime never
    answered) kept the engine's lock on that container for the rest of the run. The SDK's
    listing inspects every container it finds, and the engine answers an inspect only under
    the container's lock: every listing (gc, doctor, the warm pool's reap) waited out the
    timeout and failed, and so did every test after. Here the container's shim is stopped
    (SIGSTOP) and a removal sent: the engine waits on the shim holding the container's
    lock, and every inspect waits on the lock, as it did."""
    import os
    import signal

    from sandbox.docker import engine as engine_mod
    from sandbox.errors import DaemonUnavailableError
    from tests.docker.conftest import own_backend

    monkeypatch.setattr(engine_mod, "TIMEOUT", 5)  # (the engine's deadline: 60 s otherwise)
    owner = f"{TEST_OWNER}-stuck"  # (this test's gc touches its own sandboxes only)
    stuck, stale, live = (tmp_path / n for n in ("stuck", "stale", "live"))
    for ws in (stuck, stale, live):
        ws.mkdir()
    async with own_backend(runtime, owner=owner) as backend:
        for ws in (stuck, stale, live):
            assert (await (await backend.get(ws)).exec(ExecRequest("true"))).exit_code == 0
        container = await backend.engine.find(container_name(stuck.resolve()))
        shim = _shim_of(container.id)
        os.kill(shim, signal.SIGSTOP)
        removal = await asyncio.create_subprocess_exec(
            "docker", "rm", "-f", container.id, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            # The engine is stuck on it (once the removal holds its lock): an inspect waits
            # out the deadline.
            for _ in range(50):
                try:
                    await backend.engine.call("inspect the stuck one", container.reload)
                except DaemonUnavailableError:
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError("the engine was never stuck on the container: the test tests nothing")
            t = time.monotonic()
            listed = {i["name"]: i for i in await backend.list_sandboxes()}
            assert time.monotonic() - t < engine_mod.TIMEOUT, "the listing waited on the stuck container"
            assert listed[container.name]["workspace"] == str(stuck.resolve())
            assert {container_name(ws.resolve()) for ws in (stale, live)} <= set(listed)
            # Another workspace's sandbox works on.
            r = await (await backend.get(live)).exec(ExecRequest("echo on"))
            assert (r.exit_code, r.stdout) == (0, b"on\n")
            # gc removes what it can and names what it could not.
            for ws in (stuck, stale):  # (their workspaces vanish: both are stale)
                ws.rmdir()
            with pytest.raises(DaemonUnavailableError) as e:
                await backend.gc()
            assert container.name in str(e.value) and "removed 1" in str(e.value), e.value
            assert await backend.engine.find(container_name(stale.resolve())) is None
            assert await backend.engine.find(container_name(live.resolve())) is not None
        finally:
            os.kill(shim, signal.SIGCONT)
            await asyncio.wait_for(removal.wait(), 60)
        await backend.engine.remove(container)  # (the engine answers again)
        assert await backend.engine.find(container.name) is None


async def test_a_gvisor_sandbox_whose_kernel_never_answers_is_removed_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stuck container of the test above, as it came about under gVisor: ``docker rm
    -f`` runs ``runsc kill``, which waits on the sandbox's kernel (the Sentry, here stopped
    with SIGSTOP) forever, with the engine's lock on the container held. The worker kills
    the container's runtime processes once the removal has not finished in its time, and
    the removal completes: the workspace gets a fresh sandbox at its next call."""
    import os
    import signal

    from sandbox.docker import engine as engine_mod
    from sandbox.docker import stuck
    from tests.docker.conftest import own_backend

    monkeypatch.setattr(engine_mod, "STUCK_AFTER", 2.0)
    ws = tmp_path / "ws"
    ws.mkdir()
    async with own_backend("runsc") as backend:
        assert (await (await backend.get(ws)).exec(ExecRequest("true"))).exit_code == 0
        container = await backend.engine.find(container_name(ws.resolve()))
        sentry = [
            p for p in stuck.runtime_pids(container.id) if b"runsc-sandbox" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        assert len(sentry) == 1, sentry
        assert len(stuck.runtime_pids(container.id)) >= 2  # (and its gofer)
        os.kill(sentry[0], signal.SIGSTOP)
        try:
            assert await backend.stop(ws)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sentry[0], signal.SIGCONT)
        assert await backend.engine.find(container.name) is None
        assert stuck.runtime_pids(container.id) == []
        r = await (await backend.get(ws)).exec(ExecRequest("echo again"))
        assert (r.exit_code, r.stdout) == (0, b"again\n")
