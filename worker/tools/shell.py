"""``shell_execute``: ``sh -c`` inside the workspace's sandbox.

The container is the boundary; :mod:`worker.policy.shell` only refuses the obvious
mistakes. The command runs with the workspace's mutation lock held and bracketed by the
recorder, so ``files_changed`` lists what it changed. The sandbox kills every process
the command started when it ends or times out.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field, model_validator

from sandbox import protocol
from sandbox.base import ExecRequest, ProcessOutput
from sandbox.capabilities import background
from sandbox.errors import AgentError, SandboxLostError

from ..background import BackgroundLimits
from ..guard import as_dicts
from ..policy.paths import normalize
from ..policy.shell import check_command
from ..result import ToolResult
from ..tool import Tool, ToolArgs, ToolContext, ToolError

MAX_TIMEOUT = 300.0
DEFAULT_TIMEOUT = 60.0
MAX_YIELD_MS = 300_000
#: How long a background start waits for the process's first output.
FIRST_OUTPUT_WAIT = 0.1
#: Bytes of stdout and of stderr kept (head and tail) in ``data``, by default.
MAX_STREAM_BYTES = 256 * 1024
#: The most a command's stdin may hold.
MAX_STDIN = 16 << 20
#: The registry's deadline beyond the command's own timeout: the agent needs its kill
#: grace and the reply its round trip before the host gives up on the call.
DEADLINE_SLACK = 15.0


class ShellArgs(ToolArgs):
    command: str = Field(description="Shell command, run with sh -c in the workspace (no network).")
    cwd: str = Field(".", description="Working directory, relative to the workspace root.")
    timeout: float | None = Field(
        None,
        gt=0,
        description=(
            f"Seconds before the command and everything it started are killed: default 60, at most "
            f"{MAX_TIMEOUT:g}; for background or yield_ms the process's lifetime (default 1 h)."
        ),
    )
    background: bool = Field(
        False,
        description=(
            "Start it and answer at once with data.process_id and its first output; it runs on after the call "
            "(a dev server, a watcher, a long test run). Read it with process_output, stop it with process_kill."
        ),
    )
    env: dict[str, str] | None = Field(
        None, description="Variables for the command, on top of the sandbox's (NAME: value)."
    )
    stdin: str | None = Field(
        None,
        max_length=MAX_STDIN * 4 // 3 + 4,
        description="The command's standard input (default: none, /dev/null); base64 of bytes with stdin_encoding.",
    )
    stdin_encoding: Literal["utf-8", "base64"] = Field("utf-8", description="How stdin is given: text or base64.")
    max_output: int = Field(
        MAX_STREAM_BYTES,
        ge=1024,
        le=protocol.MAX_EXEC_OUTPUT,
        description=(
            f"Bytes of stdout and of stderr kept in data.stdout / data.stderr (head and tail): default 256 KiB, "
            f"at most {protocol.MAX_EXEC_OUTPUT >> 20} MiB; beyond, data.truncated is true and data.stdout_bytes / "
            "stderr_bytes count all. A command printing more than 64 MiB in all is stopped (output_limit)."
        ),
    )
    yield_ms: int | None = Field(
        None,
        ge=0,
        le=MAX_YIELD_MS,
        description=(
            "Wait at most this long: if the command ends by then, this is an ordinary result; if it still "
            "runs, answer with its output so far, data.process_id and data.running=true, and let it go on."
        ),
    )

    @model_validator(mode="after")
    def _cap(self) -> ShellArgs:
        if not self.background and self.yield_ms is None:
            self.timeout = min(self.timeout or DEFAULT_TIMEOUT, MAX_TIMEOUT)
        elif self.stdin is not None:
            raise ValueError("stdin is for a command run to its end (a background process: process_input)")
        if (problem := protocol.env_problem(self.env)) is not None:
            raise ValueError(f"env: {problem}")
        return self


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.0f} MB"


def describe_failure(
    outcome: str, exit_code: int | None, signal: int | None, timeout: float, disk_used: int | None = None
) -> str:
    if outcome == "timeout":
        return f"Command timed out after {timeout:g}s and was killed"
    if outcome == "oom":
        return (
            "Command was killed: it needed more memory than the sandbox's memory limit allows; "
            "use less (smaller inputs, fewer parallel jobs) or ask the operator for a larger limit"
        )
    if outcome == "output_limit":
        return "Command was stopped: it produced too much output"
    if outcome == "disk_limit":
        used = f" ({_mb(disk_used)} written)" if disk_used else ""
        return (
            f"Command was stopped: it used more of the workspace's disk than the sandbox allows{used}; "
            "delete what it wrote or write less"
        )
    if outcome == "signal":
        return f"Command was killed by signal {signal}"
    return f"Command exited with code {exit_code}"


async def shell_execute(args: ShellArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    command = args.command
    if not command.strip():
        raise ToolError("Empty command")
    check_command(command)
    cwd = normalize(args.cwd, str(ws.root))
    if args.background or args.yield_ms is not None:
        return await run_background(args, ctx, cwd)
    timeout = args.timeout or DEFAULT_TIMEOUT
    stdin: bytes | None = None
    if args.stdin is not None:
        from .files import content_bytes

        stdin = content_bytes(args.stdin, args.stdin_encoding, "stdin")
        if len(stdin) > MAX_STDIN:
            raise ToolError(f"'stdin': more than {MAX_STDIN} bytes; write it to a file and redirect it")
    request = ExecRequest(
        command, cwd=cwd, timeout=timeout, max_output=args.max_output, env=args.env or None, stdin=stdin
    )
    res, changed = await ws.run_shell(
        request,
        call_id=ctx.call_id,
        subtask_id=ctx.subtask_id,
        on_output=ctx.on_output,
        control=ctx.control,
    )
    stdout = res.stdout.decode("utf-8", "replace")
    stderr = res.stderr.decode("utf-8", "replace")
    if res.outcome == "sandbox_lost":
        # Never dressed up as command output: the registry reports it as infrastructure.
        raise SandboxLostError(
            "the sandbox was lost while running the command (its agent was killed or stopped: by the "
            "command itself, as `kill -9 -1` or `pkill python3` do, or from outside; do not repeat such "
            f"a command): {stderr.strip()}"
        )
    data: dict[str, Any] = {
        "exit_code": res.exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "outcome": res.outcome,
        "timed_out": res.timed_out,
        "truncated": res.truncated,
        "stdout_bytes": res.stdout_bytes,
        "stderr_bytes": res.stderr_bytes,
        "duration_ms": round(res.duration_ms, 3),
    }
    if res.signal is not None:
        data["signal"] = res.signal
    if res.disk_used is not None:
        data["disk_used"] = res.disk_used
    output = stdout
    if stderr:
        output += ("" if not output or output.endswith("\n") else "\n") + "[stderr]\n" + stderr
    if ws.guard.last:  # (read at once: the check that ended this call, see worker.guard)
        data["guard"] = as_dicts(ws.guard.last)
        undone = "; ".join(f"{a.path}: {a.what}" for a in ws.guard.last[:20])
        output += ("" if not output or output.endswith("\n") else "\n") + f"[the host undid: {undone}]"
    success = res.outcome == "exit" and res.exit_code == 0
    if success:
        return ToolResult.ok(output or "(no output)", data, changed)
    error = describe_failure(res.outcome, res.exit_code, res.signal, timeout, res.disk_used)
    tail = f"[{error}]"
    output = f"{output}\n{tail}" if output else tail
    return ToolResult(False, output, data, changed, error)


async def run_background(args: ShellArgs, ctx: ToolContext, cwd: str) -> ToolResult:
    """``background``: start and answer with the first output; ``yield_ms``: wait that
    long for the end, else answer as ``background`` does with what it printed so far."""
    from .processes import output_data, render_output, status_line

    ws = ctx.require_workspace()
    limits = ws.background.limits if ws.background is not None else BackgroundLimits()
    timeout = min(args.timeout or limits.timeout, limits.max_timeout)
    try:
        info = await ws.start_background(
            args.command, cwd=cwd, timeout=timeout, call_id=ctx.call_id, subtask_id=ctx.subtask_id, env=args.env
        )
    except AgentError as e:
        if e.code == "limit":
            raise ToolError(str(e), data={"error_code": "limit"}) from None
        raise
    except NotImplementedError:
        raise ToolError("This sandbox cannot run background processes") from None
    wait = FIRST_OUTPUT_WAIT if args.background else (args.yield_ms or 0) / 1000.0
    deadline = time.monotonic() + wait
    out = await background(ws.sandbox).process_output(
        info.id, wait=wait if args.background else 0.0, max_bytes=MAX_STREAM_BYTES
    )
    parts = [out]
    while not args.background and not out.done and (left := deadline - time.monotonic()) > 0:
        out = await background(ws.sandbox).process_output(info.id, wait=left, max_bytes=MAX_STREAM_BYTES)
        parts.append(out)
    merged = _merge(parts)
    changed = await ws.settle_background() if not merged.info.running else []
    data = output_data(merged)
    text = render_output(merged)
    sep = "" if not text or text.endswith("\n") else "\n"
    if merged.info.running:
        read = f'process_output {{"process_id": "{info.id}"}}'
        text += f"{sep}[still running as background process {info.id} (pid {info.pid}); read on with {read}]"
        return ToolResult.ok(text, data, changed)
    success = merged.info.outcome == "exit" and merged.info.exit_code == 0
    data["duration_ms"] = round(((merged.info.ended or time.time()) - merged.info.started) * 1000, 3)
    if success:
        return ToolResult.ok(text or "(no output)", data, changed)
    error = status_line(merged.info).strip("[]")
    return ToolResult(False, f"{text}{sep}[{error}]", data, changed, error)


def _merge(parts: list[ProcessOutput]) -> ProcessOutput:
    """Successive reads as one (the last one's cursor and state)."""
    last = parts[-1]
    if len(parts) == 1:
        return last
    return ProcessOutput(
        info=last.info,
        stdout=b"".join(p.stdout for p in parts),
        stderr=b"".join(p.stderr for p in parts),
        cursor=last.cursor,
        dropped=(sum(p.dropped[0] for p in parts), sum(p.dropped[1] for p in parts)),
        done=last.done,
    )


def _deadline(a: ShellArgs) -> float:
    if a.background:
        return 30.0 + DEADLINE_SLACK
    if a.yield_ms is not None:
        return a.yield_ms / 1000 + 30.0 + DEADLINE_SLACK
    return float(a.timeout or DEFAULT_TIMEOUT) + DEADLINE_SLACK


TOOLS = [
    Tool(
        name="shell_execute",
        description=(
            "Run a shell command (sh -c) in the workspace inside an isolated sandbox with no network. "
            "Returns stdout, then stderr under [stderr]; success means exit code 0. "
            f"timeout defaults to 60 s, at most {MAX_TIMEOUT:g} s. Everything it started is killed when it "
            "ends, unless it runs in the background (background, or yield_ms for a command that may take long)."
        ),
        args_model=ShellArgs,
        fn=shell_execute,
        timeout=60.0 + DEADLINE_SLACK,
        mutating=True,
        timeout_for=_deadline,
        tags=("shell", "code"),
    ),
]
