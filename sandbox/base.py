"""The small async contract every sandbox backend implements, and the optional
capabilities a backend may have.

A :class:`Sandbox` is one workspace's box, and only what every backend must do: its
files (read, write, remove, mkdir, ...), ``exec`` (one :class:`ExecRequest`), scans and
hashes, ``info`` and ``close``. Every path argument is *workspace-relative*
(``"src/main.py"``, ``"."``); the authoritative check that it stays inside the workspace
happens in the in-container agent, never on the host. Lifecycle (start, reuse, restart,
stop, garbage collection) lives beside this contract in :class:`SandboxBackend`, not in it.
What the calls return is in :mod:`sandbox.results` (re-exported here).

What a sandbox may do beyond that (staged writes, background processes, tunnels, a
harness's files anywhere; a terminal or a kernel next) is a capability Protocol of
:mod:`sandbox.capabilities` (re-exported here); :func:`staged_writes` gives any sandbox
staged writes (on the host where it has none). What a backend may do beyond
:class:`SandboxBackend` is declared here, the same way: :class:`typing.Protocol` classes,
checked with ``isinstance``, never found by ``getattr``:

=============================  =================================================================
:class:`ConfigurableBackend`   ``configure(workspace, spec)``: a workspace's own spec
:class:`RuntimeInventory`      ``runtimes()``: the OCI runtimes the engine has
:class:`CpuInventory`          ``cpu_count()``: the CPUs the engine's host has
:class:`ImageInventory`        ``has_image(image)``, ``ensure_image(image)``: is it there; get it (LOOM_PULL)
:class:`PullWatcher`           ``add_pull_listener(fn)``: every pull's progress
:class:`Freezer`               ``freeze(workspace, frozen)``: pause and resume a sandbox
:class:`StatusReporter`        ``status(workspace)``: a workspace's container now, never started
:class:`RestartCounter`        ``restarts``: sandboxes restarted after being lost
=============================  =================================================================

Every method may raise :class:`sandbox.errors.AgentError` subclasses (the model's
problem: missing file, path escape, conflict, ...) or the infrastructure errors of
:mod:`sandbox.errors` (``SandboxLostError``, ``SandboxTimeoutError``, ...).
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .capabilities import BackgroundProcesses, HarnessFiles, StagedWrites, Tunnels
from .results import (
    AgentInfo,
    EntryType,
    ExecRequest,
    ExecResult,
    FileStat,
    ListEntry,
    ListResult,
    Outcome,
    OutputChunk,
    PathRead,
    PathWrite,
    ProcessInfo,
    ProcessOutput,
    ReadResult,
    ScanEntry,
    ScanRequest,
    ScanResult,
    SearchMatch,
    SearchResult,
    StagedWrite,
    StreamName,
    TreeRemoval,
    WriteResult,
)

if TYPE_CHECKING:
    from .pulls import PullEvent
    from .spec import SandboxSpec

__all__ = [
    "DEFAULT_EXCLUDES",
    "AgentInfo",
    "BackgroundProcesses",
    "ConfigurableBackend",
    "CpuInventory",
    "EntryType",
    "ExecControl",
    "ExecRequest",
    "ExecResult",
    "FileStat",
    "HarnessFiles",
    "HostStaging",
    "ImageInventory",
    "ListEntry",
    "ListResult",
    "Outcome",
    "OutputCallback",
    "OutputChunk",
    "PathRead",
    "PathWrite",
    "ProcessInfo",
    "ProcessOutput",
    "PullWatcher",
    "ReadResult",
    "RestartCounter",
    "RuntimeInventory",
    "Sandbox",
    "SandboxBackend",
    "ScanEntry",
    "ScanFirst",
    "ScanRequest",
    "ScanResult",
    "SearchMatch",
    "SearchResult",
    "StagedWrite",
    "StagedWrites",
    "StatusReporter",
    "StreamName",
    "TreeRemoval",
    "Tunnels",
    "WriteResult",
    "staged_writes",
]

#: ``exec(request, on_output=...)``: called with each chunk of a command's output as it is read
#: in the sandbox, on the event loop, in order; it must not block.
OutputCallback = Callable[[StreamName, bytes], None]

#: Directory names skipped by list/search/scan unless the caller passes its own list.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    ".tox",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
)


class ExecControl:
    """A handle on one command while it runs, for its caller: :meth:`signal` passes a
    signal to its process group (a Ctrl-C, as a terminal would). Give it to
    ``exec(control=...)``; a signal sent before the command starts (it waits for the
    workspace) is delivered as it starts."""

    SIGNALS = (2, 9, 15)  # SIGINT, SIGKILL, SIGTERM

    def __init__(self) -> None:
        self._send: Callable[[int], Coroutine[object, object, None]] | None = None
        self._pending: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def signal(self, sig: int) -> None:
        """Send ``sig`` (2, 9 or 15) to the command's process group now, or as soon as it
        starts. What it leaves running is killed when it ends, as always. Raises
        ValueError for another signal, SandboxLostError."""
        if sig not in self.SIGNALS:
            raise ValueError("signal must be 2 (SIGINT), 9 (SIGKILL) or 15 (SIGTERM)")
        if self._send is None:
            self._pending = 9 if 9 in (sig, self._pending) else sig
            return
        await self._send(sig)

    def bind(self, send: Callable[[int], Coroutine[object, object, None]] | None) -> None:
        """For sandboxes: where signals go while the command runs (None once it ended)."""
        self._send = send
        if send is not None and self._pending is not None:
            sig, self._pending = self._pending, None
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(send(sig))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


class ScanFirst(Exception):
    """``exec`` with ``ExecRequest.scan`` found changes made before the command: nothing was run. The
    caller records ``scan`` (its ``generation`` is the new ``since``) and runs again."""

    def __init__(self, scan: ScanResult) -> None:
        super().__init__("the workspace changed before the command; scan first")
        self.scan = scan


class Sandbox(abc.ABC):
    """One workspace's sandbox. Safe to call concurrently from one event loop."""

    workspace: Path
    #: Where the workspace is seen inside the sandbox (what a command's ``pwd`` says in
    #: it, and what an absolute path of :meth:`read_path` names it by).
    workspace_mount: str = "/workspace"

    @abc.abstractmethod
    async def read(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        line_range: tuple[int, int] | None = None,
        max_bytes: int = 1 << 20,
    ) -> ReadResult:
        """Read a regular file (never a FIFO/device; never through a link out).

        ``line_range`` is 1-based inclusive; ``max_bytes`` caps what is returned.
        Raises PathNotFoundError, NotAFileError, PathEscapeError.
        """

    @abc.abstractmethod
    async def write(
        self,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None = None,
        expect_absent: bool = False,
        mkdirs: bool = True,
        fsync: bool = True,
        mode: int | None = None,
        override_mode: bool = False,
    ) -> WriteResult:
        """Atomically replace ``path`` (temp file, fsync, rename), creating parents.

        An existing file keeps its permissions; a new one gets ``mode`` (permission bits,
        e.g. an undone deletion of an executable), else 0o666 less the umask. An existing
        file the sandbox's user may not write (0444) is refused as its shell would refuse
        it (PermissionDeniedError), unless ``override_mode`` (undo putting back what a
        read-only file held).

        ``fsync=False`` keeps the atomicity (a reader or a killed process sees the old or
        the new file, never a torn one) but not durability across a power loss.

        ``expect_sha256`` / ``expect_absent`` make the write conditional on the current
        content. Raises ConflictError, NotAFileError (IsADirError), PermissionDeniedError,
        PathEscapeError, TooLargeError.
        """

    @abc.abstractmethod
    async def remove(self, path: str, *, expect_sha256: str | None = None) -> bool:
        """Delete a file (or an empty directory). Returns False if it was already absent.

        Raises ConflictError when ``expect_sha256`` does not match, PathEscapeError.
        """

    @abc.abstractmethod
    async def mkdir(self, path: str, *, mode: int | None = None) -> bool:
        """Create directory ``path`` and its missing parents. Returns False if it already
        existed as a directory. ``mode``: the new directory's permission bits, exactly
        (default: 0o777 less the umask).

        Raises ConflictError when something other than a directory is there,
        PathEscapeError.
        """

    @abc.abstractmethod
    async def remove_tree(self, path: str) -> TreeRemoval:
        """Remove ``path`` and, for a directory, everything in it, never following a link.
        Absent is not an error (``removed=False``).

        Raises ConflictError when something could not be removed (what was removed before
        that is gone), PathEscapeError.
        """

    @abc.abstractmethod
    async def chmod(self, path: str, mode: int) -> None:
        """Set the permission bits (``0..0o7777``) of a file or directory (never a link).

        Raises PathNotFoundError, NotAFileError (a symlink), AgentError (code
        ``permission``),
        PathEscapeError.
        """

    @abc.abstractmethod
    async def symlink(self, path: str, target: str) -> None:
        """Create the symlink ``path`` -> ``target`` (stored as given); ``path`` must be
        absent. Missing parents are made.

        Raises ConflictError when something is at ``path``, PathEscapeError.
        """

    @abc.abstractmethod
    async def stat(self, path: str) -> FileStat:
        """lstat ``path`` inside the workspace. Raises PathNotFoundError, PathEscapeError."""

    @abc.abstractmethod
    async def list(
        self,
        path: str = ".",
        *,
        depth: int = 2,
        exclude: tuple[str, ...] = DEFAULT_EXCLUDES,
        max_entries: int = 5000,
    ) -> ListResult:
        """Walk a directory without following links. Raises PathNotFoundError, NotADirError."""

    @abc.abstractmethod
    async def search(
        self,
        pattern: str,
        *,
        path: str = ".",
        glob: str | None = None,
        max_matches: int = 200,
        exclude: tuple[str, ...] = DEFAULT_EXCLUDES,
        ignore_case: bool = False,
        timeout: float = 30.0,
    ) -> SearchResult:
        """Regex search over files. ``pattern`` is always a pattern, never an option.

        Raises InvalidPatternError, PathNotFoundError, PathEscapeError.
        """

    @abc.abstractmethod
    async def exec(
        self,
        request: ExecRequest,
        *,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ExecResult:
        """Run ``request.command`` (``sh -c``, or ``request.argv`` directly, no shell)
        inside the workspace, as :class:`ExecRequest` says.

        Every process the command starts is killed when it ends or times out. A lost
        sandbox is reported as ``outcome="sandbox_lost"`` rather than raised, because the
        command may have had effects. Raises PathNotFoundError/PathEscapeError for ``cwd``.

        A command of any length runs (one too long for an argument of ``sh -c`` is handed
        to the shell in a private file). ``max_output`` (at most
        :data:`~sandbox.protocol.MAX_EXEC_OUTPUT`) is what is kept of each stream, head
        and tail (``truncated`` and the ``*_bytes`` totals say when more came);
        ``output_limit`` stops a command that prints more than that in all.

        The harness's options: ``stdin`` is the command's standard input (default
        ``/dev/null``; more than :data:`~sandbox.protocol.MAX_RAW_REQUEST` bytes is
        TooLargeError); ``user`` runs it as another user of the image (a name or
        ``uid[:gid]``; ``root`` only where the workspace allows it, else
        UserUnsupportedError; a user the image does not have is an ExecResult with
        ``launch_error="user"``, exit 126); ``any_cwd`` lets ``cwd`` be any absolute
        directory of the sandbox, entered as its shell would enter it (a failure is
        ``launch_error="cwd"``). A program that cannot start is an ExecResult with
        ``launch_error`` set, not an exception.

        With ``scan`` the snapshot scans that bracket a command travel with it (one round
        trip instead of three): the agent scans first and runs the command only if nothing
        changed since ``scan.since``, otherwise it raises :class:`ScanFirst` carrying that
        scan, without running anything; after the command it scans again into
        ``ExecResult.scan_after``.

        With ``on_output`` the command's output is also handed over as the sandbox reads
        it (:data:`OutputCallback`), every chunk before this returns; the result still
        holds the capped capture (``max_output``). ``control`` lets the caller signal the
        command while it runs (:class:`ExecControl`). Raises ProtocolError for an answer
        that fails its checks (:func:`sandbox.answers.exec_result`).
        """

    async def exec_stream(
        self, request: ExecRequest, *, control: ExecControl | None = None
    ) -> AsyncIterator[OutputChunk | ExecResult]:
        """:meth:`exec` as an async iterator: each :class:`OutputChunk` as the command
        writes it, then the :class:`ExecResult` (last). Raises what :meth:`exec` raises.

        The chunks wait in memory until they are read: read them as they come, or use
        ``exec(on_output=...)`` to decide what to keep. Leaving the iterator early does
        not stop the command; it runs to its end (or timeout) in the background.
        """
        queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()

        def on_output(stream: StreamName, data: bytes) -> None:
            queue.put_nowait(OutputChunk(stream, data))

        task = asyncio.ensure_future(self.exec(request, on_output=on_output, control=control))
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        try:
            while (item := await queue.get()) is not None:
                yield item
            yield task.result()
        finally:
            if not task.done():
                _BACKGROUND.add(task)
                task.add_done_callback(_BACKGROUND.discard)

    @abc.abstractmethod
    async def scan(
        self,
        path: str = ".",
        *,
        exclude: tuple[str, ...] = (),
        max_files: int = 100_000,
        snapshot: str | None = None,
        since: str | None = None,
        timeout: float = 60.0,
        walk: bool = False,
    ) -> ScanResult:
        """Stat-only walk (no link following) for change detection.

        With ``snapshot`` the agent remembers this walk; a later scan with the same key
        and ``since`` equal to the returned ``generation`` returns only the differences,
        found from change events where the agent watches the tree (``watched``), else by
        walking it again. ``walk=True`` forces the walk (a verification).
        """

    @abc.abstractmethod
    async def hash(self, paths: builtins.list[str]) -> dict[str, str | None]:
        """sha256 of each regular file (None when absent or not a regular file)."""

    @abc.abstractmethod
    async def info(self) -> AgentInfo:
        """What the agent reports about itself (uid, kernel, capabilities)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close this process's connection (the container may live on for reuse)."""

    def warm(self) -> None:  # noqa: B027 (optional: a no-op where nothing starts)
        """Start the sandbox (or its connection) in the background; the first call waits
        for it or sees why it failed. Never raises; a no-op by default."""


#: Commands whose stream reader left early, kept referenced until they end.
_BACKGROUND: set[asyncio.Future[ExecResult]] = set()


class SandboxBackend(abc.ABC):
    """Gives out one :class:`Sandbox` per workspace directory and owns their lifecycle."""

    @abc.abstractmethod
    async def get(self, workspace: Path) -> Sandbox:
        """The sandbox for ``workspace`` (real path), started on first use.

        Raises SandboxUnavailableError subclasses.
        """

    @abc.abstractmethod
    async def stop(self, workspace: Path) -> bool:
        """Stop and remove the workspace's sandbox. Returns False if none was running."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close every connection this backend opened (containers stay for reuse)."""


# -- optional capabilities of a backend ----------------------------------------------------


@runtime_checkable
class ConfigurableBackend(Protocol):
    """A backend that makes each workspace's sandbox with a spec of its own."""

    async def configure(self, workspace: Path, spec: SandboxSpec | None) -> bool:
        """Make ``workspace``'s sandbox with ``spec`` from now on (None: the backend's
        default); a running one made otherwise is replaced at its next use. Returns True
        when the spec changed."""
        ...


@runtime_checkable
class RuntimeInventory(Protocol):
    """A backend that can say which OCI runtimes (``runc``, ``runsc``) it may use."""

    async def runtimes(self) -> set[str]:
        """The runtimes the engine has. Raises DaemonUnavailableError."""
        ...


@runtime_checkable
class CpuInventory(Protocol):
    """A backend that can say how many CPUs its engine has: a CPU limit above that is
    refused by the engine at every start, so settings refuse it first."""

    async def cpu_count(self) -> int:
        """The engine host's CPUs. Raises DaemonUnavailableError."""
        ...


@runtime_checkable
class ImageInventory(Protocol):
    """A backend that can say whether an image is at hand, and get it as its pull policy
    says (``LOOM_PULL``)."""

    async def has_image(self, image: str) -> bool:
        """Whether ``image`` is on the engine (nothing is pulled). Raises DaemonUnavailableError."""
        ...

    async def ensure_image(self, image: str) -> bool:
        """Make ``image`` be on the engine as the pull policy and the allowed registries say;
        True when it was pulled. Raises ImagePullError, ImageNotFoundError (missing, and the
        policy is ``never``), DaemonUnavailableError."""
        ...


@runtime_checkable
class Freezer(Protocol):
    """A backend that can pause a workspace's sandbox (every process in it) and resume it."""

    async def freeze(self, workspace: Path, frozen: bool) -> bool:
        """Pause (``frozen``) or resume the workspace's running sandbox; False when none
        runs. Raises DaemonUnavailableError."""
        ...


@runtime_checkable
class PullWatcher(Protocol):
    """A backend that tells listeners of every image pull it makes (the dashboard's view)."""

    def add_pull_listener(self, fn: Callable[[PullEvent], None]) -> Callable[[], None]:
        """Give ``fn`` every pull's progress; returns the function that stops it."""
        ...


@runtime_checkable
class StatusReporter(Protocol):
    """A backend that can report a workspace's sandbox without starting it."""

    async def status(self, workspace: Path, *, usage: bool = True) -> dict[str, Any] | None:
        """The workspace's sandbox now (``running``, image, runtime, limits; ``usage``: its CPU
        and memory, a slower look), or None when it has none. Raises DaemonUnavailableError."""
        ...


@runtime_checkable
class RestartCounter(Protocol):
    """A backend that counts the sandboxes it restarted after losing them."""

    restarts: int


# -- staged writes for any sandbox --------------------------------------------------------


def staged_writes(box: Sandbox) -> StagedWrites:
    """``box`` as :class:`StagedWrites`: itself when it stages writes, else one
    :class:`HostStaging` per sandbox (the content waits on the host; the write happens at
    commit, conditions and all). Never raises."""
    if isinstance(box, StagedWrites):
        return box
    staging = _HOST_STAGING.get(box)
    if staging is None:
        staging = _HOST_STAGING[box] = HostStaging(box)
    return staging


class HostStaging:
    """:class:`StagedWrites` for a sandbox without them: staged on the host, written at
    commit with :meth:`Sandbox.write <sandbox.base.Sandbox.write>`."""

    def __init__(self, box: Sandbox) -> None:
        self._box = box
        self._pending: dict[object, tuple[str, bytes, str | None, bool, bool, int | None, bool, bool]] = {}

    async def stage_write(
        self,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None = None,
        expect_absent: bool = False,
        fsync: bool = True,
        token: str | None = None,
        mode: int | None = None,
        override_mode: bool = False,
        mkdirs: bool = True,
    ) -> StagedWrite:
        st: FileStat | None
        try:
            st = await self._box.stat(path)
        except FileNotFoundError:
            st = None
        staged = StagedWrite(token=token or path, path=st.path if st else path, mode=st.mode if st else None)
        item = (staged.path, data, expect_sha256, expect_absent, fsync, mode, override_mode, mkdirs)
        self._pending[staged.token] = item
        return staged

    async def commit_write(
        self, staged: StagedWrite | str, *, expect_path: str | None = None, snapshot: str | None = None
    ) -> WriteResult:
        from .errors import AgentError, ConflictError

        token = staged.token if isinstance(staged, StagedWrite) else staged
        item = self._pending.pop(token, None)
        if item is None:
            raise AgentError(f"No staged write {token!r}", code="invalid")
        path, data, expect_sha256, expect_absent, fsync, mode, override, mkdirs = item
        if expect_path is not None and expect_path != path:
            raise ConflictError(f"Conflict: {path} is not {expect_path}", code="conflict")
        return await self._box.write(
            path,
            data,
            expect_sha256=expect_sha256,
            expect_absent=expect_absent,
            fsync=fsync,
            mode=mode,
            override_mode=override,
            mkdirs=mkdirs,
        )

    async def abort_write(self, staged: StagedWrite | str) -> None:
        token = staged.token if isinstance(staged, StagedWrite) else staged
        self._pending.pop(token, None)


#: Each sandbox's host-staged writes, as long as the sandbox lives.
_HOST_STAGING: weakref.WeakKeyDictionary[Sandbox, HostStaging] = weakref.WeakKeyDictionary()
