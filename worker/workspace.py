"""``Workspace``: one host directory's sandbox plus the recorder of its changes.

Tools never write workspace files themselves: :meth:`Workspace.write` hands the bytes to
the :class:`ChangeRecorder`, which records the before-image (read through the sandbox)
and then writes through the sandbox; :meth:`Workspace.run_shell` brackets a command with
``before_shell``/``after_shell`` so the recorder can tell which files it changed.

Mutations of one workspace (writes and shell commands) are serialized by one lock, so a
change seen after a command is the command's and not a concurrent write's. Reads, lists
and searches do not take it. A tool that reads a file and then writes it (``edit_file``)
also holds the file's path (:meth:`Workspace.hold`, :mod:`worker.pathlocks`) from the read
to the write, so concurrent mutations of one path take turns instead of conflicting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from sandbox.base import (
    ExecControl,
    ExecRequest,
    ExecResult,
    OutputCallback,
    ProcessInfo,
    Sandbox,
    ScanFirst,
    WriteResult,
)
from sandbox.capabilities import background, terminals
from sandbox.errors import SandboxError
from sandbox.kernels import KernelInfo
from sandbox.logs import get_logger

from . import faults, lockwait
from .background import Background, BackgroundLimits, Started, new_process_id
from .changelog.intents import release
from .guard import Action, WorkspaceGuard
from .pathlocks import PathLocks
from .recorders import ChangeRecorder, KeepsReserve, NullRecorder, ScanToken, scan_token

T = TypeVar("T")
S = TypeVar("S", bound="ProcessInfo | KernelInfo")


log = get_logger("worker.workspace")

__all__ = ["ChangeRecorder", "NullRecorder", "ScanToken", "Workspace", "scan_token"]


#: Seconds between the guard's looks while a background process may still change files (what
#: it plants is undone within about that long, not only at the next call).
GUARD_WATCH_EVERY = 1.0
#: Content remembered per workspace for edits (see :meth:`Workspace.known`).
KNOWN_MAX_FILES = 64
KNOWN_MAX_BYTES = 2 << 20  # per workspace; a file over an eighth of it is not kept


class Workspace:
    """One workspace directory (``root``, a real host path), its sandbox and its recorder."""

    def __init__(
        self,
        root: Path,
        sandbox: Sandbox,
        recorder: ChangeRecorder | None = None,
        background: Background | None = None,
        mutation_lock: AbstractAsyncContextManager[Any] | None = None,
        guard: WorkspaceGuard | None = None,
    ) -> None:
        """``mutation_lock``: held across each mutation (the changelog's, which other
        processes on the same workspace take too); default an in-process lock."""
        self.root = root
        self.sandbox = sandbox
        #: The host's check after every change (see :mod:`worker.guard`); its trust is
        #: taken before the first call runs anything.
        self.guard = guard if guard is not None else WorkspaceGuard(root)
        self._guard_ready = False
        self._watcher: asyncio.Task[None] | None = None
        self.recorder: ChangeRecorder = recorder if recorder is not None else NullRecorder()
        #: The background processes the changelog attributes changes to (None: not tracked).
        self.background = background
        self._mutation_lock: AbstractAsyncContextManager[Any] = (
            mutation_lock if mutation_lock is not None else asyncio.Lock()
        )
        self._paths = PathLocks(root)
        self._known: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self._known_bytes = 0
        # Paths whose remembered content is what this worker itself last wrote there (so
        # the changelog holds it): a write's before-image is guessed from those only.
        self._written: set[str] = set()

    # -- the host's guard -------------------------------------------------------------------

    async def _guard_first(self) -> None:
        """Before the first change: the guard's first look (what is there is the owner's)."""
        if not self._guard_ready:
            await self.check()
            self._guard_ready = True

    @contextlib.asynccontextmanager
    async def mutating(self, written: str | None = None) -> AsyncIterator[None]:
        """Hold the workspace's mutation lock for a change; the host's guard looks at the
        workspace before the first change and after every one, also one that failed.
        ``written``: the change is the content of that one file (a tool's write, which
        keeps the file's mode and makes a new one 0644): the guard looks only when git
        could read that path (:meth:`WorkspaceGuard.concerns`), so an edit stays cheap."""
        async with contextlib.AsyncExitStack() as held:
            with lockwait.waiting():  # (another call's change, maybe another process's)
                await held.enter_async_context(self._mutation_lock)
            await self._guard_first()
            try:
                yield
            finally:
                if written is None or self.guard.concerns(written):
                    await self.check()
                else:
                    self.guard.last = []
                self._watch_background()

    def _watch_background(self) -> None:
        """While a background process may still change files, the guard looks every
        GUARD_WATCH_EVERY seconds (its own task, ended by :meth:`aclose`)."""
        bg = self.background
        if bg is None or (self._watcher is not None and not self._watcher.done()):
            return
        if not bg.index.pending():  # (one stat of the index when it did not change)
            return
        self._watcher = asyncio.get_running_loop().create_task(self._watch(bg), name=f"guard {self.root}")

    async def _watch(self, bg: Background) -> None:
        while await asyncio.to_thread(bg.index.pending):
            await asyncio.sleep(GUARD_WATCH_EVERY)
            if not self.root.is_dir():
                return
            async with self._mutation_lock:
                await self.check()

    async def aclose(self) -> None:
        """Stop the guard's watch of background processes (the workspace is dropped)."""
        task, self._watcher = self._watcher, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def check(self) -> list[Action]:
        """Run the host's guard over the workspace now (after anything that changed it outside
        the methods here: an undo, a snapshot's restore, a harness's write). Returns what it
        changed; a workspace it cannot read is logged, not raised (the next check retries)."""
        try:
            return await self.guard.check_soon()
        except OSError as e:
            log.error("workspace.guard_failed", workspace=str(self.root), error=str(e))
            return []

    # -- remembered content ----------------------------------------------------------------
    #
    # What this worker last wrote (or wholly read) per file, so an edit can start from it
    # instead of reading the file again: one round trip fewer on the commonest mutation.
    # It is only ever a guess: the write it leads to is conditional on exactly that hash
    # (checked by the agent right before the rename), and the edit tool re-reads and
    # starts over on any doubt. Nothing here is read from the host's copy of the files.

    def check_reserve(self, what: str) -> None:
        """Refuse ``what`` now when the changelog could not record its changes for want of
        room (its ``reserve_bytes``); a no-op for a recorder without a reserve (none, or one
        of another make). Every recorded change checks this itself: this is for a caller
        that answers before the change starts (a stream's status). Raises ReserveError,
        ChangelogStorageError."""
        if isinstance(self.recorder, KeepsReserve):  # (not in the ChangeRecorder protocol)
            self.recorder.check_reserve(what)

    def known(self, path: str) -> tuple[bytes, str] | None:
        """The content and sha256 last seen at workspace-relative ``path``, if remembered."""
        item = self._known.get(path)
        if item is not None:
            self._known.move_to_end(path)
        return item

    def remember(self, path: str, data: bytes, sha256: str) -> None:
        self.forget([path])
        self._written.discard(path)
        if len(data) > KNOWN_MAX_BYTES // 8:
            return
        self._known[path] = (data, sha256)
        self._known_bytes += len(data)
        while len(self._known) > KNOWN_MAX_FILES or self._known_bytes > KNOWN_MAX_BYTES:
            p, (old, _s) = self._known.popitem(last=False)
            self._known_bytes -= len(old)
            self._written.discard(p)

    def forget(self, paths: list[str] | None = None) -> None:
        """Drop what is remembered about ``paths`` (None: everything)."""
        if paths is None:
            self._known.clear()
            self._known_bytes = 0
            self._written.clear()
            return
        for p in paths:
            item = self._known.pop(p, None)
            if item is not None:
                self._known_bytes -= len(item[0])
            self._written.discard(p)

    def hold(self, path: str) -> AbstractAsyncContextManager[None]:
        """Hold workspace-relative ``path`` while a tool reads and then changes it: other
        holders of the same file (also through a symlink inside the workspace), of a
        directory above it or of a path below it wait, in arrival order; unrelated paths
        do not. Not reentrant. Shell commands do not take it (for an edit, a command that
        changes its file between its read and its write is a change from outside)."""
        return self._paths.hold(path)

    async def write(
        self,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None = None,
        expect_absent: bool = False,
        tool: str,
        call_id: str | None = None,
        subtask_id: str | None = None,
    ) -> WriteResult:
        """Write ``data`` to workspace-relative ``path`` through the recorder.

        Raises ConflictError, PathEscapeError, NotAFileError, TooLargeError and the
        sandbox's infrastructure errors.
        """
        async with self.mutating(written=path):
            extra: dict[str, Any] = {}
            if expect_sha256 is None and not expect_absent and path in self._written:
                # What this worker last wrote there: if the file still holds it, the
                # recorder need not read the file for its before-image (one round trip).
                extra["guess_sha256"] = self._known[path][1]
            self.forget([path])
            result = await self.recorder.write(
                self.sandbox,
                path,
                data,
                expect_sha256=expect_sha256,
                expect_absent=expect_absent,
                tool=tool,
                call_id=call_id,
                subtask_id=subtask_id,
                **extra,
            )
            self.remember(path, data, result.sha256)
            if path in self._known:
                self._written.add(path)
            return result

    async def run_shell(
        self,
        request: ExecRequest,
        *,
        tool: str = "shell_execute",
        call_id: str | None = None,
        subtask_id: str | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> tuple[ExecResult, list[str]]:
        """Run ``request`` in the sandbox (``Sandbox.exec``; its ``scan`` is this
        workspace's own to set); returns its result and the paths it changed.
        ``on_output`` gets its output as it happens, ``control`` signals it.

        Raises PathNotFoundError/PathEscapeError for ``cwd`` and infrastructure errors
        from the recorder's snapshots. A sandbox lost mid-command is reported in the
        result (``outcome="sandbox_lost"``), not raised.
        """
        command = request.command
        async with self.mutating():
            # Changes a background process made since the last scan are its own entries.
            bg = await self.background.attribution(self.sandbox) if self.background is not None else None
            attribute = bg.record if bg is not None else None
            # (passed only when there is one: a recorder of our protocol's first version
            # takes no such argument)
            extra: dict[str, Any] = {"attribute": attribute} if attribute is not None else {}
            # A command as another user runs in another agent: the scans, which belong to
            # this one's snapshot, are made around it instead of travelling with it.
            piggyback = request.user is None
            intent = {"tool": tool, "command": command, "call_id": call_id, "subtask_id": subtask_id}
            token = await self.recorder.before_shell(self.sandbox, piggyback=piggyback, intent=intent, **extra)
            if bg is not None and self.background is not None:
                self.background.settled(bg)
            faults.point("command.started")
            try:
                result, token = await self._exec_scanned(request, token, piggyback, extra, on_output, control)
            except BaseException:
                # The command may have run: its intent is left to the next use of the
                # changelog, which records what changed as this call's.
                opened = scan_token(token)
                release(opened.intent if opened is not None else None)
                self.forget(None)
                raise
            faults.point("command.ran")
            try:
                changed = await self.recorder.after_shell(
                    self.sandbox,
                    token,
                    tool=tool,
                    command=command,
                    call_id=call_id,
                    subtask_id=subtask_id,
                    result=result,
                )
            except SandboxError:
                self.forget(None)
                if result.outcome != "sandbox_lost":
                    raise
                # The box died with the command; its result already says so, and the
                # recorder's next snapshot will see whatever the command changed.
                changed = []
            except BaseException:
                self.forget(None)
                raise
            self._forget_changed(changed)
            return result, sorted(set(changed))

    async def _exec_scanned(
        self,
        request: ExecRequest,
        token: object,
        piggyback: bool,
        extra: dict[str, Any],
        on_output: OutputCallback | None,
        control: ExecControl | None,
    ) -> tuple[ExecResult, object]:
        """Send the command, the recorder's scans travelling with it when they can (one
        round trip); a scan the agent refuses (the tree changed from outside since the
        last one) is recorded first and the command sent again. Returns its result and the
        token to finish with. Raises what ``Sandbox.exec`` raises."""
        for attempt in range(3):
            st = scan_token(token)
            scan = st.scan if st is not None and attempt < 2 and piggyback else None
            try:
                sent = request if scan is None and request.scan is None else replace(request, scan=scan)
                return await self.sandbox.exec(sent, on_output=on_output, control=control), token
            except ScanFirst as e:  # changed from outside since the last scan: record that first
                opened = st.intent if st is not None else None
                token = await self.recorder.before_shell(self.sandbox, piggyback=attempt < 1, pending=e.scan, **extra)
                st = scan_token(token)
                if opened is not None and st is not None:  # the same command, sent again
                    st.intent = opened
        raise AssertionError("unreachable: the third attempt sends no scan")

    def _forget_changed(self, changed: list[str]) -> None:
        """After a command: forget what it changed, as the recorder saw it; everything when
        the recorder does not look (the remembered content is only ever a guess, see
        :meth:`known`, so a change it missed costs a retry, never a wrong result)."""
        if isinstance(self.recorder, NullRecorder):
            self.forget(None)
        else:
            self.forget(changed)

    async def run_recorded(
        self,
        command: str,
        run: Callable[[], Awaitable[T]],
        *,
        tool: str,
        call_id: str | None = None,
        subtask_id: str | None = None,
    ) -> tuple[T, list[str]]:
        """Await ``run()`` (something that changes files by running ``command`` another
        way than :meth:`run_shell`: a persistent shell's command) bracketed like a shell
        command: under the mutation lock, what background processes changed before is
        theirs, what changed while it ran is recorded as ``call_id``'s. Returns its value
        and the changed paths. Raises what ``run`` raises (its changes are recorded
        first) and the recorder's errors."""
        async with self.mutating():
            bg = await self.background.attribution(self.sandbox) if self.background is not None else None
            extra: dict[str, Any] = {"attribute": bg.record} if bg is not None else {}
            intent = {"tool": tool, "command": command, "call_id": call_id, "subtask_id": subtask_id}
            token = await self.recorder.before_shell(self.sandbox, intent=intent, **extra)
            if bg is not None and self.background is not None:
                self.background.settled(bg)
            try:
                value = await run()
            finally:
                try:
                    changed = await self.recorder.after_shell(
                        self.sandbox, token, tool=tool, command=command, call_id=call_id, subtask_id=subtask_id
                    )
                except BaseException:
                    self.forget(None)
                    raise
                self._forget_changed(changed)
            return value, sorted(set(changed))

    # -- background processes ---------------------------------------------------------------

    async def start_background(
        self,
        command: str,
        *,
        cwd: str = ".",
        timeout: float,
        call_id: str | None = None,
        subtask_id: str | None = None,
        process_id: str | None = None,
        idle: float = 0.0,
        env: dict[str, str] | None = None,
    ) -> ProcessInfo:
        """Start ``command`` as a background process (see :mod:`worker.background`),
        named ``process_id`` (default: a new ``proc-`` id), ended after ``idle`` seconds
        without a reader or writer when given, with ``env`` on top of the sandbox's
        variables.

        Raises AgentError (code ``limit``: too many run; a bad cwd), infrastructure
        errors; NotImplementedError when the sandbox has none.
        """
        bg = self.background
        limits = bg.limits if bg is not None else BackgroundLimits()
        async with self.mutating():
            await self._baseline_for_a_process()
            process_id = process_id or new_process_id()
            extra: dict[str, Any] = {"idle": idle} if idle else {}
            info = await background(self.sandbox).start_process(
                process_id, command, cwd=cwd, timeout=timeout, env=env, max_running=limits.max_processes,
                linger=limits.linger, **extra,
            )  # fmt: skip
            self.forget(None)
            if bg is not None:
                bg.index.add(Started(process_id, command, info.started, call_id, subtask_id))
            return info

    async def _baseline_for_a_process(self) -> None:
        """(Holding the mutation lock, before a process starts) the baseline brought up to
        date: what the process changes from here on is its own, what others did theirs."""
        bg = self.background
        attr = await bg.attribution(self.sandbox) if bg is not None else None
        await self.recorder.before_shell(self.sandbox, attribute=attr.record if attr else None)
        if bg is not None and attr is not None:
            bg.settled(attr)

    async def start_owned(self, process_id: str, shown: str, start: Callable[[], Awaitable[S]]) -> S:
        """Start a background process that is not a command (a terminal, a code context's
        kernel) with ``start()``, named ``process_id`` (``shown`` so in the changelog):
        what it changes from here on is its own. Returns what ``start`` returns, raises
        what it raises."""
        async with self.mutating():
            await self._baseline_for_a_process()
            value = await start()
            self.forget(None)
            if self.background is not None:
                self.background.index.add(Started(process_id, shown, value.started))
            return value

    async def start_terminal(
        self,
        terminal_id: str,
        argv: list[str] | None,
        *,
        cols: int,
        rows: int,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        idle: float = 0.0,
        timeout: float,
        scrollback: int,
    ) -> ProcessInfo:
        """Start ``argv`` (None: a login shell) on a terminal, a background process named
        ``terminal_id`` (:mod:`worker.terminals`): what it changes from here on is its own.
        Raises what ``Terminals.start_terminal`` raises."""
        box = terminals(self.sandbox)
        limits = self.background.limits if self.background is not None else BackgroundLimits()
        return await self.start_owned(
            terminal_id,
            f"terminal: {' '.join(argv) if argv else 'login shell'}",
            lambda: box.start_terminal(
                terminal_id, argv, cols=cols, rows=rows, cwd=cwd, env=env, timeout=timeout, idle=idle,
                max_running=limits.max_processes, scrollback=scrollback, linger=limits.linger,
            ),
        )  # fmt: skip

    async def settle_background(self, *, prefer: str | None = None, turn: dict[str, str] | None = None) -> list[str]:
        """Record what background processes changed since the last scan (one ended, a terminal
        settled), as ``prefer``'s when it may have (``turn``: its ``call_id``/``tool``/``command``
        instead, :mod:`worker.agents.turns`); the changed paths. Raises the recorder's errors."""
        bg = self.background
        if bg is None:
            return []
        async with self.mutating():
            attr = await bg.attribution(self.sandbox, prefer=prefer, turn=turn)
            if attr is None:
                return []
            changed = await self.recorder.sync_background(self.sandbox, attr.record)
            bg.settled(attr)
            self.forget(None)
            return sorted(set(changed))
