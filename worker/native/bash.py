"""Anthropic's bash tool (``bash_20250124``, named ``bash``): one persistent shell per
workspace and session id.

The session is a background process of the workspace (``Workspace.start_background``), so
the sandbox agent's supervisor owns it like any other: it runs under the sandbox's limits,
its output is kept by the supervisor, and it is killed with its whole process tree on a
timeout, a restart, ``process_kill``, when the sandbox stops, and after
:data:`IDLE_SECONDS` without a call. Its id is ``bash-<session>-<hex>``, so every worker
process of the workspace (the service, the CLI) finds the same shell.

One command, the protocol: the command is sent on the shell's stdin as a single-quoted
word and run with ``eval`` (so a syntax error is the command's, not the protocol's),
with stdin from ``/dev/null`` (a command that reads stdin gets end-of-file instead of
swallowing what follows), then the shell prints a per-call random marker and ``$?``::

    { __loom_c='<command, quoted>'; } 2>/dev/null
    eval "$__loom_c" </dev/null
    { __loom_s=$?; ...; command printf '%s%s:%s\\n' '__LOOM_' '<hex>__' "$__loom_s"; ...; } 2>/dev/null

The output is everything before the marker (found anywhere, so output without a final
newline is kept whole); the marker is printed from two pieces so that ``set -x`` echoing
the printf line never shows it. Jobs put in the background with ``&`` keep running; what
they print later shows in the next call's output. stderr is merged into stdout, in order,
as a terminal shows them. This is the reference implementation's protocol (a sentinel
echoed after the command) made robust; inspect's ``bash_session`` does the same with a
pty.

What the shell changes in the workspace is recorded per call, like ``shell_execute``'s
(``Workspace.run_recorded``): the call's id is the entry's call id, so
``undo --call <tool_use id>`` reverts one command; what its background jobs change between
calls is recorded under the session's process id.
"""

from __future__ import annotations

import re
import secrets
import time
import weakref
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from sandbox.base import ProcessInfo
from sandbox.capabilities import background
from sandbox.errors import AgentError

from ..policy.shell import check_command
from ..result import ToolResult
from ..tool import Tool, ToolContext, ToolError
from ..workspace import Workspace

NAME = "bash"
#: The reference implementation's limit for one command.
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 3600.0
#: A session nobody used for this long is ended (with everything it started).
IDLE_SECONDS = 3600.0
#: Output kept per call: the first :data:`HEAD` and last :data:`TAIL` bytes.
HEAD = 6 * 1024
TAIL = 24 * 1024
MAX_OUTPUT = HEAD + TAIL
_READ = 1 << 20
PREFIX = "bash-"
_SESSION = re.compile(r"^[A-Za-z0-9_]{1,32}$")
#: bash when the image has it (``--norc``: the session is the same for every image), else sh.
BOOT = "if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc 2>&1; else exec sh 2>&1; fi"
RESTARTED = "tool has been restarted."
IDLE_NOTE = "(the previous bash session had ended after being idle; this is a new session)\n"
MUST_RESTART = "tool must be restarted"


class BashArgs(BaseModel):
    """Anthropic's input schema of ``bash`` (``command`` is required unless ``restart``)."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(
        None, description="The bash command to run. Required unless the tool is being restarted."
    )
    restart: bool = Field(
        False, description="Specifying true will restart this tool. Otherwise, leave this unspecified."
    )
    # Not the model's: chosen by the caller (the adapters pass them).
    session: SkipJsonSchema[str] = Field("default", pattern=_SESSION.pattern)
    timeout: SkipJsonSchema[float | None] = Field(None, gt=0, le=MAX_TIMEOUT)


class _Gone(Exception):
    """The remembered shell no longer takes input."""


@dataclass
class _Known:
    process_id: str
    #: The timeout that ended it, when this worker killed it for one.
    timed_out: float | None = None


# Per workspace (dropped with it) and session: the shell this worker process last used.
_sessions: weakref.WeakKeyDictionary[Workspace, dict[str, _Known]] = weakref.WeakKeyDictionary()


def quote(command: str) -> str:
    """``command`` as one single-quoted shell word (POSIX: bash and sh read it the same)."""
    return "'" + command.replace("'", "'\"'\"'") + "'"


def script(command: str, marker: str) -> bytes:
    """What is written to the shell's stdin for one command (see the module docstring).
    The protocol's own lines run with stderr to /dev/null, so ``set -x`` traces the
    command and not them."""
    half = len(marker) // 2
    return (
        f"{{ __loom_c={quote(command)}; }} 2>/dev/null\n"
        'eval "$__loom_c" </dev/null\n'
        "{ __loom_s=$?; __loom_x=; case $- in *x*) __loom_x=1; set +x;; esac; unset __loom_c; "
        f"command printf '%s%s:%s\\n' '{marker[:half]}' '{marker[half:]}' \"$__loom_s\"; "
        'if [ -n "$__loom_x" ]; then set -x; fi; } 2>/dev/null\n'
    ).encode("utf-8", "surrogateescape")


def cut(data: bytes, omitted: int = 0) -> str:
    """``data`` as text, its middle left out past :data:`MAX_OUTPUT` bytes (marked)."""
    omitted += max(0, len(data) - MAX_OUTPUT)
    if len(data) > MAX_OUTPUT:
        data = data[:HEAD] + b"\x00" + data[-TAIL:]
    text = data.decode("utf-8", "replace")
    if omitted:
        head, _, tail = text.partition("\x00")
        text = f"{head}\n[... {omitted} bytes of output omitted (limit {MAX_OUTPUT} bytes per call) ...]\n{tail}"
    return text


class _Reader:
    """Reads the session's output up to the call's marker, keeping head and tail."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.buf = bytearray()
        self.omitted = 0
        self.searched = 0
        self.exit_code: int | None = None
        self.found = False
        self.after = b""

    def add(self, chunk: bytes) -> bool:
        """Take ``chunk``; True once the marker's whole line was seen."""
        self.buf += chunk
        at = self.buf.find(self.marker, max(0, self.searched - len(self.marker)))
        if at == -1:
            self.searched = len(self.buf)
            if len(self.buf) > 4 * _READ:  # bounded memory: keep head and a long tail
                drop = len(self.buf) - HEAD - 2 * _READ
                del self.buf[HEAD : HEAD + drop]
                self.omitted += drop
                self.searched = len(self.buf)
            return False
        end = self.buf.find(b"\n", at)
        if end == -1:
            return False
        code = bytes(self.buf[at + len(self.marker) : end])
        self.exit_code = int(code) if code.isdigit() else None
        self.found = True
        self.after = bytes(self.buf[end + 1 :])
        del self.buf[at:]
        return True

    def text(self) -> str:
        return cut(bytes(self.buf) + self.after, self.omitted)


async def _find(ws: Workspace, session: str) -> tuple[_Known | None, ProcessInfo | None]:
    """The session's shell as this worker knows it, else the newest one the sandbox has."""
    known = _sessions.setdefault(ws, {}).get(session)
    if known is not None:
        return known, None
    prefix = f"{PREFIX}{session}-"
    mine = [p for p in await background(ws.sandbox).processes() if p.id.startswith(prefix)]
    if not mine:
        return None, None
    newest = max(mine, key=lambda p: p.started)
    return _Known(newest.id), newest


async def _stop(ws: Workspace, process_id: str) -> None:
    """End the shell and everything it started, and let its supervisor go."""
    try:
        await background(ws.sandbox).process_kill(process_id, signal=15, grace=0.5)
        await background(ws.sandbox).process_release(process_id)
    except AgentError:
        pass  # already gone
    await ws.settle_background()


async def _start(ws: Workspace, session: str, ctx: ToolContext) -> _Known:
    limits = ws.background.limits if ws.background is not None else None
    process_id = f"{PREFIX}{session}-{secrets.token_hex(4)}"
    try:
        await ws.start_background(
            BOOT,
            timeout=limits.max_timeout if limits is not None else 86_400.0,
            call_id=ctx.call_id,
            subtask_id=ctx.subtask_id,
            process_id=process_id,
            idle=IDLE_SECONDS,
        )
    except AgentError as e:
        raise ToolError(f"The bash session could not be started: {e}", data={"error_code": e.code}) from None
    known = _Known(process_id)
    _sessions.setdefault(ws, {})[session] = known
    return known


def _restart_error(info: ProcessInfo) -> ToolError:
    return ToolError(
        f"bash has exited with returncode {info.exit_code}",
        data={"system": MUST_RESTART, "exit_code": info.exit_code},
    )


async def _run(ws: Workspace, known: _Known, command: str, timeout: float) -> tuple[_Reader, ProcessInfo | None]:
    """Send ``command`` and read up to its marker. Returns the reader and, when the shell
    ended instead, its final state; the reader's ``exit_code`` is None on a timeout."""
    marker = f"__LOOM_{secrets.token_hex(8)}__"
    reader = _Reader(marker.encode() + b":")
    await background(ws.sandbox).process_input(known.process_id, script(command, marker))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return reader, None
        out = await background(ws.sandbox).process_output(known.process_id, wait=min(left, 30.0), max_bytes=_READ)
        done = reader.add(out.stdout + out.stderr)
        if done:
            return reader, None
        if not out.info.running and (out.done or not (out.stdout or out.stderr)):
            return reader, out.info


async def bash(args: BashArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    session = args.session
    timeout = args.timeout or DEFAULT_TIMEOUT
    known, seen = await _find(ws, session)
    if args.restart:
        if known is not None:
            await _stop(ws, known.process_id)
        await _start(ws, session, ctx)
        return ToolResult.ok(RESTARTED, {"text": RESTARTED, "restarted": True})
    if known is not None and known.timed_out is not None:
        raise ToolError(
            f"timed out: bash has not returned in {known.timed_out} seconds and must be restarted",
            data={"timed_out": True},
        )
    note = ""
    if seen is not None and not seen.running:
        if seen.outcome != "timeout":
            raise _restart_error(seen)
        note = IDLE_NOTE  # ended by the idle (or lifetime) limit, not by the model
        known = None
    if known is None:
        known = await _start(ws, session, ctx)
    if args.command is None:
        raise ToolError("no command provided.")
    command = args.command
    check_command(command)
    current = known

    async def run() -> tuple[_Reader, ProcessInfo | None]:
        try:
            return await _run(ws, current, command, timeout)
        except AgentError as e:
            if e.code in ("not_found", "conflict"):
                raise _Gone() from None  # handled outside the workspace's lock
            raise

    for attempt in range(2):
        try:
            (reader, ended), changed = await ws.run_recorded(
                command, run, tool=NAME, call_id=ctx.call_id, subtask_id=ctx.subtask_id
            )
            break
        except _Gone:
            # The shell this worker remembered ended meanwhile (idle limit, another
            # worker's restart): judge it by what the sandbox says, and go on in a fresh one.
            _sessions.get(ws, {}).pop(session, None)
            _known, seen = await _find(ws, session)
            if attempt or (seen is not None and not seen.running and seen.outcome != "timeout"):
                raise (
                    _restart_error(seen)
                    if seen is not None
                    else ToolError("The bash session could not be reached; restart the tool")
                ) from None
            if _known is not None and seen is not None and seen.running:
                _sessions.setdefault(ws, {})[session] = current = _known  # another worker's restart
                continue
            note = IDLE_NOTE if seen is not None else ""
            current = await _start(ws, session, ctx)
    output = note + reader.text()
    if ended is not None:
        _sessions.get(ws, {}).pop(session, None)
        err = _restart_error(ended)
        text = output + err.message
        return ToolResult.fail(
            err.message,
            output=text,
            data={"text": text, "system": MUST_RESTART, "exit_code": ended.exit_code},
            files_changed=changed,
        )
    if not reader.found:
        known_now = _sessions.get(ws, {}).get(session)
        if known_now is not None:
            known_now.timed_out = timeout
        await _stop(ws, current.process_id)
        message = f"timed out: bash has not returned in {timeout} seconds and must be restarted"
        return ToolResult.fail(
            message,
            output=output + "\n" + message,
            data={"text": message, "timed_out": True, "partial_output": output},
            files_changed=changed,
        )
    if output.endswith("\n"):
        output = output[:-1]  # as the reference strips one
    return ToolResult.ok(output, {"text": output, "exit_code": reader.exit_code}, changed)


TOOL = Tool(
    name=NAME,
    description=(
        "Anthropic's bash tool (bash_20250124): run a command in a persistent bash session (the working "
        "directory, exported variables and functions persist between calls); restart: true starts a fresh "
        "session. The session runs in the workspace's sandbox; its file changes are recorded and can be undone."
    ),
    args_model=BashArgs,
    fn=bash,
    timeout=DEFAULT_TIMEOUT + 30.0,
    mutating=True,
    timeout_for=lambda a: (a.timeout or DEFAULT_TIMEOUT) + 30.0,
    tags=("native", "anthropic", "shell"),
)
