"""``run_code``: code in a kernel that keeps its state between calls (the code interpreter).

The model-facing side of the workspace's kernels (``docs/code-interpreter.md``): the code
runs through the harness's :meth:`~worker.harness.SandboxHandle.run_code` in a context of
the workspace's sandbox (the default context of its language unless ``context_id`` names
one), and the execution comes back as the model reads it (:mod:`worker.kernels.toolresult`): stdout,
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
from typing import TYPE_CHECKING

from pydantic import Field

from sandbox.errors import KernelUnavailableError

from .. import kernels
from ..harness import SandboxHandle
from ..kernels.execute import ANSWER_SLACK
from ..kernels.toolresult import execution_result
from ..result import ToolResult
from ..tool import Tool, ToolArgs, ToolContext, ToolError

if TYPE_CHECKING:
    from ..calls import CallJournal
    from ..workspace import Workspace

NAME = "run_code"
MAX_TIMEOUT = 300.0
DEFAULT_TIMEOUT = kernels.DEFAULT_TIMEOUT
#: The registry's deadline beyond the code's own timeout: the kernel's interrupt and the
#: grace before its restart, the host's own wait for the kernel's answer, and a first
#: call's sandbox and kernel start.
DEADLINE_SLACK = kernels.INTERRUPT_GRACE + ANSWER_SLACK + 30.0
#: The most code one call may send (characters).
MAX_CODE_CHARS = kernels.MAX_CODE


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
        description=(
            f"The kernel's language: {', '.join(kernels.LANGUAGES)} (default python). Leave it out with "
            "context_id to use that context's."
        ),
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
    handle = SandboxHandle(_ThisWorkspace(ws), ws.root)
    language = args.language or (None if args.context_id else kernels.DEFAULT_LANGUAGE)
    timeout = min(args.timeout or DEFAULT_TIMEOUT, MAX_TIMEOUT)
    execution: kernels.Execution | None = None
    try:
        async for event in handle.run_code_stream(
            args.code, args.context_id, language, timeout, ctx.call_id, tool=NAME
        ):
            if isinstance(event, kernels.Execution):
                execution = event
            elif isinstance(event, kernels.OutputMessage) and ctx.on_output is not None:
                ctx.on_output(event.kind, event.text.encode("utf-8", "surrogateescape"))
    except kernels.CodeArgumentError as e:  # a context id or a language the harness refused
        raise ToolError(f"Invalid arguments for {NAME}: '{e.field}': {e.message}") from None
    except KernelUnavailableError as e:  # the image lacks the kernel: say what, and how to add it
        raise ToolError(str(e), data={"error_code": e.code, "missing": list(e.missing)}) from None
    if execution is None:  # (the harness always ends with one)
        raise ToolError("The execution ended without a result")
    return execution_result(execution)


def _deadline(a: RunCodeArgs) -> float:
    return min(a.timeout or DEFAULT_TIMEOUT, MAX_TIMEOUT) + DEADLINE_SLACK


TOOLS = [
    Tool(
        name=NAME,
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
