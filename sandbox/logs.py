"""How library code logs: quiet unless the application configures logging.

Every module of ``sandbox`` and ``worker`` logs through :func:`get_logger` (structlog's
call style: ``log.info("tool.call", tool=..., duration_ms=...)``). Where an event goes is
decided when it is logged:

- **structlog is configured** (by our entry points through
  :func:`worker.logging.configure_logging`, by the application, or by
  ``structlog.testing.capture_logs``): through structlog's pipeline as configured. Our
  CLI and service render and write each event directly there (a ``LogRecord``, a handler
  and a formatter per event cost about a third of the service's own per-request CPU);
- **otherwise**: the standard :mod:`logging` logger of the same name (``worker.registry``,
  ``sandbox.docker``, ...), one record per event whose message is ``event key=value ...``
  and whose ``loom`` attribute holds the fields, redacted by :func:`redact` (no file
  contents, no secrets). The ``worker`` and ``sandbox`` loggers carry a ``NullHandler``,
  so nothing is printed, and nothing reaches Python's last-resort handler, unless the
  application configures logging (``logging.basicConfig(level=logging.INFO)``, or a
  handler on those two loggers).

Why not structlog's defaults: unconfigured, structlog prints every event to **stdout**,
which corrupts any program that speaks a protocol there (an MCP stdio server, a JSON-lines
agent loop). A library must not configure structlog either: that setting is global and
belongs to the application.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from structlog.typing import EventDict

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

#: The loggers every library logger descends from; each gets a NullHandler.
ROOT_LOGGERS = ("sandbox", "worker")
for _name in ROOT_LOGGERS:
    logging.getLogger(_name).addHandler(logging.NullHandler())

_configured = structlog.is_configured


def _size(value: Any) -> str:
    if isinstance(value, str | bytes):
        return f"[{len(value)} chars]" if isinstance(value, str) else f"[{len(value)} bytes]"
    if isinstance(value, list | tuple | dict):
        return f"[{type(value).__name__} of {len(value)}]"
    return "[omitted]"


#: What :func:`redact` does with a key: "secret", "content" or "" (cut long strings only).
#: Keys are a small, fixed vocabulary (the call sites' keyword names), so it is cached.
_KEY_ACTION: dict[str, str] = {}


def _action(key: str) -> str:
    action = _KEY_ACTION.get(key)
    if action is None:
        low = key.lower()
        action = "secret" if any(m in low for m in SECRET_MARKERS) else "content" if low in CONTENT_KEYS else ""
        if len(_KEY_ACTION) < 4096:  # a bound, should a caller ever log arbitrary keys
            _KEY_ACTION[key] = action
    return action


def redact(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: drop file contents and secrets, cut long strings."""
    for key, value in list(event_dict.items()):
        if key == "event":
            continue
        action = _action(key)
        if action == "secret":
            event_dict[key] = "[redacted]"
        elif action == "content":
            event_dict[key] = _size(value)
        elif isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            event_dict[key] = value[:MAX_FIELD_CHARS] + f"...[{len(value) - MAX_FIELD_CHARS} more chars]"
    return event_dict


#: structlog's live configuration, which :meth:`LibraryLogger._bound` compares by identity
#: (no public accessor is cheap: ``structlog.get_config()`` copies it). None if a future
#: structlog moves it: every event then goes through the lazy proxy, as before.
_STRUCTLOG_CONFIG: Any = getattr(getattr(structlog, "_config", None), "_CONFIG", None)


class LibraryLogger:
    """A named logger for library code; see the module docstring for where events go."""

    __slots__ = ("_cache", "_proxy", "_std", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._std = logging.getLogger(name)
        self._proxy = structlog.get_logger(name)  # lazy: reads structlog's config per event
        self._cache: tuple[Any, Any, Any, Any, Any] | None = None

    def _bound(self) -> Any:
        """The logger structlog's configuration makes now. The lazy proxy binds a new one
        (its wrapper, its output logger) for every event: ~8 µs, a twentieth of a
        ``read_file``, even for an event the level filters out. So the bound one is kept
        while the configuration's wrapper, processors, context class and logger factory are
        the same objects (``capture_logs`` and ``configure`` replace them)."""
        c = _STRUCTLOG_CONFIG
        if c is None:
            return self._proxy
        cached = self._cache
        wrapper, processors, context, factory = (
            c.default_wrapper_class,
            c.default_processors,
            c.default_context_class,
            c.logger_factory,
        )
        if (
            cached is not None
            and cached[0] is wrapper
            and cached[1] is processors
            and cached[2] is context
            and cached[3] is factory
        ):
            return cached[4]
        bound = self._proxy.bind()
        self._cache = (wrapper, processors, context, factory, bound)
        return bound

    def enabled_for(self, level: int) -> bool:
        """Whether an event at ``level`` would go anywhere, so a hot path can skip making
        one (``tool.call``'s fields, on every call)."""
        if _configured():
            check = getattr(self._bound(), "is_enabled_for", None)
            return True if check is None else bool(check(level))
        return self._std.isEnabledFor(level)

    # Each method tests the mode itself: on a service's hot path (one tool.call event per
    # request) a shared helper would be one more Python call per event.

    def debug(self, event: str, **kw: Any) -> None:
        if _configured():
            self._bound().debug(event, **kw)
        elif self._std.isEnabledFor(logging.DEBUG):
            self._emit(logging.DEBUG, event, kw)

    def info(self, event: str, **kw: Any) -> None:
        if _configured():
            self._bound().info(event, **kw)
        elif self._std.isEnabledFor(logging.INFO):  # the common case in a library: one cached check
            self._emit(logging.INFO, event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        if _configured():
            self._bound().warning(event, **kw)
        elif self._std.isEnabledFor(logging.WARNING):
            self._emit(logging.WARNING, event, kw)

    def error(self, event: str, **kw: Any) -> None:
        if _configured():
            self._bound().error(event, **kw)
        elif self._std.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        """An error with the exception being handled attached."""
        kw.setdefault("exc_info", True)
        if _configured():
            self._bound().error(event, **kw)
        elif self._std.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, event, kw)

    def _emit(self, level: int, event: str, kw: dict[str, Any]) -> None:
        exc_info = kw.pop("exc_info", None)
        fields = redact(None, "", kw)
        text = " ".join([event, *(f"{k}={v!r}" for k, v in fields.items())])
        # stacklevel 3: the record names the module that logged, not this one.
        self._std.log(level, "%s", text, exc_info=exc_info, extra={"loom": {"event": event, **fields}}, stacklevel=3)


def get_logger(name: str) -> LibraryLogger:
    """The logger ``name`` (``"worker.registry"``, ``"sandbox.docker"``...) for library code."""
    return LibraryLogger(name)
