"""The size of one request, on every surface: the one place its limit lives.

A request (a tool call's arguments, an MCP message, a frame to the CLI's local worker, an
HTTP body) larger than ``LOOM_MAX_BODY_BYTES`` is refused *while it is read*: what was
read of it is dropped at the limit and the rest is never held, so an oversized request
costs the worker at most the limit in memory, and several at once cannot exhaust the
host. The default is the largest argument a tool takes, ``shell_execute``'s stdin of
16 MiB as base64 (21.3 MiB; ``write_file`` takes 10 MiB of content), with room for JSON's
escaping and the call's other fields.

Standard library only (the CLI reads it on every call, before anything heavy is imported):
``worker.settings`` takes its default from here, the CLI and the local worker's client
read the environment variable themselves.
"""

from __future__ import annotations

import os

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

#: The environment variable (``Settings.max_body_bytes``).
ENV = "LOOM_MAX_BODY_BYTES"
#: Its default: 24 MiB.
MAX_REQUEST_BYTES = 24 << 20
#: The smallest value it may take.
MIN_REQUEST_BYTES = 1024


def max_request_bytes(environ: Mapping[str, str] | None = None) -> int:
    """``LOOM_MAX_BODY_BYTES`` as the environment says, else the default (also for a value
    that is not a whole number of at least :data:`MIN_REQUEST_BYTES`, which the settings
    refuse where they are read)."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    try:
        value = int(raw)
    except ValueError:
        return MAX_REQUEST_BYTES
    return value if value >= MIN_REQUEST_BYTES else MAX_REQUEST_BYTES


def too_large(limit: int, size: int | None = None) -> str:
    """The message of a request refused as larger than ``limit`` bytes (``size``: its
    size, where known before reading it)."""
    what = "" if size is None else f" {size} bytes,"
    return f"Request too large:{what} over the limit of {limit} bytes (LOOM_MAX_BODY_BYTES); refused while reading it"
