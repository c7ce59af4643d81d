"""Sandboxes made ahead (``LOOM_E2B_WARM_SANDBOXES``): a create of the plain kind takes one
whose container already runs, so the client's first command does not wait for a start.

The plain kind is what most creates ask for: a template that is the default image, no
env vars, the default network (``Sandbox.create()``, ``Sandbox.create("base")``, the code
interpreter's ``code-interpreter-v1``). Metadata and lifetimes are the record's alone, so
they do not matter. A warm sandbox is a workspace with E2B's settings and a record in
state ``warm``: E2B's API does not show it (loom's own workspace list does), it counts
against no limit, and taking it turns its record into the new sandbox's (same id; its
start time the create's). After each create the pool is filled again in the background,
one sandbox at a time; a warm sandbox's container is kept from its idle stop while it
waits. The pool fills only once a create came: a service whose E2B API is not used makes
none. Those left at a restart are used again; beyond the setting they are deleted. (One
being made as the service stops may keep its container until its idle TTL ends it: the
engine call starting it is in a thread no cancellation reaches; the next start of the
service takes that container over.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, Protocol

from sandbox.logs import get_logger
from worker.http.settings import create_with
from worker.http.state import Service
from worker.settings import Settings
from worker.workspace_settings import parse

from .conventions import base_settings
from .records import RecordStore, SandboxRecord, new_sandbox_id

log = get_logger("worker.e2b")


class Starts(Protocol):
    """What the pool needs of its plane (:class:`.plane.Plane`, which holds the pool)."""

    service: Service
    settings: Settings
    store: RecordStore

    async def locate(self, sandbox_id: str) -> Path | None: ...

    def start_soon(self, sandbox_id: str, path: Path) -> None: ...

    async def settle(self, sandbox_id: str) -> None: ...

    async def stop(self, path: Path) -> None: ...


class WarmPool:
    """The warm sandboxes of one plane (see the module docstring)."""

    def __init__(self, plane: Starts, size: int) -> None:
        self.plane = plane
        self.size = size
        self._filler: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._taken: set[str] = set()
        self._closing = False

    def fits(self, settings: dict[str, Any], image: str) -> bool:
        """Whether a create with these workspace settings and image can take a warm one."""
        return self.size > 0 and image == self.plane.settings.image and settings == base_settings(self.plane.settings)

    def _warm(self) -> list[SandboxRecord]:
        return sorted(
            (r for r in self.plane.store.all() if r.state == "warm" and r.id not in self._taken),
            key=lambda r: r.started_at,
        )

    async def take(self) -> tuple[str, Path] | None:
        """A warm sandbox's id and workspace, now the caller's (its record is the caller's to
        replace), or None when none is ready."""
        for rec in self._warm():
            self._taken.add(rec.id)
            path = await self.plane.locate(rec.id)
            if path is not None:
                return rec.id, path
            with contextlib.suppress(OSError):
                await self.plane.store.drop(rec.id)  # (its workspace was deleted by hand)
        return None

    def taken(self, sandbox_id: str) -> None:
        """The caller stored its own record for ``sandbox_id`` (or gave it up)."""
        self._taken.discard(sandbox_id)

    async def aclose(self) -> None:
        """End the filler once the sandbox it is making (if any) is made."""
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        if self._filler is not None:
            with contextlib.suppress(BaseException):
                await self._filler

    def fill_soon(self) -> None:
        """Fill the pool in the background (one filler, woken when it waits)."""
        if self.size <= 0 or self._closing:
            return
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._filler is None or self._filler.done():
            self._filler = asyncio.get_running_loop().create_task(self._fill(), name="e2b-warm")

    async def _fill(self) -> None:
        """Make warm sandboxes until there are ``size`` (the missing ones side by side),
        each started; then wait to be woken, touching their containers well within their
        idle TTL (a request to the agent does). Never raises: a failure is logged, the
        next create tries again."""
        assert self._wake is not None
        try:
            for rec in self._warm()[self.size :]:
                await self._discard(rec.id)
            while not self._closing:
                self._wake.clear()
                for rec in self._warm():
                    path = await self.plane.locate(rec.id)
                    if path is not None:
                        self.plane.start_soon(rec.id, path)  # (again after a restart or an idle stop)
                        await self.plane.settle(rec.id)
                missing = self.size - len(self._warm())
                if missing > 0 and not self._closing:
                    # Side by side: a client creating in a loop takes them as fast as one
                    # start takes.
                    made = await asyncio.gather(*(self._make() for _ in range(missing)), return_exceptions=True)
                    failed = [r for r in made if isinstance(r, BaseException)]
                    if failed:
                        raise failed[0]  # (logged below; the next create tries again)
                if self._closing:
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(5.0, self.plane.settings.idle_ttl / 3)):
                        await self._wake.wait()
        except Exception as e:
            log.warning("e2b.warm_failed", error=str(e)[:300])

    async def _make(self) -> None:
        service = self.plane.service
        sandbox_id = new_sandbox_id()
        own = parse(base_settings(self.plane.settings))
        info = await create_with(service.registry, service.workspaces, sandbox_id, own)
        path = Path(info.path)
        rec = SandboxRecord(id=sandbox_id, template="base", state="warm", started_at=time.time())
        await self.plane.store.put(rec)
        self.plane.start_soon(sandbox_id, path)
        await self.plane.settle(sandbox_id)

    async def _discard(self, sandbox_id: str) -> None:
        path = await self.plane.locate(sandbox_id)
        if path is not None:
            await self.plane.stop(path)
            await self.plane.service.workspaces.delete_files(sandbox_id)
        await self.plane.store.drop(sandbox_id)


__all__ = ["WarmPool"]
