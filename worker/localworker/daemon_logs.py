"""The local worker's logging: a call's events go to the CLI that made it, as ``log``
frames rendered the way that CLI's stderr wants them (console lines on a terminal, JSON
lines otherwise, as ``LOOM_LOG_FORMAT`` says), so ``loom-worker call`` logs the same
through the worker as in-process. Everything else (the worker's start and exit, a peer
refused) goes to the worker's own stderr, its log file, as JSON lines.

Which call an event belongs to is a context variable set in the call's task: asyncio
copies it into the tasks and threads the call starts, so events of the registry, the
sandbox and foreign stdlib loggers (the Docker SDK, httpx) all follow their call.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import structlog
from structlog.typing import EventDict

from ..logging import level_number, renderer, shared_processors

Sink = Callable[[EventDict], None]

#: Where the current call's events go (None: the worker's own log).
SINK: ContextVar[Sink | None] = ContextVar("loom_local_worker_log_sink", default=None)

_json = structlog.processors.JSONRenderer(sort_keys=False)


def lifecycle(event: str, **fields: Any) -> None:
    """Record a step of the worker's life (started, retiring, exit, a peer refused) in its
    own log whatever ``LOOM_LOG_LEVEL`` says: ``loom-worker doctor`` reads the last one
    to say why no worker is running."""
    import datetime

    stamp = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    to_own_log({**fields, "event": event, "level": "info", "logger": "worker.localworker", "timestamp": stamp})


def to_own_log(event_dict: EventDict) -> None:
    """Write an event to the worker's own log (its stderr) as a JSON line."""
    try:
        sys.stderr.write(str(_json(None, "info", dict(event_dict))) + "\n")
        sys.stderr.flush()
    except (ValueError, OSError):
        pass


def _route(logger: Any, method: str, event_dict: EventDict) -> str:
    """Last processor: hand the event to the current call's sink, or render it as JSON
    for the worker's own log."""
    sink = SINK.get()
    if sink is not None:
        sink(event_dict)
        raise structlog.DropEvent
    return str(_json(logger, method, event_dict))


class _Handler(logging.Handler):
    """Foreign stdlib records, routed like structlog's events."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=shared_processors(),
                processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, self._render],
            )
        )

    @staticmethod
    def _render(logger: Any, method: str, event_dict: EventDict) -> str:
        try:
            return _route(logger, method, event_dict)
        except structlog.DropEvent:
            return ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if text:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        except (ValueError, OSError):
            pass


def configure(level: str) -> None:
    """Configure structlog and the stdlib root logger of the worker process. Raises
    ValueError for an unknown level."""
    from ..logging import _StreamLoggerFactory

    numeric = level_number(level)
    structlog.configure(
        processors=[*shared_processors(), structlog.processors.format_exc_info, _route],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_StreamLoggerFactory(None),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    root.handlers[:] = [_Handler()]
    root.setLevel(numeric)


def client_renderer(fmt: Any, tty: bool) -> Callable[[EventDict], str]:
    """How one client's stderr wants an event rendered (``LOOM_LOG_FORMAT``, terminal or not)."""
    render = renderer(fmt, tty)

    def text(event_dict: EventDict) -> str:
        return str(render(None, str(event_dict.get("level", "info")), dict(event_dict)))

    return text
