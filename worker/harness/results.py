"""What the harness API returns: :class:`ExecOutput` for a command, :class:`FileWritten`
for a file, and the limits every surface shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sandbox import protocol

#: A command's default budget (seconds) when the caller gives none, and the most it may
#: have. inspect's ``exec`` may pass no timeout at all; a command still never runs forever.
DEFAULT_TIMEOUT = 3600.0
MAX_TIMEOUT = 86_400.0
#: What is kept of each output stream by default (inspect's ``SandboxEnvironmentLimits``:
#: 10 MiB) and at most (:data:`sandbox.protocol.MAX_EXEC_OUTPUT`, 16 MiB).
DEFAULT_MAX_OUTPUT = 10 << 20
MAX_OUTPUT = protocol.MAX_EXEC_OUTPUT
#: A command printing more than this in all (both streams) is stopped: what it printed
#: beyond the kept head and tail is never kept, and a command printing forever must end.
HARD_OUTPUT_LIMIT = 256 << 20
#: What one read returns by default (inspect's default read limit) and at most, and what
#: one write or stdin may carry at most.
DEFAULT_MAX_READ = 100 << 20
MAX_READ = 1 << 30
MAX_WRITE = 1 << 30
MAX_STDIN = protocol.MAX_RAW_REQUEST

Outcome = Literal["exit", "timeout", "oom", "output_limit", "disk_limit", "signal", "refused"]


@dataclass(frozen=True)
class ExecOutput:
    """How a harness's command ended.

    ``returncode`` is the command's exit code (126/127 when it could not start:
    ``launch_error`` says why; 126 when refused by policy), None when it did not exit
    (``outcome``: ``timeout``, ``oom``, ``output_limit``, ``disk_limit``, ``signal``
    with ``signal`` set). ``stdout``/``stderr`` are the bytes exactly; when a stream was
    larger than the cap asked for (``max_output``), its head and tail are kept around a
    marker, ``truncated`` is true and ``stdout_bytes``/``stderr_bytes`` count all of it.
    ``files_changed``: the workspace's files it changed (recorded in its changelog under
    ``call_id``, undoable); what it changed outside the workspace is not recorded.
    """

    returncode: int | None
    stdout: bytes
    stderr: bytes
    outcome: Outcome
    duration_ms: float
    truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    signal: int | None = None
    launch_error: str | None = None
    call_id: str | None = None
    files_changed: list[str] = field(default_factory=list)

    @property
    def success(self) -> bool:
        """It ran and exited with 0."""
        return self.outcome == "exit" and self.returncode == 0

    def text(self, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        """A stream as text (UTF-8; invalid bytes as U+FFFD)."""
        return (self.stdout if stream == "stdout" else self.stderr).decode("utf-8", "replace")


@dataclass(frozen=True)
class FileWritten:
    """A file the harness API wrote: its path in the sandbox (links followed), size,
    whether it is new, and whether the change was ``recorded`` in the workspace's
    changelog (a file in the workspace: undoable under ``call_id``) or not (``/tmp``,
    ``$HOME``: the sandbox's scratch space, never recorded)."""

    path: str
    size: int
    created: bool
    recorded: bool
    call_id: str | None = None
