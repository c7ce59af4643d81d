"""A tool call's output as it happens: :class:`ToolOutput` chunks, then the ToolResult.

:meth:`worker.registry.ToolRegistry.execute_stream` is built on :func:`stream_call`; the
surfaces render what it yields (the CLI's ``exec`` writes the bytes, the HTTP route sends
SSE ``output`` events, the MCP server progress notifications). Only ``shell_execute``
produces output chunks; any other tool yields just its result.

Each chunk carries the bytes exactly as the command wrote them (``data``) and the same
decoded as UTF-8 (``text``: invalid bytes become U+FFFD, and a character split between two
chunks is given whole with the second), so a surface can choose bytes or text.

Nothing here slows the command: the sandbox hands the output over as it reads it, and
what the reader has not taken yet waits here, up to ``max_buffered`` bytes. Beyond that a
chunk is dropped and counted, and the next chunk of that stream says how many bytes went
missing before it (``dropped``); the result still has its capped capture of both
streams. A reader that goes away does not stop the call: it runs to its end (or its
timeout) and its changes are recorded, as they would be without a reader.
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from sandbox.base import OutputCallback, StreamName

from .result import ToolResult

#: What a stream reader may leave unread before chunks are dropped (bytes).
MAX_BUFFERED = 16 << 20


@dataclass(frozen=True)
class ToolOutput:
    """A chunk of a command's output, as the sandbox read it."""

    stream: Literal["stdout", "stderr"]
    #: The bytes exactly as written (a line or a character may be split between chunks).
    data: bytes
    #: ``data`` decoded as UTF-8 with U+FFFD for invalid bytes; a character split across
    #: chunks is held back and given whole with the next chunk of the stream.
    text: str
    #: Bytes of this stream dropped just before this chunk because the reader fell behind.
    dropped: int = 0


class OutputBuffer:
    """The chunks between the sandbox (``put``, never blocking) and a reader (``get``)."""

    def __init__(self, max_buffered: int = MAX_BUFFERED) -> None:
        self._queue: asyncio.Queue[ToolOutput | None] = asyncio.Queue()
        self._max = max_buffered
        self._buffered = 0
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
        self._dropped = {"stdout": 0, "stderr": 0}
        self.closed = False

    def put(self, stream: StreamName, data: bytes) -> None:
        """One chunk from the sandbox (an :data:`~sandbox.base.OutputCallback`)."""
        if self.closed:
            return
        if self._buffered + len(data) > self._max:
            self._dropped[stream] += len(data)
            self._decoders[stream].reset()  # what was cut cannot be decoded across
            return
        dropped, self._dropped[stream] = self._dropped[stream], 0
        text = self._decoders[stream].decode(data)
        self._buffered += len(data)
        self._queue.put_nowait(ToolOutput(stream, data, text, dropped))

    def finish(self) -> None:
        """The call is over: what a decoder holds back, and any count of drops not told
        yet, become last chunks; then the end."""
        if self.closed:
            return
        stream: StreamName
        for stream in ("stdout", "stderr"):
            rest = self._decoders[stream].decode(b"", final=True)
            if rest or self._dropped[stream]:
                self._queue.put_nowait(ToolOutput(stream, b"", rest, self._dropped[stream]))
                self._dropped[stream] = 0
        self._queue.put_nowait(None)

    async def get(self) -> ToolOutput | None:
        """The next chunk, or None at the end."""
        item = await self._queue.get()
        if item is not None:
            self._buffered -= len(item.data)
        return item

    def close(self) -> None:
        """The reader went away: take nothing more."""
        self.closed = True


#: Calls that were started for a stream, kept referenced until they end (a reader that
#: left early no longer holds them; their result is logged by the registry as every
#: call's is).
_RUNNING: set[asyncio.Future[ToolResult]] = set()


def stream_call(
    run: Callable[[OutputCallback], Awaitable[ToolResult]], *, max_buffered: int = MAX_BUFFERED
) -> AsyncIterator[ToolOutput | ToolResult]:
    """Start ``run(on_output)`` (a tool call) now, in a task, and return the iterator of
    its output chunks as they come, then its result. Leaving the iterator early (or never
    starting it) does not stop the call, and cancelling the reader is not passed on to
    it. Call it with an event loop running."""
    buffer = OutputBuffer(max_buffered)
    task = asyncio.ensure_future(run(buffer.put))
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)
    task.add_done_callback(lambda _t: buffer.finish())
    return _read(buffer, task)


async def _read(buffer: OutputBuffer, task: asyncio.Future[ToolResult]) -> AsyncIterator[ToolOutput | ToolResult]:
    try:
        while (item := await buffer.get()) is not None:
            yield item
        yield task.result()
    finally:
        buffer.close()


def chunk_dict(chunk: ToolOutput) -> dict[str, Any]:
    """A chunk as the HTTP stream sends it: ``{"stream", "text"}`` and, after drops,
    ``"dropped"``."""
    out: dict[str, Any] = {"stream": chunk.stream, "text": chunk.text}
    if chunk.dropped:
        out["dropped"] = chunk.dropped
    return out
