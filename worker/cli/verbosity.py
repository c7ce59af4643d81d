"""How much the ``loom-worker`` command logs: quiet by default, ``-v`` / ``-vv`` for more.

Every command writes its log lines to stderr at **warning** and above by default, so a CI
step's stderr holds the problems, not a line per tool call. ``-v`` shows info (one line
per tool call, a sandbox started...), ``-vv`` debug. ``LOOM_LOG_LEVEL``, when set, is the
level instead of the quiet default; a flag, when given, wins over it. The services
(``serve``, ``mcp``) keep their documented default: ``LOOM_LOG_LEVEL`` (``info`` unless
set), and the flags there too.

The flags go anywhere a command's options go (``loom-worker -v call ...`` or ``loom-worker
call ... -v``). Standard library only: this runs on every ``call``.

The CLI's local worker filters its calls' events at its own level (``LOOM_LOG_LEVEL``, part
of its key) before the client's floor: a flag asking for more than that level sets
``LOOM_LOG_LEVEL`` for this process and what it starts (:func:`apply`), so ``-vv`` gets a
worker of its own that logs debug events.
"""

from __future__ import annotations

import os
import sys

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import MutableMapping

    from ..settings import Settings

#: The spellings of the flag ``parse_call_fast`` and :func:`split_leading` know, and their count.
FLAGS = {"-v": 1, "--verbose": 1, "-vv": 2, "-vvv": 3}
#: What the command logs without a flag or ``LOOM_LOG_LEVEL``.
QUIET = "warning"
ENV = "LOOM_LOG_LEVEL"
_ORDER = ("debug", "info", "warning", "error", "critical")
HELP = "More log lines on stderr: -v info, -vv debug (default: warnings and errors; LOOM_LOG_LEVEL)."

#: This process's level, decided once by :func:`apply` at the entry point (None: not yet).
_level: str | None = None
#: Whether the level came from a flag or LOOM_LOG_LEVEL (a service's default is its own).
_asked = False


def add_flag(parser: argparse.ArgumentParser, dest: str = "verbose") -> None:
    """Add ``-v/--verbose`` (a count) to ``parser``. Sub-commands' flags default to
    nothing set (``SUPPRESS``), so a sub-parser never resets what a parent counted."""
    import argparse

    parser.add_argument("-v", "--verbose", action="count", dest=dest, default=argparse.SUPPRESS, help=HELP)


def split_leading(argv: list[str]) -> tuple[int, list[str]]:
    """The count of the verbosity flags in front of the command (``loom-worker -vv call``)
    and the rest of ``argv``."""
    count = 0
    i = 0
    while i < len(argv) and argv[i] in FLAGS:
        count += FLAGS[argv[i]]
        i += 1
    return count, argv[i:]


def level_of(count: int, env_level: str | None) -> str | None:
    """The level asked for: a flag's (``-v`` info, ``-vv`` debug), else ``LOOM_LOG_LEVEL``
    when set, else None (the command's default)."""
    if count >= 2:
        return "debug"
    if count == 1:
        return "info"
    return env_level.strip().lower() if env_level and env_level.strip() else None


def _rank(name: str) -> int:
    try:
        return _ORDER.index(name.lower())
    except ValueError:  # a level logging knows under another name (WARN, FATAL): as given
        return 1


def apply(count: int, environ: MutableMapping[str, str] | None = None) -> str | None:
    """Decide this process's level from the flags' ``count`` and ``LOOM_LOG_LEVEL`` (read
    from ``environ``, default ``os.environ``), once, at the entry point. Returns the level
    asked for (None: the command's default). A flag asking for more than the local worker
    would log at (``LOOM_LOG_LEVEL``, else info) sets ``LOOM_LOG_LEVEL`` in ``environ``."""
    global _level, _asked
    env = os.environ if environ is None else environ
    asked = level_of(count, env.get(ENV))
    if count and asked is not None and _rank(asked) < _rank(env.get(ENV) or "info"):
        env[ENV] = asked
    _asked = asked is not None
    _level = asked or QUIET
    return asked


def level(settings_level: str | None = None, *, service: bool = False) -> str:
    """This process's log level. A service (``serve``, ``mcp``) without a flag logs at
    ``settings_level`` (``LOOM_LOG_LEVEL``, default info); every other command at the
    level :func:`apply` decided (warning unless asked)."""
    if service and not _asked:
        return settings_level or "info"
    if _level is None:  # a command run without main() (tests): as main would decide
        apply(0, dict(os.environ))
    return _level or QUIET


def configure(settings: Settings, *, service: bool = False) -> None:
    """Configure logging for this command (stderr; ``LOOM_LOG_FORMAT``), at :func:`level`.
    A level logging does not know is a usage error naming ``LOOM_LOG_LEVEL``: exit 2
    (raises SystemExit)."""
    from ..logging import configure_logging

    chosen = level(settings.log_level, service=service)
    try:
        configure_logging(settings.log_format, chosen, stream=sys.stderr)
    except ValueError:
        print(f"loom-worker: error: {ENV}: unknown log level {chosen!r} (debug, info, warning, error)", file=sys.stderr)
        raise SystemExit(2) from None
