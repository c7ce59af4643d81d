"""structlog, configured once at the entry point (``serve``, ``mcp``, the CLI).

Services write JSON lines; a terminal gets readable console lines. Everything goes to
**stderr**: on the MCP stdio transport stdout is the protocol channel. Standard-library
loggers (uvicorn, mcp, docker) are routed through the same renderer, so a service writes
one format only.

:func:`redact` runs before rendering and keeps file contents and secrets out of the logs:
values of keys that carry content (``content``, ``old_str``, ``arguments``, ``stdout``...)
are replaced by their size, keys that look like credentials by ``"[redacted]"``, and every
other long string is cut.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor

#: Keys whose values are file contents, command output or arguments that may embed them.
CONTENT_KEYS = frozenset(
    {
        "content",
        "old_str",
        "new_str",
        "edits",
        "arguments",
        "args",
        "stdout",
        "stderr",
        "output",
        "data",
        "body",
    }
)
#: Substrings of keys that name credentials.
SECRET_MARKERS = ("token", "secret", "password", "passwd", "authorization", "api_key", "apikey", "cookie")
#: Longest string kept as is in any other field.
MAX_FIELD_CHARS = 512

_configured = False


def _size(value: Any) -> str:
    if isinstance(value, str | bytes):
        return f"[{len(value)} chars]" if isinstance(value, str) else f"[{len(value)} bytes]"
    if isinstance(value, list | tuple | dict):
        return f"[{type(value).__name__} of {len(value)}]"
    return "[omitted]"


def redact(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: drop file contents and secrets, cut long strings."""
    for key in list(event_dict):
        if key == "event":
            continue
        low = key.lower()
        value = event_dict[key]
        if any(m in low for m in SECRET_MARKERS):
            event_dict[key] = "[redacted]"
        elif low in CONTENT_KEYS:
            event_dict[key] = _size(value)
        elif isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            event_dict[key] = value[:MAX_FIELD_CHARS] + f"...[{len(value) - MAX_FIELD_CHARS} more chars]"
    return event_dict


def _drop_color_message(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> EventDict:
    # uvicorn duplicates its message with ANSI colours in this extra field.
    event_dict.pop("color_message", None)
    return dict(event_dict)


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
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"Unknown log level {level!r}")
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    renderer: Processor = (
        structlog.dev.ConsoleRenderer(colors=out.isatty())
        if use_console
        else structlog.processors.JSONRenderer(sort_keys=False)
    )
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _drop_color_message,
        redact,
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        # Not cached, so tests can still capture with structlog.testing.capture_logs.
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
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


def is_configured() -> bool:
    return _configured
