"""An MCP client transport over a process running **inside the workspace sandbox**.

A stdio MCP server is operator-configured but runs next to workspace content (often it
*is* workspace content), so it never runs on the host: it is started with the sandbox's
``spawn`` (a long-lived process with streamed stdin/stdout, see ``sandbox/process.py``)
and spoken to over that stream. :class:`SandboxStdioTransport` gives the mcp SDK's
``Client`` the same shape ``mcp.client.stdio.stdio_client`` does: an async context
manager yielding ``(read_stream, write_stream)`` of anyio memory streams carrying
``SessionMessage`` (one JSON-RPC message per line on the wire).

Errors: entering raises :class:`~worker.catalog.mcp_source.MCPUnavailableError` when
the sandbox cannot spawn processes, and what ``spawn`` raises (PathNotFoundError for a
missing program, SandboxLostError). A server that exits mid-session ends the read
stream, so pending requests fail with the SDK's "Connection closed";
:meth:`SandboxStdioTransport.diagnostics` then says how it exited.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .mcp_source import MCPUnavailableError

if TYPE_CHECKING:
    from mcp.shared.message import SessionMessage

#: One JSON-RPC line larger than this is refused (the sandbox process buffers up to 64 MiB).
MAX_LINE = 16 << 20


@runtime_checkable
class Spawns(Protocol):
    """A sandbox that runs long-lived processes (:meth:`sandbox.client.AgentSandbox.spawn`)."""

    async def spawn(self, argv: list[str], *, cwd: str = ".", env: dict[str, str] | None = None) -> Any:
        """Raises PathNotFoundError for a missing program or cwd, SandboxLostError."""
        ...


class SandboxStdioTransport:
    """Single-use transport: each ``async with`` starts one server process in ``sandbox``."""

    def __init__(self, sandbox: Any, argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: str = ".") -> None:
        self._sandbox = sandbox
        self._argv = list(argv)
        self._env = dict(env or {})
        self._cwd = cwd
        self.process: Any = None
        self._tg: TaskGroup | None = None
        self._streams: list[Any] = []

    def diagnostics(self) -> str:
        """How the server process ended (exit code, last stderr), or "" while it runs."""
        p = self.process
        if p is None or (p.returncode is None and not p.lost):
            return ""
        if p.lost:
            return "the sandbox was lost"
        tail = p.stderr_tail.decode("utf-8", "replace").strip()[-500:]
        return f"server exited with code {p.returncode}" + (f": {tail}" if tail else "")

    async def __aenter__(self) -> tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[SessionMessage]]:
        if not isinstance(self._sandbox, Spawns):
            raise MCPUnavailableError("this sandbox cannot run long-lived processes (no spawn)")
        # Imported here, as mcp_source imports the SDK's Client: importing the mcp package
        # takes most of a second, which every CLI command paid for a module it never used.
        from mcp.shared.message import SessionMessage
        from mcp_types import jsonrpc_message_adapter

        self.process = await self._sandbox.spawn(self._argv, cwd=self._cwd, env=self._env or None)
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        self._streams = [read_writer, read_stream, write_stream, write_reader]
        proc = self.process

        async def reader() -> None:
            async with read_writer:
                while True:
                    line = await proc.read_line()
                    if not line:
                        return  # EOF: the session wakes pending requests with "Connection closed"
                    if not line.strip():
                        continue
                    item: SessionMessage | Exception
                    if len(line) > MAX_LINE:
                        item = ValueError(f"MCP message larger than {MAX_LINE} bytes")
                    else:
                        try:
                            item = SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
                        except ValueError as e:  # surfaced by the session, like stdio_client does
                            item = e
                    try:
                        await read_writer.send(item)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return

        async def writer() -> None:
            try:
                async with write_reader:
                    async for msg in write_reader:
                        data = msg.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                        await proc.write(data.encode("utf-8"))
            except Exception:
                # The process is gone (or the sandbox): end the read side so the session
                # sees the connection close instead of waiting for a reply forever.
                await read_writer.aclose()

        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(reader)
        self._tg.start_soon(writer)
        return read_stream, write_stream

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        with anyio.CancelScope(shield=True):
            # Killing the process (and everything it started) ends the reader at EOF.
            if self.process is not None:
                await self.process.close()
            for s in self._streams:
                await s.aclose()
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
        return None
