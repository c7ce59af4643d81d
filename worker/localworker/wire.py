"""Frames between the CLI and its local worker: one JSON object per line, both ways.

A request is answered by any number of frames with its ``id``, the last one *final*.
That is what lets a later command stream (a process's output as it happens) through the
same path; today's frames::

    client -> worker
      {"op": "call", "id": 1, "key": K, "tool": "read_file", "arguments": {...},
       "workspace": "/abs/real/path", "call_id": null, "tty": false, "check_unknown": true}
      {"op": "exec", "id": 4, "key": K, "workspace": "/abs", "command": "make test",
       "timeout": 300, "cwd": ".", "call_id": null, "tty": false, "log_floor": "warning",
       "harness": {"env": {...}, "user": null, "stdin": BASE64}?}   (the harness API's options)
      {"op": "signal", "id": 4, "signal": 2}     while exec 4 runs: pass a Ctrl-C on
      {"op": "status", "id": 2}              {"op": "shutdown", "id": 3}

    worker -> client
      {"t": "hello", "pid": 4242, "key": K}   on accepting a connection, before any request
      {"id": 1, "t": "log", "text": "..."}            a log line for the client's stderr
      {"id": 4, "t": "output", "stream": "stdout", "data": BASE64, "dropped": 0}   exec's output
      {"id": 1, "t": "pull", "image": "python:3.12-slim", "state": "pulling", ...}  an image
                                                 pull's progress (sandbox.pulls.PullEvent)
      {"id": 1, "t": "result", "exit": 0, "result": {...}}                   (final)
      {"id": 1, "t": "retry", "reason": "..."}   not run: ask a fresh worker  (final)
      {"id": 1, "t": "error", "message": "..."}  a request it cannot read     (final)
      {"id": 2, "t": "status", ...}                                          (final)

JSON text never holds a raw newline, so a line is a frame. Text is UTF-8; a value with a
lone surrogate (bytes of a file name that are not UTF-8, carried by surrogateescape) makes
that frame ASCII with ``\\uXXXX`` escapes instead, which decodes to the same value.

Standard library only: the client runs this on every call.
"""

from __future__ import annotations

import json
import re

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


#: What a frame holds besides a call's arguments or a command's stdin (and the most a
#: frame of any other op may be).
ENVELOPE = 64 << 10
#: The largest ``exec`` frame: a command's stdin of up to 64 MiB (``loom-worker exec
#: --stdin``) as base64, and the rest.
MAX_EXEC_FRAME = (64 << 20) * 4 // 3 + (1 << 20)
#: How much of a frame is read before its op decides its limit (the client sends ``id``
#: and ``op`` first).
HEAD = 256


def frame_limit(op: str | None, max_request: int) -> int:
    """The most bytes a frame of ``op`` may hold: a call, ``max_request`` (the one limit of
    a request, ``worker.limits``) and the envelope; ``exec``, :data:`MAX_EXEC_FRAME`;
    anything else, the envelope."""
    if op == "exec":
        return MAX_EXEC_FRAME
    if op == "call":
        return max_request + ENVELOPE
    return ENVELOPE


def head_fields(head: bytes) -> tuple[str | None, int | None]:
    """The ``op`` and ``id`` named in the first bytes of a frame, where they are."""
    op = _OP.search(head)
    rid = _ID.search(head)
    return (op.group(1).decode() if op else None), (int(rid.group(1)) if rid else None)


FINAL = frozenset({"result", "retry", "error", "status"})

_OP = re.compile(rb'"op":\s*"([a-z_]{1,20})"')
_ID = re.compile(rb'"id":\s*(\d{1,18})[,}]')


def encode(frame: dict[str, Any]) -> bytes:
    """One frame, newline included."""
    try:
        return (json.dumps(frame, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode()
    except UnicodeEncodeError:  # a lone surrogate somewhere: escape everything instead
        return (json.dumps(frame, separators=(",", ":"), default=str) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    """The frame in ``line``. Raises ValueError when it is not a JSON object."""
    frame = json.loads(line)
    if not isinstance(frame, dict):
        raise ValueError("a frame must be a JSON object")
    return frame
