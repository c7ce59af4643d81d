"""OpenAI's ``shell`` tool: a ``shell_call``'s commands, each run as ``shell_execute`` runs one.

Each command of ``action.commands`` runs in order with ``sh -c`` at the workspace root, in
the workspace's sandbox, through :meth:`worker.workspace.Workspace.run_shell`: the shell
policy, the sandbox's limits and the kill of every process a command started apply, and
what it changes is recorded under the call's id (``undo --call <call_id>``). Each command
answers ``{stdout, stderr, outcome}`` with ``outcome`` ``{"type": "exit", "exit_code": N}``
or ``{"type": "timeout"}``; after a timeout the remaining commands are not run (as OpenAI's
own example harness does). ``max_output_length`` caps each command's stdout plus stderr
(head kept) and is echoed back in the ``shell_call_output``, as the API requires.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox.base import ExecRequest

from ..policy.shell import check_command
from ..result import ToolResult
from ..tool import Tool, ToolContext, ToolError
from ..tools.shell import DEFAULT_TIMEOUT, MAX_TIMEOUT

NAME = "shell"
MAX_COMMANDS = 64
#: Output kept per command when the call gives no ``max_output_length`` (characters).
DEFAULT_MAX_OUTPUT = 64 * 1024


class ShellArgs(BaseModel):
    """A ``shell_call``'s ``action``."""

    model_config = ConfigDict(extra="forbid")

    commands: list[str] = Field(min_length=1, max_length=MAX_COMMANDS, description="Shell commands, run in order.")
    timeout_ms: int | None = Field(
        None,
        gt=0,
        description=f"Timeout per command in milliseconds (default {DEFAULT_TIMEOUT:g} s, at most {MAX_TIMEOUT:g} s).",
    )
    max_output_length: int | None = Field(
        None, ge=0, description="Most characters of stdout plus stderr returned per command (head kept)."
    )


def clip(stdout: str, stderr: str, limit: int) -> tuple[str, str]:
    """stdout and stderr with at most ``limit`` characters between them, stdout first."""
    if len(stdout) + len(stderr) <= limit:
        return stdout, stderr
    out = stdout[:limit]
    return out, stderr[: max(0, limit - len(out))]


async def shell(args: ShellArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    for command in args.commands:
        check_command(command)
    timeout = min(args.timeout_ms / 1000.0 if args.timeout_ms else DEFAULT_TIMEOUT, MAX_TIMEOUT)
    limit = args.max_output_length if args.max_output_length is not None else DEFAULT_MAX_OUTPUT
    outputs: list[dict[str, Any]] = []
    changed: set[str] = set()
    for command in args.commands:
        res, files = await ws.run_shell(
            ExecRequest(command, timeout=timeout, max_output=max(limit, 1) * 4 + 1024),
            tool=NAME,
            call_id=ctx.call_id,
            subtask_id=ctx.subtask_id,
        )
        changed.update(files)
        if res.outcome == "sandbox_lost":
            raise ToolError(
                "The sandbox was lost while the command ran (it was restarted); run the command again",
                data={"error_kind": "infrastructure"},
            )
        stdout, stderr = clip(res.stdout.decode("utf-8", "replace"), res.stderr.decode("utf-8", "replace"), limit)
        if res.timed_out:
            outputs.append({"stdout": stdout, "stderr": stderr, "outcome": {"type": "timeout"}})
            break
        code = res.exit_code if res.exit_code is not None else 128 + (res.signal or 9)
        outputs.append({"stdout": stdout, "stderr": stderr, "outcome": {"type": "exit", "exit_code": code}})
    text = "\n".join(_render(c, o) for c, o in zip(args.commands, outputs, strict=False))
    data = {"output": outputs, "max_output_length": args.max_output_length}
    return ToolResult.ok(text, data, sorted(changed))


def _render(command: str, out: dict[str, Any]) -> str:
    outcome = out["outcome"]
    status = "timed out" if outcome["type"] == "timeout" else f"exit code {outcome['exit_code']}"
    body = out["stdout"] + (("\n[stderr]\n" + out["stderr"]) if out["stderr"] else "")
    return f"$ {command}\n{body}{'' if body.endswith(chr(10)) or not body else chr(10)}[{status}]"


TOOL = Tool(
    name=NAME,
    description=(
        "OpenAI's shell tool: run shell commands in order in the workspace's sandbox; each answers its stdout, "
        "stderr and exit code (or a timeout). Changes are recorded and can be undone."
    ),
    args_model=ShellArgs,
    fn=shell,
    timeout=DEFAULT_TIMEOUT + 30.0,
    mutating=True,
    timeout_for=lambda a: len(a.commands) * (min((a.timeout_ms or DEFAULT_TIMEOUT * 1000) / 1000, MAX_TIMEOUT) + 15.0),
    tags=("native", "openai", "shell"),
)
