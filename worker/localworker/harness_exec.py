"""``loom-worker exec`` with the harness API's options (``--env``, ``--user``,
``--stdin``, an absolute ``--cwd``): the command through :class:`worker.harness.
SandboxHandle`, its output streamed as ``shell_execute``'s is, its end as a
``shell_execute``-shaped result, so the exit codes (``exec_exit_code``) and the CLI's
words are the same either way."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

from sandbox.base import ExecControl, OutputCallback
from sandbox.errors import AgentError, SandboxError

from ..changelog.errors import ChangelogStorageError
from ..harness import ExecOutput
from ..registry import ToolRegistry
from ..result import ToolResult
from ..streaming import ToolOutput, stream_call
from ..tools.shell import describe_failure


def harness_stream(
    registry: ToolRegistry,
    workspace: str,
    command: str,
    timeout: Any,
    cwd: str,
    call_id: str | None,
    options: dict[str, Any],
    control: ExecControl | None,
) -> AsyncIterator[ToolOutput | ToolResult]:
    """The command's output as it comes, then its ToolResult (never raises for the call)."""

    async def run(on_output: OutputCallback) -> ToolResult:
        try:
            stdin = options.get("stdin")
            out = await registry.sandbox(workspace).exec(
                command,
                input=None if stdin is None else base64.b64decode(stdin),
                cwd=cwd,
                env=options.get("env") or None,
                user=options.get("user"),
                timeout=float(timeout),
                max_output=256 << 10,  # what the result keeps: the output went out as it came
                call_id=call_id,
                on_output=on_output,
                control=control,
            )
        except (ValueError, TypeError) as e:
            return ToolResult.fail(str(e))  # a usage error (exit 2)
        except AgentError as e:  # a user this workspace may not run as: refused (126)
            on_output("stderr", f"loom-worker exec: {e}\n".encode())
            return ToolResult(False, str(e), {"outcome": "exit", "exit_code": 126}, [], str(e))
        except (SandboxError, ChangelogStorageError) as e:
            return ToolResult.fail(
                f"Sandbox unavailable (infrastructure failure): {e}", data={"error_kind": "infrastructure"}
            )
        if out.launch_error is not None or out.outcome == "refused":
            # It never ran, so nothing was streamed: its message, as a shell prints it.
            on_output("stderr", out.stderr)
        return result_of(out, float(timeout))

    return stream_call(run)


def result_of(out: ExecOutput, timeout: float) -> ToolResult:
    """``out`` as ``shell_execute`` would have said it."""
    data: dict[str, Any] = {
        "exit_code": out.returncode,
        "outcome": "exit" if out.outcome == "refused" else out.outcome,
        "signal": out.signal,
    }
    if out.success:
        return ToolResult(True, "", data, list(out.files_changed), None)
    if out.outcome == "refused":
        error = out.text("stderr").strip()
    elif out.launch_error is not None:
        error = out.text("stderr").strip() or f"the command could not start ({out.launch_error})"
    else:
        error = describe_failure(out.outcome, out.returncode, out.signal, timeout)
    return ToolResult(False, "", data, list(out.files_changed), error)
