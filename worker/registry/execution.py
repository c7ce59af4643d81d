"""Running one tool call: the one place its errors are sorted into the two channels.

:meth:`Execution.execute` never raises (but on cancellation):

==================================  ==========================================================
what happened                       ToolResult
==================================  ==========================================================
unknown tool                        success=false, "Unknown tool 'x'. Available tools: ..."
arguments fail validation           success=false, "Invalid arguments for t: 'field': problem"
path / command refused by policy    success=false, "Safety violation: ..."
ToolError / AgentError              success=false, the message (e.g. "File not found: a.txt")
the call's deadline passed          success=false, "t timed out after Ns"; for a tool that
                                    enforces its own limit in the sandbox (``timeout_for``:
                                    that limit plus slack), "Sandbox did not answer in time
                                    (infrastructure ...", error_kind "infrastructure"
sandbox unavailable / lost / broken success=false, "Sandbox unavailable (infrastructure ...",
changelog storage failed            data["error_kind"] == "infrastructure" ("nothing was changed",
                                    or, after a command ran, that its changes are recorded later)
changelog damaged                   data["error_kind"] == "infrastructure", naming the file
the data directory below its reserve success=false, data["error_kind"] == "limit"
anything else (a bug)               success=false, "Internal error ...", error_kind "internal"
==================================  ==========================================================

Every call is logged (``tool.call`` on the ``worker.registry`` logger) and, with a journal,
recorded in its workspace's call journal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox.base import ExecControl, OutputCallback
from sandbox.errors import (
    AgentError,
    ImageNotFoundError,
    ImageUnusableError,
    PathEscapeError,
    PathNotFoundError,
    ProtocolError,
    SandboxTimeoutError,
    SandboxUnavailableError,
)
from sandbox.logs import get_logger

from .. import lockwait
from ..changelog.errors import (
    ChangelogDamagedError,
    ChangelogStorageError,
    ChangesNotRecordedError,
    ReserveError,
)
from ..result import ToolResult
from ..tool import ToolContext, ToolError
from .pool import WorkspacePool
from .table import ToolTable

if TYPE_CHECKING:  # annotations only: the journal is made by the composition
    from ..calls import CallJournal

log = get_logger("worker.registry")

Arguments = Mapping[str, Any] | str | None


def _infra(kind: str, err: Exception) -> ToolResult:
    # A missing or unusable image, or a damaged changelog, does not go away by itself:
    # "retry later" would only make the model repeat the call. It is still the
    # operator's problem, not the call's.
    if isinstance(err, ImageNotFoundError | ImageUnusableError):
        advice = "the workspace's image must be fixed by its operator"
    elif isinstance(err, ChangelogDamagedError):
        advice = "the workspace's changelog must be repaired by its operator"
    else:
        advice = "retry later"
    return ToolResult.fail(
        f"{kind} (infrastructure failure, not a problem with the tool call; {advice}): {err}",
        data={"error_kind": "infrastructure", "exception": type(err).__name__},
    )


def _agent_message(err: AgentError) -> str:
    msg = str(err)
    if isinstance(err, PathEscapeError):
        return f"Safety violation: {msg}"
    if isinstance(err, PathNotFoundError) and "not found" not in msg:
        return "Path not found: " + msg.removeprefix("Not found: ")
    return msg


class Execution:
    """Runs calls of the tools in ``tools`` in the workspaces of ``workspaces``, writing
    each to ``journal`` (the history of calls per workspace) when there is one."""

    def __init__(self, tools: ToolTable, workspaces: WorkspacePool, journal: CallJournal | None = None) -> None:
        self.tools = tools
        self.workspaces = workspaces
        self.journal = journal

    async def execute(
        self,
        name: str,
        arguments: Arguments,
        workspace: Path | str | None = None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ToolResult:
        """Run one call. Never raises (except on cancellation); see the module table.
        ``on_output`` gets a command's output as it happens (``shell_execute``), and
        ``control`` signals that command (a Ctrl-C passed on).
        A call without ``call_id`` gets a new one (``call_<16 hex>``), so that every call
        can be found, diffed and undone by its id."""
        if call_id is None:
            call_id = "call_" + secrets.token_hex(8)
        started = time.perf_counter()
        result = await self._run(name, arguments, workspace, call_id, subtask_id, on_output, control)
        result = result.capped()
        duration_ms = (time.perf_counter() - started) * 1000.0
        if log.enabled_for(logging.INFO):
            self._log_call(name, workspace, call_id, subtask_id, result, duration_ms)
        if self.journal is not None and workspace is not None:
            ws = self.workspaces.cached(workspace)
            self.journal.record(
                workspace,
                name,
                arguments,
                result,
                duration_ms,
                call_id=call_id,
                subtask_id=subtask_id,
                root=None if ws is None else ws.root,
            )
        return result

    @staticmethod
    def _log_call(
        name: str,
        workspace: Path | str | None,
        call_id: str,
        subtask_id: str | None,
        result: ToolResult,
        duration_ms: float,
    ) -> None:
        """The ``tool.call`` event (made only when it goes somewhere: every call passes here)."""
        kind = (result.data or {}).get("error_kind") if not result.success else None
        log.info(
            "tool.call",
            tool=name,
            workspace=str(workspace) if workspace is not None else None,
            call_id=call_id,
            subtask_id=subtask_id,
            success=result.success,
            error_kind=kind,
            error=result.error[:200] if result.error else None,
            duration_ms=round(duration_ms, 3),
        )

    async def _run(
        self,
        name: str,
        arguments: Arguments,
        workspace: Path | str | None,
        call_id: str | None,
        subtask_id: str | None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            return ToolResult.fail(f"Unknown tool '{name}'. Available tools: {', '.join(self.tools.names())}")
        if isinstance(arguments, str):
            # Models send arguments as a JSON string in OpenAI's format.
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                return ToolResult.fail(f"Invalid arguments for {name}: not valid JSON ({e})")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            return ToolResult.fail(
                f"Invalid arguments for {name}: expected a JSON object, got {type(arguments).__name__}"
            )
        deadline = tool.timeout
        waits = lockwait.Waiting()
        try:
            args = tool.validate(dict(arguments))
            deadline = tool.deadline(args)
            with lockwait.watched() as waits:
                async with asyncio.timeout(deadline):
                    ws = None
                    if workspace is not None:
                        ws = await self.workspaces.workspace(workspace, warm=True)
                    elif tool.needs_workspace:
                        raise ToolError(f"No workspace: {name} needs a workspace directory, and none was given")
                    ctx = ToolContext(
                        workspace=ws, call_id=call_id, subtask_id=subtask_id, on_output=on_output, control=control
                    )
                    return await tool.fn(args, ctx)
        except ToolError as e:
            return ToolResult.fail(e.message, data=e.data)
        except AgentError as e:
            return ToolResult.fail(_agent_message(e), data={"error_code": e.code})
        except SandboxTimeoutError as e:
            return _infra("Sandbox did not answer in time", e)
        except SandboxUnavailableError as e:
            return _infra("Sandbox unavailable", e)
        except ProtocolError as e:
            return _infra("Sandbox protocol error", e)
        except ReserveError as e:  # a limit: nothing was started
            return ToolResult.fail(str(e), data={"error_kind": "limit", "limit": "changelog_reserve"})
        except ChangesNotRecordedError as e:  # the command ran: say so, never "nothing was changed"
            return _infra("Changelog storage failed after the command ran", e)
        except ChangelogDamagedError as e:
            return _infra("Changelog damaged", e)
        except ChangelogStorageError as e:
            # Recorded before writing, so the workspace was not changed.
            return _infra("Changelog storage failed; nothing was changed", e)
        except TimeoutError:
            if waits.cut:
                # The deadline passed before the call had the workspace: it waited for
                # another call's change (one at a time), the sandbox was not asked.
                return ToolResult.fail(
                    f"{name} timed out after {deadline:g}s waiting for another call's change to this workspace "
                    "to finish (a workspace takes one change at a time); try again when it is done",
                    data={"timed_out": True, "waited_for": "workspace"},
                )
            if tool.timeout_for is not None:
                # The tool's own limit (a command's timeout, the kernel's) is enforced in the
                # sandbox, which answers when it is reached; this deadline only adds the slack
                # for that answer. Passing it means the sandbox (or the engine starting it)
                # did not answer: an infrastructure failure, not the call's limit.
                return _infra(
                    "Sandbox did not answer in time",
                    SandboxTimeoutError(
                        f"no answer to {name} within {deadline:g}s, the call's own time limit and the slack "
                        "for its answer (the sandbox or the Docker engine did not respond)"
                    ),
                )
            return ToolResult.fail(f"{name} timed out after {deadline:g}s", data={"timed_out": True})
        except Exception as e:  # a bug in a tool must not take the caller down
            log.exception("tool.internal_error", tool=name, call_id=call_id)
            return ToolResult.fail(
                f"Internal error in {name}: {type(e).__name__}: {e}", data={"error_kind": "internal"}
            )
