"""The types of the sandbox contract (:mod:`sandbox.base`): what each call of a
:class:`~sandbox.base.Sandbox` returns, and the requests that are more than a few
arguments (:class:`ExecRequest`, :class:`ScanRequest`). Plain frozen dataclasses, no
behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["exit", "timeout", "oom", "output_limit", "disk_limit", "signal", "sandbox_lost"]
EntryType = Literal["file", "dir", "symlink", "other"]
StreamName = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class ReadResult:
    """What :meth:`Sandbox.read` read: the bytes and what is known of the whole file."""

    data: bytes
    size: int  # size of the whole file in bytes
    truncated: bool  # data is not the whole requested range
    sha256: str | None  # hash of the whole file when it was read whole, else None
    mtime_ns: int
    binary: bool  # NUL byte in the first 8 KiB
    total_lines: int | None = None  # only for line_range reads


@dataclass(frozen=True)
class WriteResult:
    """A file :meth:`Sandbox.write` put in place: its size, sha256 and whether it was new;
    ``stat``, where the sandbox says (:meth:`StagedWrites.commit_write`), is the file's
    (size, mtime_ns, inode, st_mode) as the sandbox's scans see it."""

    size: int
    sha256: str
    created: bool
    stat: tuple[int, int, int, int] | None = None


@dataclass(frozen=True)
class StagedWrite:
    """A write made but not yet put in place (:meth:`StagedWrites.stage_write`)."""

    token: object
    path: str  # the resolved workspace-relative path it will replace
    mode: int | None  # st_mode of the file it replaces; None when creating


@dataclass(frozen=True)
class TreeRemoval:
    """What :meth:`Sandbox.remove_tree` removed."""

    removed: bool
    files: int = 0  # files, links and other non-directories
    dirs: int = 0
    bytes: int = 0  # sizes of the regular files


@dataclass(frozen=True)
class FileStat:
    """What :meth:`Sandbox.stat` found at a path (an ``lstat``: a link is not followed)."""

    path: str
    type: EntryType
    size: int
    mtime_ns: int
    mode: int
    target: str | None = None  # symlink target, as stored (never followed)


@dataclass(frozen=True)
class ListEntry:
    """One entry of :meth:`Sandbox.list`."""

    path: str  # workspace-relative, "/" separated
    type: EntryType
    size: int
    depth: int


@dataclass(frozen=True)
class ListResult:
    """The entries :meth:`Sandbox.list` found, and whether the walk was cut short."""

    entries: list[ListEntry]
    truncated: bool


@dataclass(frozen=True)
class SearchMatch:
    """One matching line of :meth:`Sandbox.search`."""

    path: str
    line: int
    text: str


@dataclass(frozen=True)
class SearchResult:
    """The matches of :meth:`Sandbox.search` and the engine that found them."""

    matches: list[SearchMatch]
    truncated: bool  # more matches exist than were returned
    engine: str  # "ripgrep" or "python"


@dataclass(frozen=True)
class ExecResult:
    """How a command run by :meth:`Sandbox.exec` ended, and its captured output."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    outcome: Outcome
    duration_ms: float
    truncated: bool
    signal: int | None = None
    stdout_bytes: int = 0  # total produced, including what was cut
    stderr_bytes: int = 0
    #: With ``ExecRequest.scan``: the snapshot scan the agent ran right after the command
    #: (None when it could not, e.g. the sandbox was lost).
    scan_after: ScanResult | None = None
    #: With outcome ``disk_limit``: bytes of the workspace's disk the command had consumed.
    disk_used: int | None = None
    #: The command never started: ``not_found`` (its program; exit 127), ``permission``
    #: (not executable; 126), ``cwd`` (its directory could not be entered; 126), ``user``
    #: (no such user in the image; 126), ``exec`` (another reason; 126). The message is
    #: on stderr, as a shell would print it.
    launch_error: str | None = None

    @property
    def timed_out(self) -> bool:
        return self.outcome == "timeout"


@dataclass(frozen=True)
class PathRead:
    """What :meth:`HarnessFiles.read_path` read: the bytes (all of the file, or up to the cap
    asked for) and the file's whole size."""

    data: bytes
    size: int
    truncated: bool  # the file is larger than the cap: data is its first bytes


@dataclass(frozen=True)
class PathWrite:
    """A file :meth:`HarnessFiles.write_path` wrote: where (links followed), its size, whether
    it was new."""

    path: str
    size: int
    created: bool


@dataclass(frozen=True)
class PathEntry:
    """An entry anywhere in the sandbox, as :class:`~sandbox.capabilities.HarnessTree`
    describes it: a link's own size, times and owner, with its target's ``type`` and
    permission bits (``target``: where it leads, links resolved; ``type`` ``other`` when
    it is dangling). ``path`` is the sandbox's absolute path (below a listed directory:
    the directory's path as asked for, then ``rel``)."""

    path: str
    name: str
    type: Literal["file", "dir", "other"]
    size: int
    mode: int  # st_mode of the entry itself (a link's own)
    perm: int  # permission bits (a link's target's)
    uid: int
    gid: int
    owner: str
    group: str
    mtime_ns: int
    symlink: bool = False
    target: str | None = None
    rel: str | None = None  # below the listed directory


WatchEventType = Literal["create", "write", "remove", "rename", "chmod"]


@dataclass(frozen=True)
class WatchEvent:
    """A change in a watched directory: ``name`` relative to it (``.``: the directory
    itself), and what happened."""

    name: str
    type: WatchEventType


@dataclass(frozen=True)
class OutputChunk:
    """Bytes a command wrote, as :meth:`Sandbox.exec_stream` yields them (exactly as
    written: any bytes, a line or a character may be split between chunks)."""

    stream: StreamName
    data: bytes


@dataclass(frozen=True)
class ScanEntry:
    """One file or directory of a :class:`ScanResult` (its ``lstat``)."""

    path: str
    type: EntryType
    size: int
    mtime_ns: int
    ino: int
    mode: int


@dataclass(frozen=True)
class ScanResult:
    """A stat-only walk of the tree. ``full`` is True when ``entries`` is the whole tree;
    otherwise ``entries`` holds only what changed since the agent's previous scan with the
    same ``snapshot`` key and ``removed`` the paths that disappeared."""

    entries: list[ScanEntry]
    removed: list[str]
    full: bool
    truncated: bool  # the file cap was hit; the tree is larger than ``entries``
    generation: str = ""
    #: The agent watches the tree (inotify), so the next scan with this snapshot can be
    #: incremental.
    watched: bool = False
    #: This result came from change events, not a stat walk: it also lists files written
    #: to whose stat did not change, so the caller needs no "racy file" re-hashing.
    from_events: bool = False


@dataclass(frozen=True)
class ScanRequest:
    """The arguments of :meth:`Sandbox.scan` for a scan that travels with an ``exec``."""

    snapshot: str
    since: str | None
    path: str = "."
    exclude: tuple[str, ...] = ()
    max_files: int = 100_000


@dataclass(frozen=True)
class ExecRequest:
    """One command for :meth:`Sandbox.exec <sandbox.base.Sandbox.exec>`: ``sh -c command``
    (or ``argv`` run directly, no shell) inside the workspace, and how. Plain data (it
    crosses process boundaries, e.g. a cluster's call channel); the caller's live handles
    (``on_output``, ``control``) go beside it.

    - ``cwd``: workspace-relative; with ``any_cwd`` any absolute directory of the sandbox,
      entered as its shell would enter it (a failure is ``launch_error="cwd"``).
    - ``timeout``: seconds, then the command's whole process tree is killed.
    - ``env``: variables on top of the sandbox's.
    - ``max_output``: what is kept of each stream, head and tail (at most
      :data:`~sandbox.protocol.MAX_EXEC_OUTPUT`); ``output_limit``: a command that prints
      more than that in all is stopped.
    - ``scan``: the snapshot scans that bracket the command travel with it (see
      :meth:`Sandbox.exec <sandbox.base.Sandbox.exec>`).
    - ``stdin``: the command's standard input (default ``/dev/null``).
    - ``user``: another user of the image (a name or ``uid[:gid]``; ``root`` only where
      the workspace allows it).
    """

    command: str
    cwd: str = "."
    timeout: float = 60.0
    env: dict[str, str] | None = None
    max_output: int = 256 * 1024
    argv: list[str] | None = None
    output_limit: int = 64 << 20
    scan: ScanRequest | None = None
    stdin: bytes | None = None
    user: str | None = None
    any_cwd: bool = False


@dataclass(frozen=True)
class ProcessInfo:
    """A background process (:meth:`BackgroundProcesses.start_process`), as its supervisor tells it."""

    id: str
    command: str
    pid: int | None
    started: float  # epoch seconds
    running: bool
    ended: float | None = None
    exit_code: int | None = None  # 128 + n when killed by signal n (as a shell says it)
    outcome: Outcome | None = None  # exit, timeout or signal, once ended
    signal: int | None = None
    stdout_bytes: int = 0  # produced so far (kept: head and tail, see ProcessOutput.dropped)
    stderr_bytes: int = 0
    #: A terminal's size (cols, rows); None for a process on pipes.
    pty: tuple[int, int] | None = None


@dataclass(frozen=True)
class ProcessOutput:
    """What a background process printed after a cursor (:meth:`BackgroundProcesses.process_output`)."""

    info: ProcessInfo
    stdout: bytes
    stderr: bytes
    cursor: tuple[int, int]  # pass as ``since`` to read on from here
    dropped: tuple[int, int]  # bytes lost between the kept head and tail, before this data
    done: bool  # ended, and everything it printed has been read


@dataclass(frozen=True)
class ProcessAttach:
    """Where a background process's byte stream starts (:meth:`Terminals.attach_process`):
    ``cursor`` is the offset of its first byte; ``dropped`` bytes before it, after the
    offset asked for, are no longer kept."""

    info: ProcessInfo
    cursor: int
    dropped: int


@dataclass(frozen=True)
class AgentInfo:
    """What the in-container agent reports about itself (:meth:`Sandbox.info`)."""

    version: str
    uid: int
    gid: int
    pid: int
    python: str
    kernel: str
    subreaper: bool
    ripgrep: bool
    extra: dict[str, object] = field(default_factory=dict)
