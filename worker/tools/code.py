"""``run_code``: code in a kernel that keeps its state between calls (the code interpreter).

The model-facing side of the workspace's kernels (``docs/code-interpreter.md``): the code
runs through the harness's :meth:`~worker.harness.SandboxHandle.run_code` in a context of
the workspace's sandbox (the default context of its language unless ``context_id`` names
one), and the execution comes back as the model reads it (:mod:`.code_results`): stdout,
stderr, each result with its formats named, charts as images (``ToolResult.images``), the
error with its traceback.

The two channels: code that raised, a timeout (the kernel interrupted, or restarted when
that did not stop it) and a kernel that died are ``success=false`` with a message saying
what happened and what state was lost; a refused argument (an unknown context, a
language without a kernel, an image without IPython) is a ToolError; the sandbox's own
failures propagate as theirs (the registry reports them as infrastructure). What the code
writes in the workspace is recorded in the changelog under the call's id.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..result import ToolResult
from ..tool import Tool, ToolArgs, ToolContext, ToolError
from .code_results import execution_result

if TYPE_CHECKING:
    from ..calls import CallJournal
    from ..workspace import Workspace

MAX_TIMEOUT = 300.0
DEFAULT_TIMEOUT = 60.0
#: The registry's deadline beyond the code's own timeout: the kernel's interrupt, then
#: its restart when that does not stop the code, and a first call's sandbox and kernel start.
DEADLINE_SLACK = 60.0
#: The most code one call may send.
MAX_CODE_CHARS = 1 << 20


class RunCodeArgs(ToolArgs):
    code: str = Field(
        max_length=MAX_CODE_CHARS,
        description=(
            "The code to run, as a notebook cell: the value of its last expression is the result; "
            "display() and charts (matplotlib) are shown as they are produced."
        ),
    )
    language: str | None = Field(
        None,
        min_length=1,
        max_length=32,
        pattern=r"^[a-z][a-z0-9+-]*$",
        description="The kernel's language: python (the default). Leave it out to use context_id's.",
    )
    context_id: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description=(
            "Run in this context (a kernel with its own variables, made through the harness API or the "
            "dashboard); default: the workspace's default context of the language, shared by every call."
        ),
    )
    timeout: float | None = Field(
        None,
        gt=0,
        description=(
            f"Seconds before the code is interrupted (its state is kept; if it does not stop, the kernel is "
            f"restarted and its state lost): default {DEFAULT_TIMEOUT:g}, at most {MAX_TIMEOUT:g}."
        ),
    )


class _ThisWorkspace:
    """The harness handle's registry for one call: this workspace, and no journal (the
    registry journals the tool call itself)."""

    journal: CallJournal | None = None

    def __init__(self, ws: Workspace) -> None:
        self._ws = ws

    async def workspace(self, path: Path | str) -> Workspace:
        return self._ws


async def run_code(args: RunCodeArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    if not args.code.strip():
        raise ToolError("Empty code: send the code to run in 'code'")
    from ..harness import SandboxHandle

    handle: Any = SandboxHandle(_ThisWorkspace(ws), ws.root)
    language = args.language or (None if args.context_id else "python")
    timeout = min(args.timeout or DEFAULT_TIMEOUT, MAX_TIMEOUT)
    try:
        if ctx.on_output is None:
            execution = await handle.run_code(
                args.code, context=args.context_id, language=language, timeout=timeout, call_id=ctx.call_id
            )
        else:
            execution = None
            async for event in handle.run_code_stream(
                args.code, context=args.context_id, language=language, timeout=timeout, call_id=ctx.call_id
            ):
                kind = getattr(event, "kind", None)
                if kind in ("stdout", "stderr"):
                    ctx.on_output(kind, str(event.text).encode("utf-8", "surrogateescape"))
                elif hasattr(event, "outcome"):
                    execution = event
            if execution is None:
                raise ToolError("The execution ended without a result")
    except ValueError as e:  # an argument the harness refused (a context it has not)
        raise ToolError(str(e)) from None
    return execution_result(execution)


def _deadline(a: RunCodeArgs) -> float:
    return min(a.timeout or DEFAULT_TIMEOUT, MAX_TIMEOUT) + DEADLINE_SLACK


TOOLS = [
    Tool(
        name="run_code",
        description=(
            "Run Python code in a Jupyter (IPython) kernel inside the workspace's sandbox (no network). The kernel "
            "keeps its state between calls: variables, imports and loaded data stay for the next call. Returns "
            "stdout, stderr, the value of the last expression (Out[n]), displayed objects, charts as images "
            "(matplotlib figures are shown without plt.show()), and the error with its traceback. The working "
            f"directory is the workspace. timeout defaults to {DEFAULT_TIMEOUT:g} s, at most {MAX_TIMEOUT:g} s."
        ),
        args_model=RunCodeArgs,
        fn=run_code,
        timeout=DEFAULT_TIMEOUT + DEADLINE_SLACK,
        mutating=True,
        timeout_for=_deadline,
        tags=("code", "python", "data"),
    ),
]
