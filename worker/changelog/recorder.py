"""The changelog of one workspace: record-before-write, crash recovery, and the
:class:`ChangeRecorder` methods the tools call.

Write protocol (the order is the crash-safety argument):

1. take the workspace lock (in-process + ``flock``);
2. read the before-image *through the sandbox* (never from the host);
3. commit, durably, the entry as ``pending`` together with the before- and after-image
   blobs; a full disk fails here, before the workspace is touched. The same transaction
   first checks for entries a crashed writer left ``pending``: if there are any, nothing
   is written, they are settled (by hashing their files) and the commit is retried;
4. ``sandbox.write`` with a precondition on exactly the content recorded (temp file,
   fsync, rename in the agent: the file is wholly old or wholly new);
5. mark the entry ``applied`` (or ``failed`` when the agent refused) and update the
   shell baseline. A crash between 3 and 5 leaves ``pending``; step 1 of the next user
   hashes the file and settles it as applied or failed.

Step 5 for a success is off the caller's path: it is held in memory and the write returns
at once. It is applied by whatever this process next does on the changelog's database
thread, before that work: inside the next change's step-3 transaction (no commit of its
own), or in front of any other store call (log, undo, a shell scan), or after
``FINISH_DELAY`` of quiet. So every later use in this process sees the entry settled.
Another process that comes first settles it by hash in its step 1 (the same outcome,
baseline included), and the late update then finds the entry no longer pending and
changes nothing. A crash before it is applied leaves the entry pending: recovery again.

Durability (:data:`~worker.changelog.model.Durability`): "full" fsyncs the commit of
step 3 and the file of step 4; "process" does neither. Both keep the order of steps 3
and 4 and the atomic rename, which is what survives SIGKILL of any process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sandbox.base import Sandbox, WriteResult, staged_writes
from sandbox.errors import AgentError, ConflictError, PathNotFoundError
from sandbox.identity import workspace_digest
from sandbox.logs import get_logger

from .. import faults
from .errors import ChangelogStorageError
from .finish import Baseline, finish_in, made_dir_row
from .intents import IntentJournal, staged_temp
from .model import Entry, Kind, Limits, Origin
from .reserve import check_reserve
from .store import Connection, Store, WorkspaceLock, sha256

T = TypeVar("T")
log = get_logger("worker.changelog")
#: Seconds of quiet after which held step-5 updates are applied on their own.
FINISH_DELAY = 0.005
_Finish = tuple[int, Baseline | None, int | None, int | None]


def workspace_dir(data_dir: Path, workspace: Path) -> Path:
    """``data_dir/workspaces/<sha256 of the real path>`` (its first 32 hex digits,
    :func:`sandbox.identity.workspace_digest`): the key only, nothing is read there."""
    return Path(data_dir) / "workspaces" / workspace_digest(workspace)[:32]


@dataclass
class Current:
    """What a path holds right now, as read through the sandbox."""

    kind: Kind | None  # None = absent
    sha: str | None = None
    data: bytes | None = None  # None when not kept (too large)
    mode: int | None = None
    note: str | None = None


class ChangelogCore:
    """Storage, locking and the single-change primitive shared by writes and undo."""

    def __init__(self, root: Path, workspace: Path, limits: Limits) -> None:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.root = root
        self.workspace = Path(os.path.realpath(workspace))
        self.limits = limits
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="changelog-db")
        self.fsync = limits.durability == "full"
        self.store = Store(root / "changelog.sqlite3", fsync=self.fsync, workspace=self.workspace)
        self.lock = WorkspaceLock(root / "lock")
        #: Held across a whole mutation (a command from its before-scan to its after-scan,
        #: a write, an undo): one writer per workspace across processes (see api.py).
        self.mutations = WorkspaceLock(root / "mutation.lock")
        self.intents = IntentJournal(root / "intents")
        self.snapshot_key = "loom-changelog-" + root.name
        self._peek: sqlite3.Connection | None = None
        # Step-5 updates not yet applied (see the module docstring): appended on the event
        # loop, taken on the database thread.
        self._finishes: list[_Finish] = []
        self._finishes_lock = threading.Lock()
        self._finish_timer: asyncio.TimerHandle | None = None
        self._last_finish = 0.0
        self._closed = False

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking store call on the changelog's own thread (after this process's
        held step-5 updates, so it sees them)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(self._run, fn, args, kwargs))

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        # _begin_tx applies them inside its own transaction instead.
        if self._finishes and getattr(fn, "__func__", None) is not ChangelogCore._begin_tx:
            self._apply_finishes_quietly()
        return fn(*args, **kwargs)

    def _take_finishes(self) -> list[_Finish]:
        with self._finishes_lock:
            items, self._finishes = self._finishes, []
        return items

    def _requeue_finishes(self, items: list[_Finish]) -> None:
        with self._finishes_lock:
            self._finishes[:0] = items

    def _apply_finishes_quietly(self) -> None:
        """Apply the held step-5 updates in one transaction (database thread)."""
        items = self._take_finishes()
        if not items:
            return
        try:
            with self.store.tx(durable=False) as db:
                for item in items:
                    finish_in(db, item[0], "applied", *item[1:])
        except ChangelogStorageError as e:
            # The entries stay pending; the next user's recovery settles them by hash.
            log.warning("changelog.finish_deferred", entries=[i[0] for i in items], error=str(e)[:300])

    def _peek_pending(self) -> bool | None:
        """Whether entries are pending, checked on the calling (event-loop) thread: an
        indexed read of a WAL database never waits for writers and costs ~20 µs, a fifth
        of a hop to the store's thread. With ``busy_timeout=0`` it cannot block either:
        None (unknown) when SQLite is busy, and the caller asks the store's thread. It may
        see our own not-yet-settled entries: then the store thread, which settles them
        first, has the last word."""
        try:
            if self._peek is None:
                self._peek = sqlite3.connect(self.store.path, timeout=0, isolation_level=None, check_same_thread=False)
                self._peek.execute("PRAGMA query_only=1")
            rows = self._peek.execute("SELECT id FROM entries WHERE state = 'pending' LIMIT 64").fetchall()
        except sqlite3.Error:
            return None
        if not rows:
            return False
        # This process's held step-5 updates are not a crashed writer's: every store call
        # applies them first.
        with self._finishes_lock:
            own = {item[0] for item in self._finishes}
        return len(rows) == 64 or any(r[0] not in own for r in rows)

    async def aclose(self) -> None:
        self._closed = True
        if self._finish_timer is not None:
            self._finish_timer.cancel()
            self._finish_timer = None
        if self._peek is not None:
            self._peek.close()
            self._peek = None
        await self.db(self.store.close)
        self._pool.shutdown(wait=True)
        self.lock.close()
        self.mutations.close()
        self.intents.close()

    def check_reserve(self, what: str) -> None:
        """Refuse to start ``what`` below the reserve (:func:`.reserve.check_reserve`)."""
        check_reserve(self.root, self.limits.reserve_bytes, what)

    # -- reading through the sandbox ---------------------------------------------------

    async def current(self, sandbox: Sandbox, path: str) -> Current:
        """The content at ``path``. Raises sandbox errors other than not-found
        (NotAFileError for a directory or FIFO, PathEscapeError)."""
        try:
            r = await sandbox.read(path, max_bytes=self.limits.max_file_bytes)
        except PathNotFoundError:
            return Current(None)
        if r.sha256 is not None:
            return Current("file", r.sha256, r.data)
        digest = (await sandbox.hash([path])).get(path)
        return Current(
            "file",
            digest,
            None,
            note=f"before-image not kept: {r.size} bytes exceeds the {self.limits.max_file_bytes} byte per-file cap",
        )

    # -- the single-change primitive ---------------------------------------------------

    def _begin_tx(
        self,
        fields: dict[str, Any],
        blobs: list[tuple[str, bytes]],
        *,
        settled: bool,
        require_blob: str | None = None,
    ) -> int | None:
        """Record the entry; None (nothing written) when ``settled`` is False and entries
        are still pending, which then need :meth:`recover` first, or when the blob
        ``require_blob`` is not stored."""
        held = self._take_finishes()
        try:
            with self.store.tx() as db:
                for item in held:  # this process's step 5 of earlier changes, in this commit
                    finish_in(db, item[0], "applied", *item[1:])
                return self._record_in(db, fields, blobs, settled=settled, require_blob=require_blob)
        except BaseException:
            self._requeue_finishes(held)
            raise

    @staticmethod
    def _record_in(
        db: Connection,
        fields: dict[str, Any],
        blobs: list[tuple[str, bytes]],
        *,
        settled: bool,
        require_blob: str | None,
    ) -> int | None:
        if not settled and db.execute("SELECT 1 FROM entries WHERE state = 'pending' LIMIT 1").fetchone():
            return None
        if (
            require_blob is not None
            and not db.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (require_blob,)).fetchone()
        ):
            return None
        for digest, data in blobs:
            Store.put_blob(db, digest, data)
        return Store.insert_entry(db, **fields)

    def _drop_tx(self, entry_id: int) -> None:
        """Delete a pending entry whose change was never attempted, or refused as a conflict."""
        with self.store.tx(durable=False) as db:
            db.execute("DELETE FROM entries WHERE id = ? AND state = 'pending'", (entry_id,))

    def _finish_tx(
        self,
        entry_id: int,
        state: str,
        baseline: Baseline | None,
        reverts: int | None,
        mode: int | None = None,
    ) -> None:
        # Not fsync'd: if this is lost the entry stays pending and recovery settles it.
        with self.store.tx(durable=False) as db:
            finish_in(db, entry_id, state, baseline, reverts, mode)

    def _finish_later(
        self, entry_id: int, baseline: Baseline | None, reverts: int | None, mode: int | None = None
    ) -> None:
        """Hold step 5 of a successful change until the next use of the database thread,
        or ``FINISH_DELAY`` of quiet (see the module docstring). Event loop only."""
        with self._finishes_lock:
            self._finishes.append((entry_id, baseline, reverts, mode))
        self._last_finish = time.monotonic()
        if self._finish_timer is None and not self._closed:
            self._finish_timer = asyncio.get_running_loop().call_later(FINISH_DELAY, self._finish_due)

    def _finish_due(self) -> None:
        self._finish_timer = None
        if self._closed or not self._finishes:
            return
        wait = self._last_finish + FINISH_DELAY - time.monotonic()
        if wait > 0:  # changes keep coming: each one's step 3 applies the earlier ones
            self._finish_timer = asyncio.get_running_loop().call_later(wait, self._finish_due)
            return
        self._pool.submit(self._apply_finishes_quietly)

    async def change(
        self,
        sandbox: Sandbox,
        path: str,
        data: bytes | None,
        cur: Current,
        *,
        expect_sha256: str | None,
        expect_absent: bool,
        tool: str,
        call_id: str | None,
        subtask_id: str | None,
        origin: Origin,
        reverts: int | None = None,
        note: str | None = None,
        mode: int | None = None,
    ) -> tuple[int, WriteResult | None]:
        """Record, then write ``data`` to (or with None, remove) ``path``. Caller holds the lock.
        ``mode``: the permissions of a file this creates (an undone deletion).

        Returns the entry id and the sandbox's WriteResult (None for a removal). Raises the
        sandbox's error unchanged (the entry is then ``failed``, or left ``pending`` when
        the outcome is unknown, e.g. the sandbox was lost), ChangelogStorageError before
        anything was written.
        """
        fields, blobs, after = self.entry(
            path,
            data,
            cur,
            tool=tool,
            call_id=call_id,
            subtask_id=subtask_id,
            origin=origin,
            reverts=reverts,
            note=note,
        )
        # Settling a crashed writer's entries is folded into the recording transaction:
        # any pending entry was there before the caller took the lock (this process's own
        # step 5 runs before this on the database thread), and recovery only hashes
        # files, so what the caller read through the sandbox is still what it read.
        if data is not None:
            return await self._staged_change(
                sandbox, path, data, fields, blobs, after, expect_sha256, expect_absent, reverts, mode
            )
        entry_id = await self.db(self._begin_tx, fields, blobs, settled=False)
        if entry_id is None:
            await self.recover(sandbox)
            entry_id = await self.db(self._begin_tx, fields, blobs, settled=True)
        assert entry_id is not None
        result = await self.apply(
            sandbox,
            entry_id,
            path,
            data,
            after,
            expect_sha256=expect_sha256,
            expect_absent=expect_absent,
            reverts=reverts,
        )
        return entry_id, result

    async def _staged_change(
        self,
        sandbox: Sandbox,
        path: str,
        data: bytes,
        fields: dict[str, Any],
        blobs: list[tuple[str, bytes]],
        after: str | None,
        expect_sha256: str | None,
        expect_absent: bool,
        reverts: int | None,
        mode: int | None = None,
    ) -> tuple[int, WriteResult | None]:
        """``change`` for a write: the entry's commit and the agent's staging of the new
        content (temp file written and fsync'd) run at once; the file is put in place
        only after both, so the entry is still durable before the file changes."""
        token = secrets.token_hex(8)
        intent = self.stage_intent(path, token)
        try:
            return await self._staged(
                sandbox, path, data, fields, blobs, after, expect_sha256, expect_absent, reverts, mode, token
            )
        finally:
            self.intents.end(intent)

    def stage_intent(self, path: str, token: str) -> str:
        """Open a staged write's intent (a crash's temporary is then removed by recovery)."""
        return self.intents.start("stage", temp=staged_temp(path, token), ts=time.time())

    async def _staged(
        self,
        sandbox: Sandbox,
        path: str,
        data: bytes,
        fields: dict[str, Any],
        blobs: list[tuple[str, bytes]],
        after: str | None,
        expect_sha256: str | None,
        expect_absent: bool,
        reverts: int | None,
        mode: int | None,
        token: str,
    ) -> tuple[int, WriteResult | None]:
        staged, entry_id = await asyncio.gather(
            staged_writes(sandbox).stage_write(
                path,
                data,
                expect_sha256=expect_sha256,
                expect_absent=expect_absent,
                fsync=self.fsync,
                token=token,
                mode=None if mode is None else mode & 0o777,
                # Undo puts back what the file held even where its mode now refuses its
                # user (a file made read-only after the change); a tool never does.
                override_mode=fields["origin"] == "undo",
            ),
            self.db(self._begin_tx, fields, blobs, settled=False),
            return_exceptions=True,
        )
        if isinstance(entry_id, BaseException) or isinstance(staged, BaseException):
            if not isinstance(staged, BaseException):
                await staged_writes(sandbox).abort_write(staged)
            if isinstance(entry_id, int):
                await self.db(self._finish_tx, entry_id, "failed", None, None)  # nothing was written
            raise entry_id if isinstance(entry_id, BaseException) else staged  # type: ignore[misc]
        if staged.path != path:  # a link planted since the path was canonicalized
            await staged_writes(sandbox).abort_write(staged)
            await self.db(self._finish_tx, entry_id, "failed", None, None) if entry_id is not None else None
            raise ConflictError(f"Conflict: {path} now resolves to {staged.path}; nothing was written", code="conflict")
        if entry_id is None:
            await self.recover(sandbox)  # hashes files only: our staged temporary is untouched
            entry_id = await self.db(self._begin_tx, fields, blobs, settled=True)
        assert entry_id is not None
        faults.point("write.recorded")
        try:
            result = await staged_writes(sandbox).commit_write(staged, snapshot=self.snapshot_key)
        except AgentError:
            await self.db(self._finish_tx, entry_id, "failed", None, None)
            raise
        faults.point("write.placed")
        self._finish_later(entry_id, (path, after, result.stat), reverts, staged.mode)
        return entry_id, result

    def entry(
        self,
        path: str,
        data: bytes | None,
        cur: Current,
        *,
        tool: str,
        call_id: str | None,
        subtask_id: str | None,
        origin: Origin,
        reverts: int | None = None,
        note: str | None = None,
        before_stored: bool = False,
    ) -> tuple[dict[str, Any], list[tuple[str, bytes]], str | None]:
        """The row and the blobs that record changing ``path`` from ``cur`` to ``data``,
        and the after hash. ``before_stored``: ``cur.sha``'s blob is already stored."""
        after = sha256(data) if data is not None else None
        op = "delete" if data is None else ("create" if cur.kind is None else "modify")
        blobs = []
        if cur.data is not None and cur.sha is not None:
            blobs.append((cur.sha, cur.data))
        if data is not None and after is not None and len(data) <= self.limits.max_file_bytes:
            blobs.append((after, data))
        restorable = cur.kind is None or (cur.kind == "file" and (cur.data is not None or before_stored))
        fields = {
            "ts": time.time(),
            "call_id": call_id,
            "subtask_id": subtask_id,
            "tool": tool,
            "op": op,
            "path": path,
            "before_hash": cur.sha,
            "after_hash": after,
            "before_kind": cur.kind,
            "after_kind": None if data is None else "file",
            "before_mode": cur.mode,
            "state": "pending",
            "origin": origin,
            "restorable": int(restorable),
            "note": note or cur.note,
            "reverts": reverts,
        }
        return fields, blobs, after

    async def apply(
        self,
        sandbox: Sandbox,
        entry_id: int,
        path: str,
        data: bytes | None,
        after: str | None,
        *,
        expect_sha256: str | None,
        expect_absent: bool,
        reverts: int | None,
        mode: int | None = None,
        drop_on_conflict: bool = False,
    ) -> WriteResult | None:
        """Step 4 and 5 for the recorded entry ``entry_id``. Raises the sandbox's errors
        (the entry is then ``failed``, or deleted for a conflict when ``drop_on_conflict``:
        the change was refused before anything was written)."""
        try:
            if data is None:
                await sandbox.remove(path, expect_sha256=expect_sha256)
                result = None
            elif self.fsync:
                result = await sandbox.write(path, data, expect_sha256=expect_sha256, expect_absent=expect_absent)
            else:
                result = await sandbox.write(
                    path, data, expect_sha256=expect_sha256, expect_absent=expect_absent, fsync=False
                )
        except ConflictError:
            if drop_on_conflict:
                await self.db(self._drop_tx, entry_id)
            else:
                await self.db(self._finish_tx, entry_id, "failed", None, None)
            raise
        except AgentError:
            await self.db(self._finish_tx, entry_id, "failed", None, None)
            raise
        self._finish_later(entry_id, (path, after), reverts, mode)
        return result

    # -- recovery ----------------------------------------------------------------------

    async def recover(self, sandbox: Sandbox) -> list[Entry]:
        """Settle entries left ``pending`` by a crashed or cancelled writer. Caller holds the lock.

        Also removes the temporaries of staged writes a crashed writer left (their intents
        name them). Returns the settled entries. Raises infrastructure errors of the
        sandbox, ChangelogStorageError.
        """
        for intent in self.intents.orphans():
            if intent.kind == "stage":
                if intent.temp:
                    with contextlib.suppress(AgentError):  # gone already (renamed in, or never made)
                        await sandbox.remove(intent.temp)
                    log.info("changelog.stage_cleaned", temp=intent.temp)
                self.intents.end(intent.id)
        if self._peek_pending() is False:
            return []
        pending = await self.db(self.store.entries, "state = 'pending'")
        if not pending:
            return []
        paths = sorted({p for e in pending for p in (e.path, e.new_path) if p})
        hashes = await sandbox.hash(paths)
        for e in pending:
            if e.after_kind == "dir" and e.before_kind is None:  # a directory a write made
                try:
                    made = (await sandbox.stat(e.path)).type == "dir"
                except AgentError:
                    made = False
                await self.db(self._settle_dir_tx, e, "applied" if made else "failed")
                continue
            now = hashes.get(e.path)
            applied = now == e.after_hash
            if e.op == "rename" and e.new_path:
                applied = now is None and hashes.get(e.new_path) == e.after_hash
            failed = not applied and now == e.before_hash
            state = "applied" if applied else "failed"
            note = None if applied or failed else "outcome unknown after a crash: the file changed since"
            await self.db(self._settle_tx, e, state, note)
        return pending

    def _settle_dir_tx(self, e: Entry, state: str) -> None:
        with self.store.tx() as db:
            if finish_in(db, e.id, state, None, None) and state == "applied":
                made_dir_row(db, e.path)

    def _settle_tx(self, e: Entry, state: str, note: str | None) -> None:
        # What the writer's own step 5 would have done (the shell baseline follows an
        # applied change, an undo marks what it reverted), only if still pending.
        with self.store.tx() as db:
            finish_in(db, e.id, state, (e.path, e.after_hash), e.reverts, note=note)
