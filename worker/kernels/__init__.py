"""Code contexts and executions (issue 41): a stateful code interpreter per workspace.

A *context* is a Jupyter kernel (IPython's: ``display()``, rich reprs and matplotlib's
inline backend work) run in the workspace's sandbox as one of its background processes;
its state (variables, imports, loaded data) lasts between executions. An *execution*
runs code in one, streams its output and displays as they come and answers an
:class:`Execution` in E2B's code interpreter's terms, recorded in the changelog like a
command. The harness API (``registry.sandbox(ws).run_code(...)``), HTTP
(``/v1/workspaces/{id}/code/...``), the CLI (``loom-worker run-code``) and the model's
``run_code`` tool are built on these. See docs/code-interpreter.md.

- :mod:`.model`: Result, Logs, ExecutionError, Execution, OutputMessage, CodeContext
- :mod:`.contexts`: create, list, restart, delete; the default context of a language
- :mod:`.execute`: one execution (recorded, timed, streamed, interrupted)
- :mod:`.wire`: the bridge's events read as untrusted input, and the caps
- :mod:`.toolresult`: an Execution as the ToolResult a model reads (``run_code``'s answer)
"""

from .contexts import (
    DEFAULT_LANGUAGE,
    LANGUAGES,
    CodeArgumentError,
    create_context,
    default_context_id,
    delete_context,
    list_contexts,
    resolve_context,
    restart_context,
)
from .execute import DEFAULT_TIMEOUT, INTERRUPT_GRACE, MAX_CODE, MAX_TIMEOUT, interrupt, run, stream
from .execute import check as check_code
from .model import (
    MIME_FIELDS,
    OUTCOMES,
    CodeContext,
    CodeEvent,
    Execution,
    ExecutionError,
    Logs,
    Outcome,
    OutputMessage,
    Result,
    strip_ansi,
)
from .wire import MAX_RESULT_COUNT, MAX_RESULTS, MAX_STREAM, MAX_VALUE

__all__ = [
    "DEFAULT_LANGUAGE",
    "DEFAULT_TIMEOUT",
    "INTERRUPT_GRACE",
    "LANGUAGES",
    "MAX_CODE",
    "MAX_RESULTS",
    "MAX_RESULT_COUNT",
    "MAX_STREAM",
    "MAX_TIMEOUT",
    "MAX_VALUE",
    "MIME_FIELDS",
    "OUTCOMES",
    "CodeArgumentError",
    "CodeContext",
    "CodeEvent",
    "Execution",
    "ExecutionError",
    "Logs",
    "Outcome",
    "OutputMessage",
    "Result",
    "check_code",
    "create_context",
    "default_context_id",
    "delete_context",
    "interrupt",
    "list_contexts",
    "resolve_context",
    "restart_context",
    "run",
    "stream",
    "strip_ansi",
]
