"""``shell_execute``: ``sh -c`` inside the workspace's sandbox.

The container is the boundary; :mod:`worker.shellpolicy` only refuses the obvious
mistakes. The command runs with the workspace's mutation lock held and bracketed by the
recorder, so ``files_changed`` lists what it changed. The sandbox kills every process
the command started when it ends or times out.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandbox.errors import SandboxLostError

from ..paths import normalize
from ..result import ToolResult
from ..shellpolicy import check_command
from ..tool import Tool, ToolContext, ToolError

MAX_TIMEOUT = 300.0
#: Bytes of stdout and of stderr kept (head and tail) in ``data``.
MAX_STREAM_BYTES = 256 * 1024
#: The registry's deadline beyond the command's own timeout: the agent needs its kill
#: grace and the reply its round trip before the host gives up on the call.
DEADLINE_SLACK = 15.0


class ShellArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(description="Shell command, run with sh -c in the workspace (no network).")
    cwd: str = Field(".", description="Working directory, relative to the workspace root.")
    timeout: float = Field(
        60.0,
        gt=0,
        description=f"Seconds before the command is killed (default 60, capped at {MAX_TIMEOUT:g}).",
    )

    @field_validator("timeout")
    @classmethod
    def _cap(cls, v: float) -> float:
        return min(v, MAX_TIMEOUT)


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.0f} MB"


def _describe_failure(
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
    res, changed = await ws.run_shell(
        command,
        cwd=cwd,
        timeout=args.timeout,
        max_output=MAX_STREAM_BYTES,
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
        "duration_ms": round(res.duration_ms, 3),
    }
    if res.signal is not None:
        data["signal"] = res.signal
    if res.disk_used is not None:
        data["disk_used"] = res.disk_used
    output = stdout
    if stderr:
        output += ("" if not output or output.endswith("\n") else "\n") + "[stderr]\n" + stderr
    success = res.outcome == "exit" and res.exit_code == 0
    if success:
        return ToolResult.ok(output or "(no output)", data, changed)
    error = _describe_failure(res.outcome, res.exit_code, res.signal, args.timeout, res.disk_used)
    tail = f"[{error}]"
    output = f"{output}\n{tail}" if output else tail
    return ToolResult(False, output, data, changed, error)


TOOLS = [
    Tool(
        name="shell_execute",
        description=(
            "Run a shell command (sh -c) in the workspace inside an isolated sandbox with no network. "
            "Returns stdout, then stderr under [stderr]; success means exit code 0. "
            f"timeout defaults to 60 s, at most {MAX_TIMEOUT:g} s."
        ),
        args_model=ShellArgs,
        fn=shell_execute,
        timeout=60.0 + DEADLINE_SLACK,
        mutating=True,
        timeout_for=lambda a: float(a.timeout) + DEADLINE_SLACK,
        tags=("shell", "code"),
    ),
]
