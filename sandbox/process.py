"""A long-lived process inside the sandbox with streamed stdin/stdout (e.g. a stdio MCP
server). Its output arrives as events over the agent stream; the agent kills it (and
everything below it) on :meth:`SandboxProcess.close` or when the connection ends.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from .connection import AgentConnection
from .errors import ProtocolError, SandboxLostError

#: Buffered output beyond this means the reader is not keeping up: the process is killed.
MAX_BUFFERED = 64 << 20


class SandboxProcess:
    """Handle on a process started with :meth:`sandbox.client.AgentSandbox.spawn`."""

    def __init__(self, conn: AgentConnection, pid: int) -> None:
        self._conn = conn
        self.pid = pid
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._buffer = bytearray()
        self._buffered = 0
        self.returncode: int | None = None
        self.stderr_tail = b""
        self.lost = False
        self._eof = False
        conn.set_event_handler(pid, self._on_event)

    def _on_event(self, msg: dict[str, Any]) -> None:
        kind = msg.get("event")
        if kind == "stdout":
            try:
                chunk = base64.b64decode(str(msg.get("data", "")), validate=True)
            except (binascii.Error, ValueError):
                chunk = b""
            self._buffered += len(chunk)
            if chunk:
                self._chunks.put_nowait(chunk)
        elif kind == "exit":
            code = msg.get("code")
            self.returncode = code if isinstance(code, int) and not isinstance(code, bool) else -1
            try:
                self.stderr_tail = base64.b64decode(str(msg.get("stderr", "")))
            except (binascii.Error, ValueError):
                self.stderr_tail = b""
            self._conn.event_handlers.pop(self.pid, None)
            self._chunks.put_nowait(b"")
        elif kind == "lost":
            self.lost = True
            self._chunks.put_nowait(b"")

    async def read(self) -> bytes:
        """The next chunk of stdout; ``b""`` once the process exited or the sandbox was lost."""
        if self._buffer:
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        if self._eof:
            return b""
        chunk = await self._chunks.get()
        self._buffered -= len(chunk)
        if not chunk:
            self._eof = True
        return chunk

    async def read_line(self) -> bytes:
        """One line including its newline; what is left (maybe ``b""``) at the end."""
        while b"\n" not in self._buffer and not self._eof:
            chunk = await self._chunks.get()
            self._buffered -= len(chunk)
            if not chunk:
                self._eof = True
                break
            self._buffer += chunk
            if len(self._buffer) > MAX_BUFFERED:
                raise ProtocolError("process output line exceeds the size limit")
        nl = self._buffer.find(b"\n")
        end = len(self._buffer) if nl < 0 else nl + 1
        line = bytes(self._buffer[:end])
        del self._buffer[:end]
        return line

    async def write(self, data: bytes, *, close: bool = False) -> None:
        """Send bytes to the process's stdin. Raises SandboxLostError, AgentError."""
        if self.returncode is not None or self.lost:
            raise SandboxLostError("the process has exited")
        await self._conn.request(
            "stdin", {"proc": self.pid, "data": base64.b64encode(data).decode(), "close": close}, timeout=30
        )

    async def close(self, grace: float = 0.5) -> int | None:
        """Kill the process and everything it started; returns its exit code if known."""
        self._conn.event_handlers.pop(self.pid, None)
        if self.returncode is None and not self.lost and not self._conn.closed:
            try:
                await self._conn.request("kill", {"proc": self.pid, "grace": grace}, timeout=grace + 10)
            except Exception:  # already gone: nothing left to kill
                pass
        return self.returncode
