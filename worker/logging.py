"""structlog, configured once at the entry point (``serve``, ``mcp``, the CLI).

Services write JSON lines; a terminal gets readable console lines. Everything goes to
**stderr**: on the MCP stdio transport stdout is the protocol channel. Standard-library
loggers (uvicorn, mcp, docker) are routed through the same renderer, so a service writes
one format only.

structlog's own events (one per tool call, on the hot path of every request) are rendered
and written directly by structlog, not handed to the stdlib ``logging`` machinery: going
through a ``LogRecord``, a handler and ``ProcessorFormatter`` cost about a third of the
service's own per-request CPU. Only foreign stdlib records take the formatter path.

:func:`redact` runs before rendering and keeps file contents and secrets out of the logs:
values of keys that carry content (``content``, ``old_str``, ``arguments``, ``stdout``...)
are replaced by their size, keys that look like credentials by ``"[redacted]"``, and every
other long string is cut.

Library code never calls this: it logs through :func:`sandbox.logs.get_logger`, which is
silent until an application configures logging (see that module). Only our entry points
(the CLI, ``serve``, ``mcp``, the CLI's local worker) configure it, to **stderr** or a file.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import MutableMapping
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor

from sandbox.logs import CONTENT_KEYS, MAX_FIELD_CHARS, SECRET_MARKERS, redact

__all__ = [
    "CONTENT_KEYS",
    "MAX_FIELD_CHARS",
    "SECRET_MARKERS",
    "configure_logging",
    "is_configured",
    "level_number",
    "redact",
    "renderer",
    "shared_processors",
]

_configured = False


def _drop_color_message(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> EventDict:
    # uvicorn duplicates its message with ANSI colours in this extra field.
    event_dict.pop("color_message", None)
    return dict(event_dict)


def level_number(level: str) -> int:
    """The stdlib number of a level name (``info``, ``WARNING``...). Raises ValueError."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"Unknown log level {level!r}")
    return numeric


def shared_processors() -> list[Processor]:
    """What every event goes through before it is rendered (ours and foreign stdlib ones)."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _drop_color_message,
        redact,
    ]


def renderer(fmt: Literal["auto", "json", "console"], tty: bool) -> Processor:
    """The last processor: console lines (coloured on a terminal) or JSON lines. ``auto``
    means console when the output is a terminal (``tty``), JSON otherwise."""
    if fmt == "console" or (fmt == "auto" and tty):
        # Tracebacks without the frames' local variables (structlog's default shows them):
        # a local may hold a credential (a secret's value, the API token) or a file's content.
        tracebacks = (
            structlog.dev.RichTracebackFormatter(show_locals=False)
            if getattr(structlog.dev, "rich", None) is not None
            else structlog.dev.plain_traceback  # (better-exceptions would show them too)
        )
        return structlog.dev.ConsoleRenderer(colors=tty, exception_formatter=tracebacks)
    return structlog.processors.JSONRenderer(sort_keys=False)


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto",
    level: str = "info",
    *,
    stream: TextIO | None = None,
) -> None:
    """Configure structlog and the stdlib root logger (idempotent: later calls reconfigure).

    ``auto`` means console when ``stream`` is a terminal, JSON otherwise.
    Raises ValueError for an unknown ``level``.
    """
    global _configured
    out = stream or sys.stderr
    numeric = level_number(level)
    render = renderer(fmt, out.isatty())
    shared = shared_processors()
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, render],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_StreamLoggerFactory(stream),
        # Not cached, so tests can still capture with structlog.testing.capture_logs.
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, render],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # uvicorn installs its own handlers unless told otherwise; route them to the root.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    _configured = True


class _StreamLogger:
    """structlog's final logger: writes each rendered line to the stream (``None`` means
    whatever ``sys.stderr`` is at the time). As ``logging.Handler`` does, a closed or
    broken stream never raises into the code that logs."""

    def __init__(self, file: TextIO | None, name: str) -> None:
        self._file = file
        self.name = name  # read by structlog.stdlib.add_logger_name

    def msg(self, message: str) -> None:
        out = self._file if self._file is not None else sys.stderr
        try:
            with _WRITE_LOCK:
                out.write(message + "\n")
                out.flush()
        except (ValueError, OSError):
            pass

    log = debug = info = warn = warning = error = err = critical = exception = fatal = failure = msg


_WRITE_LOCK = threading.Lock()


class _StreamLoggerFactory:
    """One logger per name (structlog asks again for every event, as loggers are not
    cached, so that ``capture_logs`` keeps working)."""

    def __init__(self, file: TextIO | None) -> None:
        self._file = file
        self._loggers: dict[str, _StreamLogger] = {}

    def __call__(self, *args: Any) -> _StreamLogger:
        # structlog.get_logger("worker.http") passes the name through; an unnamed logger
        # is named after the module that logs, as the stdlib factory does.
        name = args[0] if args and isinstance(args[0], str) else _caller_module()
        logger = self._loggers.get(name)
        if logger is None:
            logger = self._loggers[name] = _StreamLogger(self._file, name)
        return logger


def _caller_module() -> str:
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(("structlog", __name__)):
        frame = frame.f_back
    return str(frame.f_globals.get("__name__", "?"))


def is_configured() -> bool:
    return _configured
