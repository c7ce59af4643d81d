"""What a sandbox may do beyond the :class:`~sandbox.base.Sandbox` contract, each as a
:class:`typing.Protocol` checked with ``isinstance`` where it is used, never found by
``getattr``:

=============================  =================================================================
:class:`StagedWrites`          ``stage_write``, ``commit_write``, ``abort_write``: a write in two
                               halves, so the changelog records it in between
:class:`BackgroundProcesses`   ``start_process``, ``process_output``/``_input``/``_kill``/
                               ``_release``, ``processes``: commands that outlive the call
:class:`Terminals`             ``start_terminal``, ``process_resize``/``_signal``,
                               ``attach_process``: processes on a pseudo-terminal, as a stream
:class:`Tunnels`               ``open_tunnel(port)``: a TCP connection to the sandbox's loopback
:class:`HarnessFiles`          ``read_path``, ``write_path``: files anywhere in the sandbox, as its
                               user (a harness's, not the model's)
:class:`HarnessTree`           ``stat_path``, ``list_path``, ``mkdir_path``, ``move_path``,
                               ``remove_path``, ``watch_path``, ``open_path``,
                               ``write_path_pieces``: directories anywhere, watched, and
                               large files in pieces (a harness's: E2B's envd)
:class:`CodeKernels`           ``start_kernel``, ``kernel_info``, ``kernel_session``,
                               ``stop_kernel``: code contexts' kernels (background processes
                               reached through a tunnel; :mod:`sandbox.kernels`)
=============================  =================================================================

The agent sandbox (:class:`sandbox.client.AgentSandbox`, and so every backend of this
package) has them all; mypy checks that in :mod:`sandbox.client`. A new capability (a
terminal, a kernel) is one more Protocol here and its implementation beside the agent
sandbox's; a backend without it is refused where it is used, by the helper of each
(:func:`background`, :func:`terminals`, :func:`tunnels`, :func:`harness_files`,
:func:`harness_tree`, :func:`code_kernels`), with the error the callers
already handle. Staged writes instead fall back to staging on the host, built on the core
contract (:func:`sandbox.base.staged_writes`), so the changelog records any sandbox.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .results import (
    PathEntry,
    PathRead,
    PathWrite,
    ProcessAttach,
    ProcessInfo,
    ProcessOutput,
    StagedWrite,
    WriteResult,
)

if TYPE_CHECKING:
    from .kernel_session import KernelInfo, KernelSession
    from .treeops import PathReader, PathWatch
    from .tunnel import Tunnel

__all__ = [
    "BackgroundProcesses",
    "CodeKernels",
    "HarnessFiles",
    "HarnessTree",
    "StagedWrites",
    "Tunnels",
    "background",
    "code_kernels",
    "harness_files",
    "harness_tree",
    "tunnels",
]


@runtime_checkable
class StagedWrites(Protocol):
    """A write in two halves: the content first, beside its target; then, after the
    caller recorded the change, in place (or dropped)."""

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
        """The first half of :meth:`Sandbox.write <sandbox.base.Sandbox.write>`: the new
        content written (and fsync'd) beside ``path``, not yet in place, so the caller
        can record the change meanwhile. Finish with :meth:`commit_write` (the conditions
        are checked again there) or :meth:`abort_write`. ``StagedWrite.path`` is the
        resolved path (in-workspace links followed). A caller-chosen ``token``
        (alphanumeric) lets it send the commit before this call has returned. ``mkdirs``
        as for ``write`` (the agent makes missing directories when staging). Raises like
        ``write``."""
        ...

    async def commit_write(
        self, staged: StagedWrite | str, *, expect_path: str | None = None, snapshot: str | None = None
    ) -> WriteResult:
        """Put a staged write (or the one staged under a token) in place if the target is
        still what it expected and, with ``expect_path``, resolves to that path.
        ``snapshot``: the key of the caller's scan snapshot (``Sandbox.scan``), when the
        caller records this write itself (the changelog): that snapshot's next scan then
        does not report the file it put there, only what changes it after. Raises
        ConflictError (nothing written), NotAFileError, AgentError for an unknown token
        (staged files live in the agent that staged them: a fresh connection has none),
        and infrastructure errors."""
        ...

    async def abort_write(self, staged: StagedWrite | str) -> None:
        """Drop a staged write (nothing changes in the workspace). Never raises for an
        unknown or already finished one."""
        ...


@runtime_checkable
class BackgroundProcesses(Protocol):
    """Commands that outlive the call that started them, read and written later."""

    async def start_process(
        self,
        process_id: str,
        command: str,
        *,
        cwd: str = ".",
        timeout: float = 3600.0,
        env: dict[str, str] | None = None,
        max_running: int = 8,
        head: int = 64 << 10,
        tail: int = 1 << 20,
        linger: float = 600.0,
        idle: float = 0.0,
    ) -> ProcessInfo:
        """Start ``sh -c command`` as a background process that outlives the call: it ends
        when it exits, at ``timeout`` (its whole tree killed), when nobody asked for its
        output or wrote to it for ``idle`` seconds (0: never; counted as a timeout), when
        killed, or with the sandbox. Its output is kept (per stream: the first ``head``
        and last ``tail`` bytes); after it ended, it can be read for ``linger`` seconds.

        Raises AgentError (code ``limit``: ``max_running`` already run; ``invalid``: a bad
        id or command), PathNotFoundError (cwd), infrastructure errors."""
        ...

    async def process_output(
        self,
        process_id: str,
        *,
        since: tuple[int, int] | None = None,
        wait: float = 0.0,
        max_bytes: int = 1 << 20,
    ) -> ProcessOutput:
        """What the process printed after cursor ``since`` (None: after the last read
        that passed none, and moves that mark; every worker process shares it), waiting
        up to ``wait`` seconds for something new (returns at once when there is). Raises
        AgentError (code ``not_found``: no such process here)."""
        ...

    async def process_input(self, process_id: str, data: bytes, *, eof: bool = False) -> int:
        """Write ``data`` to the process's stdin (``eof``: then close it). Returns the bytes
        written. Raises AgentError (``not_found``; ``conflict``: it no longer reads)."""
        ...

    async def process_kill(self, process_id: str, *, signal: int = 15, grace: float = 0.5) -> ProcessInfo:
        """``signal`` to everything the process started, ``grace`` seconds, then KILL.
        Returns its info (ended, unless it resisted for seconds). Raises AgentError."""
        ...

    async def process_release(self, process_id: str) -> None:
        """Let an ended process go (its output is no longer kept). Raises AgentError."""
        ...

    async def processes(self) -> builtins.list[ProcessInfo]:
        """The background processes of this sandbox, running or ended (within their
        linger time), oldest first."""
        ...


@runtime_checkable
class Terminals(Protocol):
    """Processes on a pseudo-terminal (a background process with a size and one output
    stream: what the terminal shows), reached as a byte stream."""

    async def start_terminal(
        self,
        process_id: str,
        argv: builtins.list[str] | None,
        *,
        cols: int,
        rows: int,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        timeout: float = 86_400.0,
        idle: float = 0.0,
        max_running: int = 8,
        scrollback: int = 256 << 10,
        linger: float = 600.0,
    ) -> ProcessInfo:
        """Start ``argv`` (None: the sandbox user's login shell) on a terminal of ``cols``
        by ``rows``, as a background process (it counts against ``max_running`` and ends as
        :meth:`BackgroundProcesses.start_process` says), with ``TERM`` and a UTF-8 locale
        set; its last ``scrollback`` bytes of output are kept for a client that attaches.

        Raises AgentError (``limit``, ``invalid``: a size outside 1-1000, ``not_found``:
        no shell in the image), PathNotFoundError (cwd), infrastructure errors."""
        ...

    async def process_resize(self, process_id: str, cols: int, rows: int) -> ProcessInfo:
        """Set a terminal's size (its foreground program gets ``SIGWINCH``). Raises
        AgentError (``not_found``; ``conflict``: not a terminal, a size out of range)."""
        ...

    async def process_signal(self, process_id: str, signal: int) -> ProcessInfo:
        """``signal`` to the process's foreground process group (a terminal's: the program
        running in it, as Ctrl-C would). Raises AgentError (``not_found``; ``conflict``:
        it has ended)."""
        ...

    async def attach_process(self, process_id: str, *, since: int | None = None) -> tuple[Tunnel, ProcessAttach]:
        """The process's byte stream: reading gives its output from offset ``since``
        (None: all it keeps) as it comes, and ends once it has ended and all was read;
        writing types into it. Several may be attached at once; closing one detaches it
        (the process goes on). Raises AgentError (``not_found``), infrastructure errors."""
        ...


@runtime_checkable
class Tunnels(Protocol):
    """TCP connections into the sandbox's own loopback."""

    async def open_tunnel(self, port: int) -> Tunnel:
        """A TCP connection to ``port`` on the sandbox's own loopback, carried by the
        channel to the agent (the sandbox still has no network interface), or the
        connection itself, handed over by the agent where it can (see
        :mod:`sandbox.handover`); both have ``read``, ``write``, ``write_eof``, ``close``.

        Raises AgentError (code ``connection_refused``) when nothing listens there,
        ValueError for a port outside 1-65535, and the infrastructure errors of any call.
        """
        ...


@runtime_checkable
class HarnessFiles(Protocol):
    """Files anywhere in the sandbox, read and written as its user (a harness's calls)."""

    async def read_path(self, path: str, *, max_bytes: int) -> PathRead:
        """Read the file at the absolute ``path`` anywhere in the sandbox, as the
        sandbox's user (links followed, as ``cat`` follows them; never a FIFO or device):
        at most ``max_bytes`` (``truncated`` when the file is larger). Large files come in
        pieces, checked to be of one unchanged file.

        Raises PathNotFoundError, PermissionDeniedError, IsADirError, NotAFileError,
        ConflictError (it kept changing while read)."""
        ...

    async def write_path(self, path: str, data: bytes, *, mode: int | None = None) -> PathWrite:
        """Write ``data`` to the absolute ``path`` as the sandbox's user: where it may
        write (``/tmp``, ``$HOME``; the root file system is read-only), parents made, an
        existing file rewritten in place as the shell's ``>`` would (a 0444 one refused),
        a new one with ``mode`` (default 0o666 less the umask). Nothing is recorded: this
        is the sandbox's scratch space.

        Raises InWorkspaceError (nothing written) when the target is in the workspace,
        whose changes go through its changelog: the caller writes it with
        ``Sandbox.write`` at the workspace-relative path the error carries. Raises
        PermissionDeniedError, IsADirError, NotAFileError, PathNotFoundError,
        TooLargeError."""
        ...


@runtime_checkable
class HarnessTree(Protocol):
    """Directories anywhere in the sandbox, as its user (a harness's calls: E2B's
    filesystem service), watched; and a large file read or written in pieces. Paths are
    absolute. A change inside the workspace is made only with ``in_workspace=True``, by a
    caller that records it (brackets it with the changelog's scans); without it, one that
    would touch the workspace, also through a link, raises InWorkspaceError and changes
    nothing."""

    async def stat_path(self, path: str) -> PathEntry:
        """The entry at ``path`` (a link described as itself, with its target's type).
        Raises PathNotFoundError, PermissionDeniedError."""
        ...

    async def list_path(self, path: str, *, depth: int = 1, limit: int = ...) -> builtins.list[PathEntry]:
        """The entries under directory ``path`` (links followed to it), ``depth`` levels
        down (1: its own), sorted depth first, never entering a linked directory. Raises
        PathNotFoundError, NotADirError, PermissionDeniedError, TooLargeError (more
        than ``limit`` entries)."""
        ...

    async def mkdir_path(self, path: str, *, in_workspace: bool = False) -> PathEntry:
        """Make directory ``path`` and its missing parents. Raises AgentError (code
        ``exists``: a directory is there; ``invalid``: something else is), NotADirError
        (a parent is a file), PermissionDeniedError, InWorkspaceError."""
        ...

    async def move_path(self, source: str, destination: str, *, in_workspace: bool = False) -> PathEntry:
        """Rename ``source`` to ``destination`` (parents made; a file there replaced;
        across file systems copied). Raises PathNotFoundError, AgentError (``exists``),
        PermissionDeniedError, InWorkspaceError."""
        ...

    async def remove_path(self, path: str, *, in_workspace: bool = False) -> bool:
        """Remove ``path`` and everything under it (a link, not its target); False when
        nothing was there. Raises PermissionDeniedError, AgentError (``invalid``: the
        workspace itself), InWorkspaceError."""
        ...

    async def watch_path(self, path: str, *, recursive: bool = False) -> PathWatch:
        """Watch directory ``path`` (inotify in the sandbox; ``recursive``: its
        subdirectories too, new ones as they come) until the watch is closed or the
        sandbox goes. Raises PathNotFoundError, NotADirError, AgentError (``limit``)."""
        ...

    async def open_path(self, path: str, *, piece: int = ...) -> PathReader:
        """The file at ``path`` to read in pieces of ``piece`` bytes (its first read now).
        Raises as :meth:`HarnessFiles.read_path`."""
        ...

    async def write_path_pieces(
        self, path: str, total: int, pieces: AsyncIterable[bytes], *, in_workspace: bool = False, piece: int = ...
    ) -> int:
        """Write ``total`` bytes from ``pieces`` to ``path`` (with ``in_workspace``: the
        workspace-relative path, put in place whole at the end), never holding more than
        a piece. Raises as :meth:`HarnessFiles.write_path`, ValueError for a size other
        than announced."""
        ...


@runtime_checkable
class CodeKernels(Protocol):
    """Code contexts' kernels: each a background process (a bridge to a Jupyter kernel, run
    by the image's python3) named by its context's id, reached through a tunnel."""

    async def start_kernel(
        self,
        context_id: str,
        language: str,
        *,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        max_running: int = 8,
        linger: float = 600.0,
        timeout: float = 86_400.0,
    ) -> KernelInfo:
        """Start a kernel of ``language`` (``python``) as background process ``context_id``
        in ``cwd`` (relative to the workspace) with ``env`` on top of the sandbox's
        variables, and wait until it answers. It ends at ``timeout``, when stopped, or with
        the sandbox.

        Raises KernelUnavailableError (the image lacks what the kernel needs: the message
        says what and how to add it), AgentError (``limit``: ``max_running`` background
        processes run; ``invalid``; ``conflict``: the id is taken), PathNotFoundError
        (cwd), infrastructure errors."""
        ...

    async def kernel_info(self, context_id: str) -> KernelInfo:
        """Context ``context_id``'s kernel as its bridge announced it (``running``: the
        bridge is up). Raises AgentError (``not_found``)."""
        ...

    async def kernel_session(self, context_id: str) -> KernelSession:
        """An open connection to the context's bridge (kept and reused: one per sandbox and
        context). Raises AgentError (``not_found``; ``conflict``: its bridge has ended),
        TunnelClosedError, ProtocolError, infrastructure errors."""
        ...

    async def stop_kernel(self, context_id: str) -> None:
        """End the context's kernel and forget it. Never raises for an unknown one."""
        ...


# -- where each is used: the sandbox as that capability, or the error callers handle -------


def background(box: object) -> BackgroundProcesses:
    """``box`` as :class:`BackgroundProcesses`. Raises NotImplementedError when it has none."""
    if isinstance(box, BackgroundProcesses):
        return box
    raise NotImplementedError("this sandbox has no background processes")


def code_kernels(box: object) -> CodeKernels:
    """``box`` as :class:`CodeKernels`. Raises NotImplementedError when it has none."""
    if isinstance(box, CodeKernels):
        return box
    raise NotImplementedError("this sandbox has no code kernels")


def harness_files(box: object) -> HarnessFiles:
    """``box`` as :class:`HarnessFiles`. Raises NotImplementedError when it has none."""
    if isinstance(box, HarnessFiles):
        return box
    raise NotImplementedError("this sandbox has no file API outside the workspace")


def harness_tree(box: object) -> HarnessTree:
    """``box`` as :class:`HarnessTree`. Raises NotImplementedError when it has none."""
    if isinstance(box, HarnessTree):
        return box
    raise NotImplementedError("this sandbox has no directory API outside the workspace")


def terminals(box: object) -> Terminals:
    """``box`` as :class:`Terminals`. Raises NotImplementedError when it has none."""
    if isinstance(box, Terminals):
        return box
    raise NotImplementedError("this sandbox has no terminals")


def tunnels(box: object) -> Tunnels:
    """``box`` as :class:`Tunnels`. Raises SandboxUnavailableError when it cannot make
    them."""
    if isinstance(box, Tunnels):
        return box
    from .errors import SandboxUnavailableError

    raise SandboxUnavailableError(f"{type(box).__name__} cannot open tunnels")


@runtime_checkable
class WarmPoolReporter(Protocol):
    """A backend with warm sandboxes (started before a workspace asks): their state as
    ``doctor`` and the metrics show it (ready, starting, claims, misses, declined, classes), None
    when it has no pool."""

    def pool_status(self) -> dict[str, Any] | None: ...


class OverlayVolumeMaker(Protocol):
    """Overlay volumes an engine mounts (``sandbox.docker.overlays.OverlayVolumes``)."""

    async def volumes_dir(self) -> Path | None:
        """Where the engine's volumes are mounted, when this process can reach it."""
        ...

    async def create(self, name: str, lowers: Sequence[Path], upper: Path, work: Path, labels: dict[str, str]) -> Path:
        """Make volume ``name`` of ``upper`` over ``lowers``; returns its mountpoint."""
        ...

    async def remove(self, name: str, *, with_containers: bool = False) -> None:
        """Remove volume ``name`` (absent is fine; refused while a container uses it,
        unless ``with_containers``: the loom sandboxes using it are removed first)."""
        ...

    async def list(self) -> builtins.list[dict[str, Any]]:
        """The fork volumes of loom's (``sandbox.docker.overlays.OverlayVolumes.list``)."""
        ...


@runtime_checkable
class OverlayForks(Protocol):
    """A backend (not a sandbox) whose engine mounts forks as overlay volumes: the
    ``overlay`` snapshot strategy (``worker.snapshots.overlay``)."""

    overlays: OverlayVolumeMaker
