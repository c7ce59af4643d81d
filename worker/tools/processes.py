"""Background processes: ``process_output``, ``process_input``, ``process_kill``,
``process_list`` (started by ``shell_execute`` with ``background`` or ``yield_ms``).

A process outlives the call that started it and the worker process that made the call;
it ends when it exits, at its timeout, on ``process_kill``, or with the sandbox (stop,
idle TTL, ``gc``, a lost sandbox); then everything it started is killed, as after a
command. What it changes in the workspace is recorded in the changelog under its id as
the call id (``undo --call <id>``), when a later call or the sight of its end finds it.
"""

from __future__ import annotations

import signal as signals
import time
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator

from sandbox.base import ProcessInfo, ProcessOutput
from sandbox.capabilities import background
from sandbox.errors import AgentError

from ..result import ToolResult
from ..tool import Tool, ToolArgs, ToolContext, ToolError

#: Output returned per read and stream (the process keeps head and tail; see its cursor).
MAX_READ = 256 * 1024
MAX_WAIT_MS = 60_000
SIGNALS = {"TERM": signals.SIGTERM, "KILL": signals.SIGKILL, "INT": signals.SIGINT, "HUP": signals.SIGHUP}


def parse_cursor(text: str | None) -> tuple[int, int] | None:
    """``"1024:17"`` (stdout:stderr byte offsets) -> (1024, 17). Raises ValueError."""
    if text is None:
        return None
    out, sep, err = text.partition(":")
    if not sep or not out.isdigit() or not err.isdigit():
        raise ValueError("a cursor is two byte offsets, stdout:stderr (e.g. 1024:0), as data.cursor gives it")
    return int(out), int(err)


def cursor_text(cursor: tuple[int, int]) -> str:
    return f"{cursor[0]}:{cursor[1]}"


class ProcessIdArgs(ToolArgs):
    process_id: str = Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="The id shell_execute returned."
    )


class OutputArgs(ProcessIdArgs):
    wait_ms: int = Field(
        0,
        ge=0,
        le=MAX_WAIT_MS,
        description="Wait up to this long for new output (returns as soon as there is some, or it ends).",
    )
    since: str | None = Field(
        None,
        max_length=64,
        description="Read from this cursor (data.cursor of an earlier read) instead of from the last read.",
    )

    @field_validator("since")
    @classmethod
    def _since(cls, v: str | None) -> str | None:
        parse_cursor(v)
        return v


#: Most bytes one process_input writes.
MAX_INPUT = 1 << 20


class InputArgs(ProcessIdArgs):
    # Raw bytes too, from Python; JSON callers send base64 for bytes.
    text: Annotated[str | bytes, WithJsonSchema({"type": "string"})] = Field(
        max_length=MAX_INPUT * 4 // 3 + 4,
        description="Text written to the process's stdin (add \\n for a line); with encoding base64, the bytes.",
    )
    encoding: Literal["utf-8", "base64"] = Field("utf-8", description="utf-8 text, or base64 of the exact bytes.")
    eof: bool = Field(False, description="Close its stdin afterwards (end of input).")


class KillArgs(ProcessIdArgs):
    signal: Literal["TERM", "KILL", "INT", "HUP"] = Field(
        "TERM", description="Sent to everything it started; after a 0.5 s grace whatever is left is KILLed."
    )


class ListArgs(ToolArgs):
    pass  # no arguments (a docstring would become the schema's description)


def _agent(e: AgentError) -> ToolError:
    return ToolError(str(e), data={"error_code": e.code})


def _state(info: ProcessInfo) -> str:
    if info.running:
        return f"running, pid {info.pid}, for {max(0.0, time.time() - info.started):.0f} s"
    if info.outcome == "timeout":
        return f"timed out and was killed (exit code {info.exit_code})"
    if info.outcome == "signal":
        return f"was killed by signal {info.signal} (exit code {info.exit_code})"
    return f"exited with code {info.exit_code}"


def status_line(info: ProcessInfo) -> str:
    if info.running:
        return f"[running: {info.id}, {_state(info).removeprefix('running, ')}]"
    return f"[{info.id} {_state(info)}]"


def render_output(out: ProcessOutput) -> str:
    """stdout, then stderr under [stderr], each with a marker where bytes were dropped."""

    def part(data: bytes, dropped: int) -> str:
        text = data.decode("utf-8", "replace")
        return (f"[... {dropped} bytes dropped (more than the process keeps) ...]\n" if dropped else "") + text

    text = part(out.stdout, out.dropped[0])
    err = part(out.stderr, out.dropped[1])
    if err:
        text += ("" if not text or text.endswith("\n") else "\n") + "[stderr]\n" + err
    return text


def output_data(out: ProcessOutput) -> dict[str, Any]:
    info = out.info
    data: dict[str, Any] = {
        "process_id": info.id,
        "running": info.running,
        "stdout": out.stdout.decode("utf-8", "replace"),
        "stderr": out.stderr.decode("utf-8", "replace"),
        "cursor": cursor_text(out.cursor),
        "dropped": list(out.dropped),
        "done": out.done,
        "pid": info.pid,
    }
    if not info.running:
        data.update(exit_code=info.exit_code, outcome=info.outcome)
        if info.signal is not None:
            data["signal"] = info.signal
    return data


async def _settle(ctx: ToolContext, info: ProcessInfo) -> list[str]:
    """An ended process: record what it changed (its changes are its own entries)."""
    ws = ctx.require_workspace()
    return [] if info.running else await ws.settle_background()


async def process_output(args: OutputArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    try:
        out = await background(ws.sandbox).process_output(
            args.process_id, since=parse_cursor(args.since), wait=args.wait_ms / 1000.0, max_bytes=MAX_READ
        )
    except AgentError as e:
        raise _agent(e) from None
    changed = await _settle(ctx, out.info)
    text = render_output(out)
    more = "" if out.done or out.info.running else " (more output to read)"
    text += ("" if not text or text.endswith("\n") else "\n") + status_line(out.info) + more
    data = output_data(out)
    if out.info.running or (out.info.outcome == "exit" and out.info.exit_code == 0):
        return ToolResult.ok(text, data, changed)
    return ToolResult(False, text, data, changed, status_line(out.info).strip("[]"))


async def process_input(args: InputArgs, ctx: ToolContext) -> ToolResult:
    from .files import content_bytes

    ws = ctx.require_workspace()
    data = content_bytes(args.text, args.encoding, "text")
    if len(data) > MAX_INPUT:
        raise ToolError(f"'text': {len(data)} bytes is more than the {MAX_INPUT} bytes one process_input writes")
    try:
        written = await background(ws.sandbox).process_input(args.process_id, data, eof=args.eof)
    except AgentError as e:
        if e.code == "conflict":
            raise ToolError(
                f"Process {args.process_id} no longer reads its input (it ended, or closed its stdin); "
                "see process_output",
                data={"error_code": e.code},
            ) from None
        raise _agent(e) from None
    note = " and closed its stdin" if args.eof else ""
    return ToolResult.ok(f"Wrote {written} bytes to {args.process_id}{note}.", {"written": written})


async def process_kill(args: KillArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    try:
        info = await background(ws.sandbox).process_kill(args.process_id, signal=SIGNALS[args.signal])
    except AgentError as e:
        raise _agent(e) from None
    changed = await _settle(ctx, info)
    data = {"process_id": info.id, "running": info.running, "exit_code": info.exit_code, "outcome": info.outcome}
    if info.running:
        return ToolResult(False, f"{status_line(info)}: it is still running", data, changed, "the process did not end")
    return ToolResult.ok(f"{status_line(info)}; everything it started is gone.", data, changed)


async def process_list(args: ListArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    try:
        procs = await background(ws.sandbox).processes()
    except AgentError as e:
        raise _agent(e) from None
    rows = [
        {
            "process_id": p.id,
            "command": p.command,
            "started": p.started,
            "running": p.running,
            "exit_code": p.exit_code,
            "outcome": p.outcome,
            "pid": p.pid,
        }
        for p in procs
    ]
    changed = await ws.settle_background() if any(not p.running for p in procs) else []
    if not rows:
        return ToolResult.ok("No background processes.", {"processes": []}, changed)
    lines = [f"{p.id}  [{_state(p)}]  {p.command[:200]}" for p in procs]
    return ToolResult.ok("\n".join(lines), {"processes": rows}, changed)


TOOLS = [
    Tool(
        name="process_output",
        description=(
            "Read a background process's output since the last read (stdout, then stderr under [stderr]; "
            "nothing is read twice or lost), whether it still runs, and its exit code once it ended. "
            "wait_ms waits for new output."
        ),
        args_model=OutputArgs,
        fn=process_output,
        timeout=MAX_WAIT_MS / 1000 + 20.0,
        mutating=True,
        timeout_for=lambda a: a.wait_ms / 1000 + 20.0,
        tags=("shell", "process"),
    ),
    Tool(
        name="process_input",
        description="Write text to a background process's stdin (answer a prompt); eof closes it.",
        args_model=InputArgs,
        fn=process_input,
        timeout=20.0,
        mutating=True,
        tags=("shell", "process"),
    ),
    Tool(
        name="process_kill",
        description="Stop a background process and everything it started (TERM, a short grace, then KILL).",
        args_model=KillArgs,
        fn=process_kill,
        timeout=60.0,
        mutating=True,
        tags=("shell", "process"),
    ),
    Tool(
        name="process_list",
        description="The workspace's background processes: id, command, running or how it ended.",
        args_model=ListArgs,
        fn=process_list,
        timeout=20.0,
        tags=("shell", "process"),
    ),
]
