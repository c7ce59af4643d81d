"""What a code execution answers, in the names of E2B's code interpreter
(``e2b_code_interpreter.models``) where it has them: :class:`Result` (one display or the
last expression's value, as a MIME bundle), :class:`Logs`, :class:`ExecutionError`,
:class:`Execution`; and what streams before it: :class:`OutputMessage`. Beyond E2B's:
``Execution.outcome``/``message`` (how it ended, said for a model), ``context_id``,
``call_id`` and ``files_changed`` (the changelog's record of what it wrote).

Each has ``to_dict()``: the JSON every surface sends (the HTTP route's NDJSON lines, the
CLI's ``--json``), one ``type`` per kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

#: How an execution ended: ``ok``; ``error`` (the code raised: see ``error``);
#: ``interrupted`` (it ran past its timeout and stopped at the interrupt, as Ctrl-C: the
#: context's state is kept); ``restarted`` (it did not stop at the interrupt: the kernel
#: was restarted, its state is lost); ``kernel_died`` (the kernel ended under it: out of
#: memory, ``os._exit``...; a new one starts at the next call, the state is lost).
Outcome = Literal["ok", "error", "interrupted", "restarted", "kernel_died"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "error", "interrupted", "restarted", "kernel_died")

#: The MIME types a :class:`Result` has a field for (E2B's), in that order.
MIME_FIELDS: dict[str, str] = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (IPython colours its tracebacks)."""
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class CodeContext:
    """A context: a kernel of ``language`` whose state (variables, imports) lasts between
    executions, started in ``cwd`` (as the sandbox names it). ``running``: its kernel is up
    now (a context whose kernel died starts a new one at its next execution)."""

    id: str
    language: str
    cwd: str
    running: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd, "running": self.running}


@dataclass(frozen=True)
class OutputMessage:
    """Text the code printed, as it came: ``kind`` ``stdout`` or ``stderr``. (E2B's has
    ``line``/``error``; here the stream's name and its text, which may hold several lines
    or part of one.) ``timestamp``: Unix time in nanoseconds, as E2B's."""

    kind: Literal["stdout", "stderr"]
    text: str
    timestamp: int = 0

    @property
    def error(self) -> bool:
        return self.kind == "stderr"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "text": self.text, "timestamp": self.timestamp}


@dataclass
class Result:
    """One thing to show: a ``display()`` or the value of the code's last expression
    (``is_main_result``), by MIME type. ``png``, ``jpeg`` and ``pdf`` are base64 (as E2B's);
    ``json`` is the value itself; the rest are text. ``extra``: the other MIME types the
    kernel sent (``application/vnd...``), by their names, and ``metadata`` when there was
    any (an image's ``width``/``height``)."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    is_main_result: bool = False
    extra: dict[str, Any] | None = None

    def formats(self) -> list[str]:
        """The fields that hold something (E2B's ``formats()``), then ``extra``'s keys."""
        out = [name for name in MIME_FIELDS.values() if getattr(self, name) is not None]
        return out + list(self.extra or {})

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "result"}
        for name in MIME_FIELDS.values():
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        d["is_main_result"] = self.is_main_result
        if self.extra:
            d["extra"] = self.extra
        return d


@dataclass
class Logs:
    """What the code printed, each as the pieces it came in (E2B's)."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"stdout": list(self.stdout), "stderr": list(self.stderr)}


@dataclass(frozen=True)
class ExecutionError:
    """What the code raised: the exception's class ``name`` (``ZeroDivisionError``), its
    ``value`` (``division by zero``) and the ``traceback`` as text without terminal
    colours."""

    name: str
    value: str
    traceback: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "traceback": self.traceback}


@dataclass
class Execution:
    """One execution's answer: its ``results`` (displays in order, the main result among
    them), ``logs``, ``error`` (None unless the code raised, or was interrupted:
    ``KeyboardInterrupt``), the context's ``execution_count`` after it (None when the
    kernel did not say: it died or was restarted); ``context_id``, ``call_id``;
    ``files_changed``: the workspace files it changed (recorded in the changelog under
    ``call_id``, undoable); ``outcome`` (see :data:`Outcome`) and ``message``: what
    happened, for a model (``"timed out after 2 s: interrupted; the context's state is
    kept"``), empty when the code simply ran."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None
    context_id: str = ""
    call_id: str = ""
    files_changed: list[str] = field(default_factory=list)
    outcome: Outcome = "ok"
    message: str = ""
    duration_ms: float = 0.0

    @property
    def text(self) -> str | None:
        """The main result's text (E2B's ``Execution.text``)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def success(self) -> bool:
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "execution",
            "results": [r.to_dict() for r in self.results],
            "logs": self.logs.to_dict(),
            "error": self.error.to_dict() if self.error is not None else None,
            "execution_count": self.execution_count,
            "context_id": self.context_id,
            "call_id": self.call_id,
            "files_changed": list(self.files_changed),
            "outcome": self.outcome,
            "message": self.message,
            "duration_ms": round(self.duration_ms, 3),
        }


#: What :meth:`SandboxHandle.run_code_stream` yields: output and displays as they come,
#: then the :class:`Execution` (always last).
CodeEvent = OutputMessage | Result | Execution
