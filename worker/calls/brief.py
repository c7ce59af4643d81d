"""One tool call as the call journal keeps it: a short, redacted line.

The journal is a history to look at (the dashboard's timeline, ``GET .../calls``), not a
replay log, so a record holds *what* was asked and *how it went*, never file contents:
values of keys that carry content (``content``, ``old_str``, ``edits``...) become their
size, keys that look like credentials become ``"[redacted]"``, ``KEY=value`` and
``Bearer`` secrets inside a string (a command) are masked, and every other string is cut.
The same key lists as the structured logs' redaction (:mod:`worker.logging`).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from ..jsontext import finite
from ..logging import CONTENT_KEYS, SECRET_MARKERS
from ..result import ToolResult

#: Record format version (``v``).
VERSION = 1
#: Longest string argument kept (a command, a path, a pattern).
MAX_ARG_CHARS = 240
#: Arguments kept per call (a custom tool may take many).
MAX_ARGS = 16
#: Paths of ``files_changed`` kept; ``files_count`` says how many there were.
MAX_FILES = 20
#: Characters of the error kept.
MAX_ERROR_CHARS = 300

# ``API_KEY=abc``, ``--password hunter2``, ``Authorization: Bearer abc``, ``token: abc``:
# a command line is kept, the secret in it is not.
_SECRET_VALUE = re.compile(
    r"(?i)(\b[\w.-]*(?:token|secret|passw(?:or)?d|api[_-]?key|apikey|authorization|cookie)[\w.-]*"
    r"(?:\s*[=:]\s*|\s+)(?:bearer\s+|basic\s+)?)(\"[^\"]*\"|'[^']*'|[^\s\"';&|]+)"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
# Whether a string could hold a credential at all: one scan in C, no lowering.
_ANY_MARKER = re.compile("|".join(re.escape(m) for m in (*SECRET_MARKERS, "bearer", "basic")), re.IGNORECASE)
#: What :func:`brief_args` does with an argument's name ("secret", "content", or ""): the
#: names are a tool's fields, a small vocabulary, so it is decided once per name.
_KEY_ACTION: dict[str, str] = {}


def _size(value: Any) -> str:
    if isinstance(value, str):
        return f"[{len(value)} chars]"
    if isinstance(value, list | tuple | dict):
        return f"[{type(value).__name__} of {len(value)}]"
    return "[omitted]"


def mask_secrets(text: str) -> str:
    """``text`` with credential values (``TOKEN=...``, ``Bearer ...``) replaced."""
    if _ANY_MARKER.search(text) is None:
        return text  # the common case: one scan in C
    text = _SECRET_VALUE.sub(lambda m: m.group(1) + "[redacted]", text)
    return _BEARER.sub(lambda m: m.group(1) + " [redacted]", text)


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"…[+{len(text) - limit} chars]"


def brief_args(arguments: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """The arguments as the journal shows them (see the module docstring)."""
    if isinstance(arguments, str):
        # OpenAI-style arguments: the JSON string the model produced.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return {"(arguments)": f"[not JSON: {len(arguments)} chars]"}
    if arguments is None:
        return {}
    if not isinstance(arguments, Mapping):
        return {"(arguments)": _size(arguments)}
    out: dict[str, Any] = {}
    for i, (k, v) in enumerate(arguments.items()):
        if i == MAX_ARGS:
            out["…"] = f"{len(arguments) - MAX_ARGS} more"
            break
        key = cut(str(k), 64)
        action = _KEY_ACTION.get(key)
        if action is None:
            low = key.lower()
            action = "secret" if any(m in low for m in SECRET_MARKERS) else "content" if low in CONTENT_KEYS else ""
            if len(_KEY_ACTION) < 4096:  # a bound: custom tools may name their fields anything
                _KEY_ACTION[key] = action
        if action == "secret":
            out[key] = "[redacted]"
        elif action == "content":
            out[key] = _size(v)
        elif isinstance(v, str):
            out[key] = cut(mask_secrets(v), MAX_ARG_CHARS)
        elif v is None or isinstance(v, bool | int | float):
            out[key] = finite(v)  # a refused "timeout": Infinity stays JSON a browser parses
        elif isinstance(v, list) and len(v) <= 4 and all(isinstance(x, int | float) for x in v):
            out[key] = finite(v)  # a line_range
        else:
            out[key] = _size(v)
    return out


def call_record(
    tool: str,
    arguments: Mapping[str, Any] | str | None,
    result: ToolResult,
    duration_ms: float,
    *,
    call_id: str | None,
    subtask_id: str | None,
    finished: float | None = None,
) -> dict[str, Any]:
    """The journal record of one finished call (``result`` as the registry returns it:
    capped, its ``files_changed`` quoted)."""
    data = result.data or {}
    finished = time.time() if finished is None else finished
    files = result.files_changed
    error = result.error
    return {
        "v": VERSION,
        "ts": round(finished, 6),
        "started": round(finished - duration_ms / 1000.0, 6),
        "duration_ms": round(duration_ms, 3),
        "tool": cut(tool, 128),
        "call_id": None if call_id is None else cut(call_id, 256),
        "subtask_id": None if subtask_id is None else cut(subtask_id, 256),
        "args": brief_args(arguments),
        "success": result.success,
        # shell_execute's outcome (exit, timeout, oom, output_limit, disk_limit, signal)
        "outcome": data.get("outcome") if isinstance(data.get("outcome"), str) else None,
        "exit_code": data.get("exit_code") if isinstance(data.get("exit_code"), int) else None,
        "error": None if error is None else cut(mask_secrets(error), MAX_ERROR_CHARS),
        "error_kind": data.get("error_kind") if not result.success else None,
        "files_changed": [cut(f, 512) for f in files[:MAX_FILES]],
        "files_count": len(files),
        "pid": os.getpid(),
    }
