"""The control plane's state on one service (:func:`plane_of`): the sandboxes' records,
their lifetimes, their starts, and the gate every request to a sandbox's own API passes.

- **Lifetimes** are absolute, as E2B's: a sandbox ends at its ``endAt`` whether it is used
  or not (loom's own idle TTL only stops an idle container, which the next use starts
  again). A task of the service (:meth:`Plane._reap`, started with the plane) kills each
  sandbox whose time is up, or pauses it when it was created with ``autoPause``; a
  sandbox whose time is up and not reaped yet is already gone for every request.
- **Starts**: create, connect and resume answer at once and start the sandbox's
  container in the background (:meth:`Plane.start_soon`), so a client's first command
  waits only for the rest of that start. The service stops what it started at shutdown
  (``LOOM_STOP_SANDBOXES_ON_EXIT``).
- **Kill** stops the container and marks the record killed (the workspace's files and
  changelog stay for ``loom-worker log`` and undo, unless ``LOOM_E2B_KILL_DELETES``).
  **Pause** stops the container too: the files are kept, the processes are not (E2B's
  ``pauseMode`` says ``filesystem``); a connect resumes it (its next use, with
  ``autoResume``).
- **The gate** (:func:`gate`, called by :func:`.target.target_of`): a killed, timed-out or
  paused sandbox's own API answers as E2B's does for a sandbox that is not running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from sandbox.logs import get_logger
from worker.http.lifespan import stop_sandbox
from worker.http.state import Service, service_of
from worker.workspace_settings import WorkspaceSettings, spec_for

from .answers import MIB, E2BError, no_sandbox
from .records import RecordStore, SandboxRecord
from .warm import WarmPool

log = get_logger("worker.e2b")

#: The reaper looks again at least this often (a record changed by hand, a clock step).
_REAP_EVERY = 30.0


class Plane:
    """The E2B control plane of one service (see the module docstring)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.settings = service.settings
        self.store = RecordStore(
            service.settings.data_dir / "e2b" / "sandboxes", fsync=service.settings.durability == "full"
        )
        self._starts: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._by_key: dict[str, str] = {}  # idempotency key -> sandbox id
        self._creating = 0
        self._reaper: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False
        #: Sandboxes made ahead for creates of the plain kind (LOOM_E2B_WARM_SANDBOXES).
        self.warm = WarmPool(self, service.settings.e2b_warm_sandboxes)

    async def ready(self) -> Plane:
        """The plane with its records read and its reaper running."""
        if not self.store.loaded:
            await self.store.load()
            for rec in self.store.all():
                if rec.idempotency_key and rec.state != "killed":
                    self._by_key[rec.idempotency_key] = rec.id
        if (self._reaper is None or self._reaper.done()) and not self._closing:
            self._wake = asyncio.Event()
            self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="e2b-reaper")
        return self

    async def aclose(self) -> None:
        """End the reaper and the warm pool's filler once what each is doing is done (a
        kill cancelled midway would leave its sandbox's channel open), and wait for the
        starts under way. (A test's service; a service's own end cancels them with its
        loop.)"""
        self._closing = True
        self.wake()
        await self.warm.aclose()
        if self._reaper is not None:
            with contextlib.suppress(BaseException):
                await self._reaper
        for sandbox_id in list(self._starts):
            await self.settle(sandbox_id)

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Kill, pause and resume of one sandbox take turns."""
        lock = self._locks.get(sandbox_id)
        if lock is None:
            lock = self._locks[sandbox_id] = asyncio.Lock()
        return lock

    def envd_token(self, sandbox_id: str) -> str:
        return self.service.access.envd_token(sandbox_id)

    # -- finding ------------------------------------------------------------------------

    async def locate(self, sandbox_id: str) -> Path | None:
        """The workspace of ``sandbox_id``, or None (none, or not a valid id)."""
        try:
            return await self.service.workspaces.locate(sandbox_id)
        except (LookupError, ValueError, OSError):
            return None

    async def find(self, sandbox_id: str, *, paused_ok: bool = True) -> tuple[Path, SandboxRecord]:
        """A sandbox E2B's API shows: its workspace and its record (a workspace without
        one described as :meth:`SandboxRecord.adopted_view`, not stored). Raises
        E2BError 404 (no such sandbox, killed, its time up; paused unless ``paused_ok``)."""
        await self.ready()
        path = await self.locate(sandbox_id)
        if path is None:
            raise no_sandbox(sandbox_id)
        rec = self.store.get(sandbox_id)
        if rec is None:
            rec = await asyncio.to_thread(self._adopted, sandbox_id, path)
        elif rec.state in ("killed", "warm"):
            raise no_sandbox(sandbox_id, "it was killed" if rec.state == "killed" else "")
        elif rec.expired(time.time()):
            self.wake()
            raise no_sandbox(sandbox_id, "it reached its timeout")
        if rec.state == "paused" and not paused_ok:
            raise no_sandbox(sandbox_id, "it is paused: resume it with Sandbox.connect()")
        return path, rec

    def _adopted(self, sandbox_id: str, path: Path) -> SandboxRecord:
        """How E2B sees a workspace made by loom's own API (blocking: a stat, its settings)."""
        image = self.settings.image
        with contextlib.suppress(Exception):
            configs = self.service.local.configs
            if configs is not None:
                image = configs.store.load(path).image or image
        try:
            started = os.stat(path).st_ctime
        except OSError:
            started = time.time()
        return SandboxRecord.adopted_view(sandbox_id, image, started)

    async def sandboxes(self) -> list[tuple[SandboxRecord, Path]]:
        """Every sandbox E2B's API shows: the workspaces of the service with a live record
        or none."""
        await self.ready()
        infos = await self.service.workspaces.list()
        now = time.time()

        def views() -> list[tuple[SandboxRecord, Path]]:
            out = []
            for info in infos:
                rec = self.store.get(info.id)
                if rec is None:
                    rec = self._adopted(info.id, Path(info.path))
                elif not rec.alive(now):
                    continue
                out.append((rec, Path(info.path)))
            return out

        return await asyncio.to_thread(views)

    def sizes(self, paths: list[Path]) -> dict[Path, dict[str, int]]:
        """``cpuCount``, ``memoryMB`` and ``diskSizeMB`` of each workspace's sandbox, as
        its settings make it (blocking). The disk is the workspace's filesystem."""
        configs = None
        with contextlib.suppress(Exception):
            configs = self.service.local.configs
        out: dict[Path, dict[str, int]] = {}
        disks: dict[int, int] = {}
        for path in paths:
            cpus, memory = self.settings.cpus, 0
            try:
                own = configs.store.load(path) if configs is not None else WorkspaceSettings()
                spec = spec_for(configs.base if configs is not None else self.settings.sandbox_spec_kwargs(), own)
                cpus, memory = spec.cpus, spec.memory
            except Exception as e:  # (a settings file edited into something invalid)
                log.warning("e2b.settings_unreadable", workspace=str(path), error=str(e)[:200])
            try:
                dev = os.stat(path).st_dev
                if dev not in disks:
                    disks[dev] = shutil.disk_usage(path).total
                disk = disks[dev]
            except OSError:
                disk = 0
            out[path] = {
                "cpuCount": max(1, round(cpus)),
                "memoryMB": max(128, memory // MIB),
                "diskSizeMB": disk // MIB,
            }
        return out

    def running(self) -> int:
        """E2B sandboxes running now (paused and killed ones, and workspaces of loom's own
        API, not counted), creates under way included."""
        now = time.time()
        live = [r for r in self.store.all() if r.alive(now) and r.state == "running" and not r.adopted]
        return self._creating + len(live)

    def by_key(self, key: str) -> str | None:
        """The sandbox a create with idempotency key ``key`` made."""
        return self._by_key.get(key)

    @contextlib.asynccontextmanager
    async def creating(self) -> Any:
        """A create under way: counted against LOOM_E2B_MAX_SANDBOXES from the start.
        Raises E2BError 429 when that many run already."""
        if self.running() >= self.settings.e2b_max_sandboxes:
            raise E2BError(
                429,
                f"this service runs {self.settings.e2b_max_sandboxes} E2B sandboxes already "
                "(LOOM_E2B_MAX_SANDBOXES): kill or pause one first",
                retry=False,
            )
        self._creating += 1
        try:
            yield
        finally:
            self._creating -= 1

    # -- changing -----------------------------------------------------------------------

    async def register(self, rec: SandboxRecord, path: Path) -> None:
        """A sandbox just made: its container starting, its record stored. Raises OSError."""
        self.start_soon(rec.id, path)  # (first: the client's first command waits for it)
        await self.store.put(rec)
        if rec.idempotency_key:
            self._by_key[rec.idempotency_key] = rec.id
        self.wake()

    async def save(self, rec: SandboxRecord) -> None:
        """Store a changed record (an adopted view becomes a record). Raises OSError."""
        await self.store.put(rec)
        self.wake()

    def start_soon(self, sandbox_id: str, path: Path) -> None:
        """Start the sandbox's container in the background, unless a start is under way.
        A failure is logged: the first command meets it again and says so."""
        task = self._starts.get(sandbox_id)
        if task is not None and not task.done():
            return
        task = asyncio.get_running_loop().create_task(self._start(sandbox_id, path), name=f"e2b-start-{sandbox_id}")
        self._starts[sandbox_id] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._starts.get(sandbox_id) is t:
                del self._starts[sandbox_id]

        task.add_done_callback(done)

    async def _start(self, sandbox_id: str, path: Path) -> None:
        try:
            registry = self.service.local
            ws = await registry.workspace(path)
            self.service.runner.opened.add(path)  # (stopped with the service)
            await ws.sandbox.info()
            if not self.service.started:
                # The service ended while this started: what it started must not outlive it.
                await stop_sandbox(registry, path)
        except Exception as e:
            log.warning("e2b.start_failed", sandbox=sandbox_id, error=str(e)[:300])

    async def settle(self, sandbox_id: str) -> None:
        """Wait for a start under way (a container half made must not outlive a stop).
        Raises nothing (a failed start was logged)."""
        task = self._starts.get(sandbox_id)
        if task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(task)

    async def stop(self, path: Path) -> None:
        """Stop the workspace's container (never raises: a failure is logged)."""
        await stop_sandbox(self.service.registry, path)
        self.service.runner.forget(path)

    async def discard(self, sandbox_id: str, path: Path) -> None:
        """Undo a create that failed after its workspace was made: its container, files
        and record gone. Never raises (what cannot be removed is logged)."""
        try:
            await self.settle(sandbox_id)
            await self.stop(path)
            await self.service.workspaces.delete_files(sandbox_id)
            await self.service.workspaces.release(sandbox_id)
            await self.store.drop(sandbox_id)
        except Exception as e:
            log.warning("e2b.discard_failed", sandbox=sandbox_id, error=str(e)[:300])

    async def kill(self, rec: SandboxRecord, path: Path) -> None:
        """Kill: the record marked killed (E2B's API no longer shows it), the container
        removed; with LOOM_E2B_KILL_DELETES the workspace and the record too. Raises
        OSError (the record could not be written)."""
        async with self.lock(rec.id):
            await self.settle(rec.id)
            await self.store.put(rec.model_copy(update={"state": "killed", "killed_at": time.time()}))
            if rec.idempotency_key:
                self._by_key.pop(rec.idempotency_key, None)
            await self.stop(path)
            self._locks.pop(rec.id, None)
            if self.settings.e2b_kill_deletes:
                await self.service.workspaces.delete_files(rec.id)
                await self.service.workspaces.release(rec.id)
                await self.store.drop(rec.id)
        log.info("e2b.killed", sandbox=rec.id)

    async def pause(self, rec: SandboxRecord, path: Path) -> None:
        """Pause: the container stopped (files kept, processes ended), the record paused
        (its lifetime stands still). Raises E2BError 409 (paused already), OSError."""
        async with self.lock(rec.id):
            current = self.store.get(rec.id) or rec
            if current.state == "paused":
                raise E2BError(409, f"sandbox {rec.id!r} is already paused")
            await self.settle(rec.id)
            await self.store.put(current.model_copy(update={"state": "paused", "paused_at": time.time()}))
            await self.stop(path)
        log.info("e2b.paused", sandbox=rec.id)

    async def resume(self, rec: SandboxRecord, path: Path, timeout: int | None) -> SandboxRecord:
        """Resume a paused sandbox: running again, its lifetime ``timeout`` (or the one it
        had) from now, its container starting. Raises OSError."""
        async with self.lock(rec.id):
            current = self.store.get(rec.id) or rec
            if current.state != "paused":
                return current
            seconds = current.timeout if timeout is None else timeout
            now = time.time()
            new = current.model_copy(
                update={"state": "running", "paused_at": None, "timeout": seconds, "end_at": now + seconds}
            )
            await self.store.put(new)
        self.start_soon(rec.id, path)
        self.wake()
        log.info("e2b.resumed", sandbox=rec.id)
        return new

    # -- lifetimes ----------------------------------------------------------------------

    def wake(self) -> None:
        """Have the reaper look again now (a lifetime changed)."""
        if self._wake is not None:
            self._wake.set()

    async def _reap(self) -> None:
        """Kill (or pause, ``autoPause``) each sandbox whose time is up, then sleep until
        the next one's. Never raises: a failure is logged and tried again."""
        assert self._wake is not None
        while not self._closing:
            self._wake.clear()
            now = time.time()
            for rec in [r for r in self.store.all() if r.expired(now)]:
                if self._closing:
                    return
                try:
                    await self._time_up(rec)
                except Exception as e:
                    log.warning("e2b.reap_failed", sandbox=rec.id, error=str(e)[:300])
            ends = [r.end_at for r in self.store.all() if r.state == "running" and r.end_at is not None]
            delay = min([_REAP_EVERY, *(e - time.time() for e in ends)])
            # (asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
            # that comes as the event is set, and the reaper would never end)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.2, delay)):
                    await self._wake.wait()

    async def _time_up(self, rec: SandboxRecord) -> None:
        current = self.store.get(rec.id)
        if current is None or not current.expired(time.time()):
            return  # (given more time, or killed, since the reaper looked)
        rec = current
        path = await self.locate(rec.id)
        if path is None:  # its workspace was deleted through loom's own API
            await self.store.put(rec.model_copy(update={"state": "killed", "killed_at": time.time()}))
            return
        if rec.auto_pause:
            await self.pause(rec, path)
        else:
            await self.kill(rec, path)
        log.info("e2b.timed_out", sandbox=rec.id, action="pause" if rec.auto_pause else "kill")


def plane_of(app: Any) -> Plane:
    """The control plane of an app made by :func:`worker.http.create_app` (made at first use)."""
    plane: Plane | None = getattr(app.state, "e2b_plane", None)
    if plane is None:
        plane = app.state.e2b_plane = Plane(service_of(app))
    return plane


async def gate(app: Any, sandbox_id: str, path: Path) -> str | None:
    """Why a request to sandbox ``sandbox_id``'s own API must be refused as E2B refuses one
    to a sandbox that is not running (a reason with E2B's words, "was not found"), or
    None. A paused sandbox created with ``autoResume`` is resumed instead."""
    plane = await plane_of(app).ready()
    rec = plane.store.get(sandbox_id)
    if rec is None:
        return None
    if rec.state == "warm":
        return f"the sandbox {sandbox_id} was not found"
    if rec.state == "killed":
        return f"the sandbox {sandbox_id} was not found: it was killed"
    if rec.expired(time.time()):
        plane.wake()
        return f"the sandbox {sandbox_id} was not found: it reached its timeout"
    if rec.state == "paused":
        if not rec.auto_resume:
            return f"the sandbox {sandbox_id} was not found: it is paused (resume it with Sandbox.connect())"
        await plane.resume(rec, path, None)
    return None


__all__ = ["Plane", "gate", "plane_of"]
