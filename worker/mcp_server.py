"""The MCP server (official ``mcp`` SDK, low-level ``Server``).

Two transports, the same tools:

- **stdio**: ``loom-worker mcp --workspace DIR`` serves one workspace for the life of the
  process (what Claude Code, Cursor and other MCP clients spawn);
- **streamable HTTP** on the service: ``/v1/workspaces/{id}/mcp``. The workspace is chosen
  by the URL, so one MCP endpoint = one workspace; a session never changes workspace
  behind the client's back. The service's bearer token applies.

Tool names, descriptions and input schemas are the registry's own definitions rendered
for MCP (the same pydantic models as the OpenAI schemas). A failed call (unknown tool,
invalid arguments, a refusal, a command that failed) is an MCP *tool error*
(``isError: true`` with the message as text), never a protocol error, so the model sees
it and can correct itself.

When the client sends a progress token with a call (``_meta.progressToken``), a command's
output is also sent as it happens: each chunk one ``notifications/progress`` whose
``message`` is the text (stdout and stderr as they come; UTF-8 with U+FFFD for other
bytes) and whose ``progress`` counts the output's bytes so far (no ``total``: nobody
knows it). The result is the same as without.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from sandbox import __version__
from sandbox.logs import get_logger

from .metrics import Metrics
from .result import ToolResult, json_safe
from .service import Busy, CallRunner, InvalidWorkspaceId, WorkspaceNotFound, Workspaces, tool_message_content
from .streaming import ToolOutput

log = get_logger("worker.mcp")

SCOPE_KEY = "loom.workspace"

WorkspaceResolver = Callable[[ServerRequestContext[Any, Any]], Path | None]


def _mcp_tools(registry: Any) -> list[types.Tool]:
    from .http.app import _schemas  # one place renders schemas for every surface

    return [types.Tool.model_validate(s) for s in _schemas(registry, "mcp")]


def build_server(
    registry: Any, runner: CallRunner, resolve_workspace: WorkspaceResolver, extra: Any = None
) -> Server[Any]:
    """An MCP server whose tools are ``registry``'s, run through ``runner`` in the workspace
    ``resolve_workspace(ctx)`` returns for each request; ``extra`` adds tools of the server
    alone (``tools``, ``names``, ``async call(name, arguments)``: the snapshot tools of
    :mod:`worker.snapshots.mcp_tools`)."""
    tools = _mcp_tools(registry) + (list(extra.tools) if extra is not None else [])
    names = frozenset(t.name for t in tools)

    async def list_tools(
        _ctx: ServerRequestContext[Any, Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        workspace = resolve_workspace(ctx)
        arguments = dict(params.arguments or {})
        if extra is not None and params.name in extra.names:
            own: types.CallToolResult = await extra.call(params.name, arguments)
            return own
        try:
            if _progress_token(ctx) is not None:
                result = await _streamed(ctx, runner, params.name, arguments, workspace, names)
            else:
                async with runner.slot():
                    result = await runner.execute(params.name, arguments, workspace, known_tools=names)
        except Busy as e:
            return types.CallToolResult(content=[types.TextContent(text=f"Error: {e}")], is_error=True)
        return types.CallToolResult(
            content=[types.TextContent(text=tool_message_content(result))],
            structured_content=json_safe(result.to_dict()),
            is_error=not result.success,
        )

    return Server(
        "loom-worker",
        version=__version__,
        instructions=(
            "Tools that read, write, edit and search files and run shell commands in one workspace, "
            "inside an isolated sandbox. Paths are relative to the workspace root."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _progress_token(ctx: ServerRequestContext[Any, Any]) -> str | int | None:
    """The progress token the client sent with this request, if any."""
    meta: Any = ctx.meta
    if not isinstance(meta, dict):
        return None
    token = meta.get("progressToken", meta.get("progress_token"))
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


async def _streamed(
    ctx: ServerRequestContext[Any, Any],
    runner: CallRunner,
    name: str,
    arguments: dict[str, Any],
    workspace: Path | None,
    names: frozenset[str],
) -> ToolResult:
    """The call, with its output sent as progress notifications. Raises Busy."""
    sent = 0
    result: ToolResult | None = None
    async for item in runner.execute_stream(name, arguments, workspace, known_tools=names):
        if isinstance(item, ToolOutput):
            if not item.text:
                continue
            sent += len(item.data) + item.dropped or 1  # it must grow with every notification
            try:
                await ctx.session.report_progress(float(sent), None, item.text)
            except Exception as e:  # the client went away: the call itself goes on
                log.info("mcp.progress_failed", error=repr(e)[:200])
        else:
            result = item
    assert result is not None
    return result


async def serve_stdio(registry: Any, workspace: Path, *, max_concurrent: int = 64, extra: Any = None) -> None:
    """Serve ``workspace`` over stdin/stdout until the client closes the stream (with the
    server-only tools ``extra``, see :func:`build_server`)."""
    from mcp.server.stdio import stdio_server

    ws = workspace.resolve()
    runner = CallRunner(registry, Metrics(), max_concurrent=max_concurrent)
    server = build_server(registry, runner, lambda _ctx: ws, extra)
    log.info("mcp.stdio.started", workspace=str(ws))
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


class HttpMcp:
    """MCP streamable HTTP for the service: one session manager, the workspace from the URL."""

    def __init__(self, registry: Any, runner: CallRunner, workspaces: Workspaces, *, token: str | None) -> None:
        self._workspaces = workspaces
        self._token = token
        self._runner = runner
        server = build_server(registry, runner, self._workspace_of)
        # DNS-rebinding protection matters when there is no token (a browser page could
        # otherwise drive a loopback service); with a token, requests are authenticated.
        security = (
            TransportSecuritySettings(enable_dns_rebinding_protection=False)
            if token
            else TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
        )
        self.manager = StreamableHTTPSessionManager(app=server, security_settings=security, json_response=False)

    @staticmethod
    def _workspace_of(ctx: ServerRequestContext[Any, Any]) -> Path | None:
        request = ctx.request
        scope = getattr(request, "scope", None)
        if isinstance(scope, dict):
            ws = scope.get(SCOPE_KEY)
            return ws if isinstance(ws, Path) else None
        return None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: check the token and the workspace, then hand over to the SDK."""
        if self._token:
            header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token.encode()):
                self._runner.metrics.rejected.labels(reason="auth").inc()
                resp = JSONResponse(
                    {"detail": "Missing or wrong bearer token"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await resp(scope, receive, send)
                return
        ws_id = scope.get("path_params", {}).get("workspace_id", "")
        try:
            path = self._workspaces.path(ws_id)
        except (InvalidWorkspaceId, WorkspaceNotFound) as e:
            await JSONResponse({"detail": str(e)}, status_code=404)(scope, receive, send)
            return
        scope[SCOPE_KEY] = path
        await self.manager.handle_request(scope, receive, send)
