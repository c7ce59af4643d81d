"""``Changelog``: the public face of one workspace's changelog.

It implements the tools' ``ChangeRecorder`` protocol (``write``, ``before_shell``,
``after_shell``) and the log / diff / summary / undo API used by the CLI and services.
Storage lives under ``data_dir/workspaces/<hash of the workspace's real path>/``: never in
the workspace, never mounted into a sandbox. The workspace path is only a key; every file
of the workspace is read and written through the :class:`~sandbox.base.Sandbox`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from sandbox.base import ExecResult, Sandbox, ScanResult, WriteResult
from sandbox.logs import get_logger

from .. import faults
from ..quoting import quote_path
from .changes import entries_diff
from .diff import Content, first_before, read_now, summarize, unified
from .errors import ChangelogStorageError, ChangesNotRecordedError, EntryNotFoundError
from .groups import Group, group, select_last
from .model import Durability, Entry, Limits, Summary, UndoResult
from .paths import is_safe_relpath
from .recorder import ChangelogCore, workspace_dir
from .restore import Plan, Restorer
from .shellscan import ShellToken, ShellTracker
from .store import Store, WorkspaceLock
from .undo import select, undo
from .write import recorded_write

log = get_logger("worker.changelog")

#: Beside a fork's changelog: the snapshot its history starts at.
ORIGIN_FILE = "forked_from.json"


def _read_origin(root: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((root / ORIGIN_FILE).read_text()))
    except FileNotFoundError:
        return None


class Changelog:
    """One workspace's changelog. Safe to share between coroutines of one event loop, and
    between processes (each opens its own ``Changelog`` on the same data directory)."""

    def __init__(self, core: ChangelogCore) -> None:
        self._core = core
        self._shell = ShellTracker(core)

    @classmethod
    def open(
        cls,
        data_dir: Path,
        workspace: Path,
        *,
        limits: Limits | None = None,
        durability: Durability | None = None,
    ) -> Changelog:
        """Open (creating) the changelog of ``workspace`` under ``data_dir``.

        ``durability`` (default ``limits.durability``, "full") chooses what a recorded
        change survives: "full" a power cut, "process" only the death of a process (no
        fsync; see :data:`~worker.changelog.model.Durability`).
        Raises ChangelogStorageError when the store cannot be opened, ValueError for an
        unknown ``durability``.
        """
        limits = limits or Limits()
        if durability is not None:
            limits = Limits.model_validate({**limits.model_dump(), "durability": durability})
        core = ChangelogCore(workspace_dir(Path(data_dir), Path(workspace)), Path(workspace), limits)
        if core.store.meta("workspace") is None:  # (a history made before the store named it)
            with core.store.tx() as db:
                if core.store.meta("workspace") is None:
                    Store.set_meta(db, "workspace", str(core.workspace))
        return cls(core)

    @property
    def workspace(self) -> Path:
        """The workspace directory (its real path) this changelog records."""
        return self._core.workspace

    @property
    def directory(self) -> Path:
        """Where this changelog's files live (outside the workspace)."""
        return self._core.root

    @property
    def limits(self) -> Limits:
        return self._core.limits

    @property
    def mutations(self) -> WorkspaceLock:
        """The workspace's mutation lock across coroutines and processes: held for a whole
        change (a command from its scan before to its scan after, a write, an undo, a
        restore), so two processes on one workspace (the CLI's local worker and ``serve``,
        two services) take turns and every change is recorded exactly once. Reentrant
        within one hold (:class:`~worker.changelog.store.WorkspaceLock`)."""
        return self._core.mutations

    @property
    def lock(self) -> WorkspaceLock:
        """The workspace's lock across coroutines and processes (what every recorded
        change takes); a snapshot holds it while it pauses the sandbox and copies."""
        return self._core.lock

    async def aclose(self) -> None:
        await self._core.aclose()

    async def __aenter__(self) -> Changelog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def recover(self, sandbox: Sandbox) -> list[Entry]:
        """Settle what a crashed writer left (every other change does this first, too):
        entries ``pending``, staged temporaries, and commands whose end was never recorded
        (their changes recorded as theirs, marked interrupted). Returns the pending entries
        as they were. Raises sandbox and storage errors."""
        async with self._core.mutations, self._core.lock:
            return await self._settle(sandbox)

    def check_reserve(self, what: str) -> None:
        """Refuse to start ``what`` when the data directory lacks the room kept to record
        its changes (``reserve_bytes``), as every change does first; for a caller that must
        answer a refusal before it starts a stream. Raises ReserveError,
        ChangelogStorageError."""
        self._core.check_reserve(what)

    async def interrupted(self) -> int:
        """How many commands or staged writes a crashed writer left open (reconciled by
        the next change, :meth:`recover`). Raises ChangelogStorageError."""
        return len(self._core.intents.orphans())

    async def _settle(self, sandbox: Sandbox) -> list[Entry]:
        """:meth:`recover` with the locks held."""
        settled = await self._core.recover(sandbox)
        for intent in self._core.intents.orphans():
            if intent.kind != "command":
                continue
            if await self._shell.ready():
                record = {**intent.record, "interrupted": True}
                changed = await self._shell.sync(sandbox, record)
                log.info("changelog.reconciled", command=str(record.get("command", ""))[:200], changed=len(changed))
            self._core.intents.end(intent.id)
        return settled

    # -- ChangeRecorder ---------------------------------------------------------------

    async def write(
        self,
        sandbox: Sandbox,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None = None,
        expect_absent: bool = False,
        tool: str = "write_file",
        call_id: str | None = None,
        subtask_id: str | None = None,
        guess_sha256: str | None = None,
    ) -> WriteResult:
        """Record ``path``'s before-image durably, then write ``data`` through the sandbox.
        ``guess_sha256``: what the file probably holds now (saves reading it when right).

        Raises the sandbox's errors unchanged (ConflictError, NotAFileError,
        PathEscapeError, TooLargeError, infrastructure errors) and ChangelogStorageError
        (then the workspace was not changed).
        """
        async with self._core.mutations:
            self._core.check_reserve(tool)
            if self._core.intents.orphans():
                async with self._core.lock:
                    await self._settle(sandbox)
            return await recorded_write(
                self._core,
                sandbox,
                path,
                data,
                expect_sha256=expect_sha256,
                expect_absent=expect_absent,
                tool=tool,
                call_id=call_id,
                subtask_id=subtask_id,
                guess_sha256=guess_sha256,
            )

    async def before_shell(
        self,
        sandbox: Sandbox,
        *,
        piggyback: bool = False,
        pending: ScanResult | None = None,
        attribute: dict[str, Any] | None = None,
        intent: dict[str, Any] | None = None,
    ) -> ShellToken:
        """Make sure the baseline exists and is current before a command runs.

        The first call reads the whole workspace (within :class:`Limits`) through the
        sandbox. With ``piggyback`` the caller sends ``token.scan`` along with the command
        (``ExecRequest.scan``), so no separate scan is made when the agent's
        snapshot is watched; ``pending`` is the scan an ``exec`` handed back unrun
        (:class:`~sandbox.base.ScanFirst`), recorded here as outside changes, or, with
        ``attribute`` (``tool``, ``command``, ``call_id``, ``subtask_id``: a background
        process that ran meanwhile), as that process's entries.

        ``intent`` (the command's ``tool``, ``command``, ``call_id``, ``subtask_id``) says
        a command is about to run: the reserve is checked and the command's intent is
        opened before this returns (``token.intent``), so a crash before its
        ``after_shell`` leaves it to be reconciled. The caller should hold
        :attr:`mutations` from here to ``after_shell``. Raises ReserveError, sandbox and
        storage errors.
        """
        import time

        if intent is not None:
            self._core.check_reserve("the command")
        async with self._core.lock:
            await self._settle(sandbox)
            if not await self._shell.ready():
                await self._shell.build(sandbox)
            elif pending is not None:
                await self._shell.sync(sandbox, attribute, result=pending)
            elif not piggyback or self._shell.scan_request() is None or attribute is not None:
                await self._shell.sync(sandbox, attribute)
            scan = self._shell.scan_request() if piggyback else None
            opened = None if intent is None else self._core.intents.start("command", intent, ts=time.time())
        return ShellToken(started=time.time(), baseline_ready=True, scan=scan, intent=opened)

    async def sync_background(self, sandbox: Sandbox, record: dict[str, Any]) -> list[str]:
        """Record what changed since the last scan as ``record``'s (a background process
        that ran meanwhile: ``tool``, ``command``, ``call_id``, ``subtask_id``); return the
        changed paths. Raises sandbox and storage errors."""
        async with self._core.mutations, self._core.lock:
            await self._settle(sandbox)
            if not await self._shell.ready():
                await self._shell.build(sandbox)
                return []
            return await self._shell.sync(sandbox, record)

    async def after_shell(
        self,
        sandbox: Sandbox,
        token: object,
        *,
        tool: str = "shell_execute",
        command: str = "",
        call_id: str | None = None,
        subtask_id: str | None = None,
        result: ExecResult | None = None,
    ) -> list[str]:
        """Record every file the command created, modified or deleted; return their paths.
        ``result`` is the command's result: its ``scan_after`` is used when the scan was
        sent along with it. Closes the command's intent once its changes are recorded.

        Raises ChangesNotRecordedError when the command ran but storage failed (its
        intent stays open: its changes are recorded, as its own and marked interrupted,
        at the next use of the changelog that storage allows), sandbox errors (the
        intent likewise stays open for the next use).
        """
        record: dict[str, Any] = {
            "tool": tool,
            "command": command,
            "call_id": call_id,
            "subtask_id": subtask_id,
        }
        intent = token.intent if isinstance(token, ShellToken) else None
        piggybacked = isinstance(token, ShellToken) and token.scan is not None
        scanned = result.scan_after if result is not None and piggybacked else None
        async with self._core.lock:
            try:
                if not await self._shell.ready():
                    await self._shell.build(sandbox)
                    changed: list[str] = []
                else:
                    changed = await self._shell.sync(sandbox, record, result=scanned)
            except ChangelogStorageError as e:
                if intent is not None:
                    self._core.intents.abandon(intent)
                ran = "" if result is None else f" (exit code {result.exit_code})"
                raise ChangesNotRecordedError(
                    f"the command ran{ran}, but the changelog could not record its changes yet ({e}); they are "
                    "kept and recorded as this command's, marked interrupted, at the next call storage allows"
                ) from e
            except BaseException:
                if intent is not None:
                    self._core.intents.abandon(intent)
                raise
            faults.point("command.recorded")
            if intent is not None:
                self._core.intents.end(intent)
            return changed

    # -- log / diff / summary --------------------------------------------------------------

    async def log(
        self,
        *,
        path: str | None = None,
        call_id: str | None = None,
        subtask_id: str | None = None,
        limit: int | None = None,
        call_group: str | None = None,
    ) -> list[Entry]:
        """Entries, oldest first, optionally filtered; ``call_group`` is a call id and its
        turns (``<id>.t<N>``, an agent run's groups). Raises ChangelogStorageError."""
        where: list[str] = ["1"]
        params: list[Any] = []
        for col, val in (("path", path), ("call_id", call_id), ("subtask_id", subtask_id)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        if call_group is not None:
            where.append("(call_id = ? OR substr(call_id, 1, ?) = ?)")
            params += [call_group, len(call_group) + 2, call_group + ".t"]
        found = await self._core.db(self._core.store.entries, " AND ".join(where), params)
        return found[-limit:] if limit else found

    async def groups(self, *, limit: int | None = None) -> list[Group]:
        """The changes grouped by call (:mod:`.groups`), oldest first; the last ``limit``.
        Raises ChangelogStorageError."""
        found = group(await self.log())
        return found[-limit:] if limit else found

    async def entry(self, entry_id: int) -> Entry | None:
        return await self._core.db(self._core.store.entry, entry_id)

    async def members(self, entry_id: int) -> list[str]:
        """The paths a group entry stands for, sorted ([] for another entry). Raises
        EntryNotFoundError for an unknown id, ChangelogStorageError."""
        if await self.entry(entry_id) is None:
            raise EntryNotFoundError(f"no changelog entry matches id {entry_id}")
        return [p for p, _t in await self._core.db(self._core.store.members, entry_id)]

    async def blob(self, digest: str) -> bytes | None:
        """The content stored under ``digest`` (a before- or after-image; a symlink's
        target), None when not kept. Raises ChangelogStorageError."""
        data: bytes | None = await self._core.db(self._core.store.get_blob, digest)
        return data

    async def summary(self) -> Summary:
        """Net created/modified/deleted/renamed paths. Raises ChangelogStorageError."""
        return summarize(await self.log())

    async def diff(self, sandbox: Sandbox, path: str | None = None) -> str:
        """Unified diff, per path, from its first recorded before-image to its content now.

        Raises ChangelogStorageError, sandbox infrastructure errors.
        """
        # Directories (made or removed by a command) have no content to diff.
        firsts = first_before(e for e in await self.log() if "dir" not in (e.before_kind, e.after_kind))
        out = []
        for p, e in sorted(firsts.items()):
            if (path is not None and p != path) or not is_safe_relpath(p):
                continue
            old: Content
            if e.path == p and e.before_kind is not None:
                blob = await self._core.db(self._core.store.get_blob, e.before_hash) if e.before_hash else None
                old = blob if blob is not None else f"({e.before_kind}; before-image not kept)"
            elif e.path == p or e.new_path == p:
                old = None
            now = await read_now(sandbox, p, self._core.limits.max_file_bytes)
            out.append(unified(p, old, now))
        # Trees and groups: what was made there, counted, as ``diff -r`` says "Only in".
        for e in await self.log():
            if e.tree_files is None or e.op != "create" or e.reverted or e.state != "applied":
                continue
            if path is not None and not (e.path == path or e.path.startswith(path + "/")):
                continue
            where = e.path + "/" if e.is_tree else e.path + "/*"
            out.append(f"Only in b: {quote_path(where)} ({e.describe()}; entry {e.id}, content not shown)\n")
        return "".join(out)

    async def changes(
        self, *, entry: int | None = None, call_id: str | None = None, subtask_id: str | None = None
    ) -> str:
        """The diff of what one entry, a call or a subtask changed, each entry from its
        recorded before-image to its recorded after-image (not the files now: see
        :meth:`diff`). Raises ValueError (not exactly one selector), EntryNotFoundError,
        ChangelogStorageError."""
        if sum(x is not None for x in (entry, call_id, subtask_id)) != 1:
            raise ValueError("give exactly one of entry, call_id, subtask_id")
        if entry is not None:
            found = await self.entry(entry)
            if found is None:
                raise EntryNotFoundError(f"no changelog entry matches id {entry}")
            entries = [found]
        else:
            entries = await self.log(call_id=call_id, subtask_id=subtask_id)
            if not entries:
                what = f"call {call_id}" if call_id is not None else f"subtask {subtask_id}"
                raise EntryNotFoundError(f"no changelog entry matches {what}")

        async def get_blob(sha: str) -> bytes | None:
            blob: bytes | None = await self._core.db(self._core.store.get_blob, sha)
            return blob

        return await entries_diff(entries, get_blob)

    # -- undo --------------------------------------------------------------------------

    async def undo(
        self,
        sandbox: Sandbox,
        *,
        entry: int | None = None,
        call_id: str | None = None,
        subtask_id: str | None = None,
        to: int | None = None,
        all: bool = False,
        last: int | None = None,
        dry_run: bool = False,
        force: bool = False,
        undo_call_id: str | None = None,
    ) -> UndoResult:
        """Revert entries, newest first: one ``entry``, a ``call_id``, a ``subtask_id``,
        everything after entry ``to`` (the workspace returns to its state right after
        ``to``; ``to=0`` reverts everything), ``all``, or the ``last`` N groups not yet
        reverted (:mod:`.groups`: a call's entries, one of an agent's turns).

        Idempotent. ``dry_run`` changes nothing and returns the diff it would apply.
        Raises ValueError (not exactly one selector), EntryNotFoundError,
        UndoConflictError (files changed since; nothing written unless ``force``),
        UndoRefusedError (tampered entry), ChangelogStorageError, sandbox infrastructure
        errors. A refusal by the agent for one entry is a ``failed`` step in the result.
        """
        async with self._core.mutations, self._core.lock:
            await self._settle(sandbox)
            if last is not None:
                if any(x is not None for x in (entry, call_id, subtask_id, to)) or all:
                    raise ValueError("give exactly one of entry, call_id, subtask_id, to, all, last")
                targets = await self._core.db(select_last, self._core, last)
            else:
                targets = await self._core.db(
                    select, self._core, entry=entry, call_id=call_id, subtask_id=subtask_id, to=to, everything=all
                )
            return await undo(self._core, sandbox, targets, dry_run=dry_run, force=force, undo_call_id=undo_call_id)

    # -- restore and lineage (snapshots) ------------------------------------------------

    async def restore(self, sandbox: Sandbox, tree: Path, *, call_id: str, note: str, dry_run: bool = False) -> Plan:
        """Make the workspace a copy of ``tree`` (a host directory no sandbox reaches: a
        snapshot's), recording every change as an entry of ``call_id`` (tool ``restore``)
        with its before-image, so ``undo(call_id=...)`` gives the state before it back.
        ``dry_run`` changes nothing and fills ``Plan.diff``. Raises sandbox and storage
        errors, OSError reading ``tree``; a path the agent refuses is in ``Plan.failed``."""
        async with self._core.mutations, self._core.lock:
            await self._settle(sandbox)
            return await Restorer(self._core, self._shell, sandbox, tree).run(
                call_id=call_id, note=note, dry_run=dry_run
            )

    async def last_entry(self) -> int:
        """The id of the newest entry (0: none). Raises ChangelogStorageError."""
        rows = await self._core.db(self._core.store.query, "SELECT COALESCE(MAX(id), 0) FROM entries")
        return int(rows[0][0])

    async def origin(self) -> dict[str, Any] | None:
        """Where this changelog's history starts when its workspace is a fork (the
        snapshot, its workspace, and that changelog's entry then), else None."""
        return await asyncio.to_thread(_read_origin, self._core.root)

    @staticmethod
    def start_at(data_dir: Path, workspace: Path, origin: dict[str, Any]) -> None:
        """Say that the history of a new workspace (a fork) starts at a snapshot (see
        :meth:`origin`): a small file beside its changelog, written before its first
        entry (a database per fork would cost a few fsyncs each). Blocking. Raises
        OSError."""
        root = workspace_dir(Path(data_dir), Path(workspace))
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        (root / ORIGIN_FILE).write_text(json.dumps(origin, sort_keys=True) + "\n")
