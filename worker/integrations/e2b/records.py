"""The host's record of each E2B sandbox: what E2B's API says about a sandbox that a loom
workspace does not (its template, metadata, environment variables, network, lifetime and
state), kept where the sandbox cannot reach it.

One JSON file per sandbox, ``<LOOM_DATA_DIR>/e2b/sandboxes/<id>.json`` (mode 0600, in a
0700 directory), replaced whole on every change (:func:`worker.storage.atomic.write_atomic`:
a reader or a crash sees the old record or the new, never a part), so records survive a
restart of the service. A killed sandbox keeps its record (state ``killed``): its
workspace stays on disk for ``loom-worker log`` and undo (unless ``LOOM_E2B_KILL_DELETES``)
and must stay invisible to E2B's API. A workspace with no record (made by loom's own API)
is still a sandbox to E2B: :meth:`SandboxRecord.adopted` describes it.

Times are wall-clock seconds (``time.time()``): E2B's ``startedAt`` and ``endAt`` are dates.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox.logs import get_logger
from worker.service import check_workspace_id
from worker.storage.atomic import write_atomic

log = get_logger("worker.e2b")

#: ``warm``: made ahead, not a client's yet (:mod:`.warm`); E2B's API shows none.
State = Literal["warm", "running", "paused", "killed"]
#: The lifetime of a sandbox made by ``Sandbox.create`` without a timeout (E2B's default).
DEFAULT_TIMEOUT = 300


def new_sandbox_id() -> str:
    """A sandbox's id (and its workspace's), E2B's shape: 21 lowercase letters and digits."""
    return "i" + secrets.token_hex(10)


class SandboxRecord(BaseModel):
    """One sandbox as E2B's API describes it (the fields E2B's ``SandboxDetail`` has that
    a loom workspace does not know)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    #: The template as the client named it (an E2B template, or a snapshot it came from).
    template: str
    #: The image it maps to (None: the service's default image, LOOM_IMAGE).
    image: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    env_vars: dict[str, str] = Field(default_factory=dict)
    started_at: float
    #: When it is killed (or paused, ``auto_pause``); None: never (a workspace of loom's
    #: own API that no E2B client gave a timeout).
    end_at: float | None = None
    #: The lifetime last asked for (seconds): a resume starts it again.
    timeout: int = DEFAULT_TIMEOUT
    state: State = "running"
    paused_at: float | None = None
    killed_at: float | None = None
    allow_internet_access: bool | None = None
    #: E2B's network configuration as the client gave it (camelCase, for ``network`` in
    #: the sandbox's detail); what loom made of it is the workspace's egress setting.
    network: dict[str, Any] | None = None
    auto_pause: bool = False
    auto_resume: bool = False
    idempotency_key: str | None = None
    #: A workspace made by loom's own API that an E2B client connected to.
    adopted: bool = False

    @classmethod
    def adopted_view(cls, sandbox_id: str, image: str, started_at: float) -> SandboxRecord:
        """How E2B sees a workspace with no record: running, its template its image, no
        end (until an E2B client gives it a timeout)."""
        return cls(id=sandbox_id, template=image, image=image, started_at=started_at, adopted=True)

    def expired(self, now: float) -> bool:
        """Whether its lifetime is over while it runs (a paused sandbox does not age)."""
        return self.state == "running" and self.end_at is not None and self.end_at <= now

    def alive(self, now: float) -> bool:
        """Whether E2B's API shows it: running or paused, its time not up."""
        return self.state in ("running", "paused") and not self.expired(now)


class RecordStore:
    """The records under one directory, read once and then kept in memory (this service
    is their only writer); every change is written through before it is answered."""

    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self._records: dict[str, SandboxRecord] = {}
        self._loaded = False
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> bool:
        return self._loaded

    def _path(self, sandbox_id: str) -> Path:
        return self.directory / f"{check_workspace_id(sandbox_id)}.json"

    def _load(self) -> dict[str, SandboxRecord]:
        """Every record on disk (blocking). A file that does not parse is logged and left
        alone: its sandbox is then seen as a workspace without a record."""
        found: dict[str, SandboxRecord] = {}
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return found
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                rec = SandboxRecord.model_validate(json.loads(Path(entry.path).read_bytes()))
            except (OSError, ValueError, ValidationError) as e:
                log.warning("e2b.record_unreadable", path=entry.path, error=str(e)[:200])
                continue
            if entry.name == f"{rec.id}.json":
                found[rec.id] = rec
        return found

    async def load(self) -> None:
        """Read the records once (later calls return at once). Raises nothing: an
        unreadable directory is logged and the store starts empty."""
        if self._loaded:
            return
        async with self._lock:
            if not self._loaded:
                try:
                    self._records = await asyncio.to_thread(self._load)
                except OSError as e:
                    log.warning("e2b.records_unreadable", directory=str(self.directory), error=str(e))
                self._loaded = True

    def get(self, sandbox_id: str) -> SandboxRecord | None:
        return self._records.get(sandbox_id)

    def all(self) -> list[SandboxRecord]:
        return list(self._records.values())

    def _write(self, rec: SandboxRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        body = json.dumps(rec.model_dump(mode="json"), sort_keys=True, indent=1) + "\n"
        write_atomic(self._path(rec.id), body, fsync=self.fsync)

    async def put(self, rec: SandboxRecord) -> None:
        """Store ``rec`` (replacing its previous version). Raises OSError (the record in
        memory is then unchanged)."""
        await asyncio.to_thread(self._write, rec)
        self._records[rec.id] = rec

    async def drop(self, sandbox_id: str) -> None:
        """Forget a sandbox whose workspace is gone. Raises OSError."""
        path = self._path(sandbox_id)
        await asyncio.to_thread(path.unlink, missing_ok=True)
        self._records.pop(sandbox_id, None)


__all__ = ["DEFAULT_TIMEOUT", "RecordStore", "SandboxRecord", "State", "new_sandbox_id"]
