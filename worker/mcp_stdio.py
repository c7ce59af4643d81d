"""MCP over stdio with every message's size bounded (``LOOM_MAX_BODY_BYTES``, see
:mod:`worker.limits`).

The SDK's stdio transport reads a whole line before it looks at it, so a client that sends
a 1 GiB message makes the server hold 1 GiB (and more, decoded). Here each line is read
at most one byte past the limit; a longer one is refused as it is read: the bytes read so
far are dropped, the rest of the line is skipped in small pieces, never held, and the
request is answered with a JSON-RPC error naming the limit (its ``id`` is read from the
line's first bytes, where clients put it; a message whose id is not there gets none, as
for any message the server cannot read). The lines are then handed to the SDK's own
transport, unchanged, which keeps every other part of it (stdout taken away from stray
writes, the message framing).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, Any

import anyio.to_thread

from .limits import too_large

#: How much of a refused line is kept to find its id.
HEAD = 512
#: How much of a line is read at a time.
_PIECE = 1 << 20
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,256}")')


@dataclass
class _Refused:
    head: bytes


class BoundedLines:
    """The lines of a binary stream for the SDK's stdio transport (``async for line``),
    each at most ``limit`` bytes; a longer one is answered through :attr:`reply_to` (the
    transport's write stream, once it is open) and skipped."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self.stream = stream
        self.limit = limit
        self.reply_to: Any = None
        self.refused = 0

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        while True:
            # A thread per line, as the SDK reads stdin; abandoned (still blocked in read)
            # when the server stops.
            item = await anyio.to_thread.run_sync(self._next, abandon_on_cancel=True)
            if item is None:
                raise StopAsyncIteration
            if isinstance(item, bytes):
                return item.decode("utf-8", "replace")
            self.refused += 1
            await self._refuse(item)

    def _next(self) -> bytes | _Refused | None:
        """The next line, a refusal, or None at the end of the stream (blocking). Read a
        piece at a time: a refused line costs the limit, once (not a buffer and its copy)."""
        pieces: list[bytes] = []
        size = 0
        while size <= self.limit:
            piece = self.stream.readline(_PIECE)
            if not piece:
                return b"".join(pieces) or None
            pieces.append(piece)
            size += len(piece)
            if piece.endswith(b"\n"):
                return b"".join(pieces) if size <= self.limit + 1 else _Refused(pieces[0][:HEAD])
        head = pieces[0][:HEAD]
        pieces.clear()
        while (rest := self.stream.readline(_PIECE)) and not rest.endswith(b"\n"):
            pass
        return _Refused(head)

    async def _refuse(self, refused: _Refused) -> None:
        from mcp.shared.message import SessionMessage
        from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError

        found = _ID.search(refused.head)
        if found is None or self.reply_to is None:
            return
        with contextlib.suppress(ValueError):
            rid = json.loads(found.group(1))
            error = ErrorData(code=INVALID_REQUEST, message=too_large(self.limit))
            await self.reply_to.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=rid, error=error)))


@contextlib.asynccontextmanager
async def bounded_stdio_server(limit: int) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's ``stdio_server`` reading stdin through :class:`BoundedLines`: yields its
    (read stream, write stream). While it serves, fd 0 is the null device (as the SDK
    makes it: nothing else in the process reads the wire), restored afterwards."""
    from mcp.server.stdio import stdio_server

    wire = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    # closefd=False: an abandoned reader thread may still block on it.
    lines = BoundedLines(os.fdopen(wire, "rb", closefd=False), limit)
    try:
        async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
            lines.reply_to = write_stream
            yield read_stream, write_stream
    finally:
        os.dup2(wire, 0)
