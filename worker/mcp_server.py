"""The MCP server (official ``mcp`` SDK, low-level ``Server``).

Two transports, the same tools:

- **stdio**: ``loom-worker mcp --workspace DIR`` serves one workspace for the life of the
  process (what Claude Code, Cursor and other MCP clients spawn);
- **streamable HTTP** on the service: ``/v1/workspaces/{id}/mcp``. The workspace is chosen
  by the URL, so one MCP endpoint = one workspace; a session never changes workspace
  behind the client's back. Who may call it is the service's decision
  (:mod:`worker.auth`: the bearer token, the Host and cross-site rules), made before a
  request reaches :class:`HttpMcp`.

Tool names, descriptions and input schemas are the registry's own definitions rendered
for MCP (the same pydantic models as the OpenAI schemas). A failed call (unknown tool,
invalid arguments, a refusal, a command that failed) is an MCP *tool error*
(``isError: true`` with the message as text), never a protocol error, so the model sees
it and can correct itself. A result's images (``ToolResult.images``: a chart ``run_code``
drew) are ``ImageContent`` blocks after the text (:mod:`worker.content`); its
``structuredContent`` is the ToolResult with each image named but its bytes left out.

When the client sends a progress token with a call (``_meta.progressToken``), a command's
output is also sent as it happens: each chunk one ``notifications/progress`` whose
``message`` is the text (stdout and stderr as they come; UTF-8 with U+FFFD for other
bytes) and whose ``progress`` counts the output's bytes so far (no ``total``: nobody
knows it). The result is the same as without.

The tool list is read live (the tool catalog registers an MCP server's tools when it
first indexes them), and a session is told when it changes, as the protocol version it
speaks says: on 2025-era (handshake) sessions the server declares ``tools.listChanged`` in
its ``initialize`` result and sends ``notifications/tools/list_changed`` on the session's
standalone channel (stdout; the streamable-HTTP ``GET`` stream); on 2026-07-28 sessions,
which receive change notifications only on a ``subscriptions/listen`` stream they opened,
the server serves that method (so its capabilities say ``listChanged``) and publishes the
change to the streams that asked for ``toolsListChanged``. Changes made together are sent
as one notification.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server import NotificationOptions, Server
from mcp.server.context import ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import DEFAULT_SESSION_IDLE_TIMEOUT, StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from sandbox import __version__
from sandbox.logs import get_logger

from .content import mcp_content
from .limits import MAX_REQUEST_BYTES
from .metrics import Metrics
from .result import ToolResult, json_safe
from .service import Busy, CallRunner, InvalidWorkspaceId, WorkspaceNotFound, Workspaces
from .streaming import ToolOutput

if TYPE_CHECKING:
    from .registry.contract import ServiceRegistry

log = get_logger("worker.mcp")

SCOPE_KEY = "loom.workspace"
#: Seconds a session may take to accept a ``tools/list_changed`` before it is given up on.
NOTIFY_TIMEOUT = 5.0
#: An HTTP session without a request in flight for this long is closed (the SDK's default).
SESSION_IDLE_TIMEOUT: float = DEFAULT_SESSION_IDLE_TIMEOUT

WorkspaceResolver = Callable[[ServerRequestContext[Any, Any]], Path | None]

#: A content block from its wire form (``worker.content`` speaks the wire, not the SDK's types).
_CONTENT: TypeAdapter[types.ContentBlock] = TypeAdapter(types.ContentBlock)

#: OpenAI's native tools (``shell``, ``apply_patch``): Responses API tools, never listed here.
_OPENAI_NATIVE = frozenset({"shell", "apply_patch"})


class _Server(Server[Any]):
    """The SDK's low-level server, declaring ``tools.listChanged`` to handshake-era clients
    by default: the streamable-HTTP session manager builds each session's ``initialize``
    result from :meth:`create_initialization_options` without arguments."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
        )


@dataclass
class _Session:
    """A handshake-era session: where to send, and (over HTTP) whether it is still open."""

    session: ServerSession
    in_flight: int  # its HTTP requests being served now
    last: float  # when one last started or ended (time.monotonic)


class ToolList:
    """The registry's tools as MCP lists them, and who is told when they change.

    :meth:`tools` renders the list again only when the registry's tool version moved.
    While :meth:`lifespan` runs (the server's lifespan) a change of the registry's tools
    is sent to every session: handshake-era sessions, kept from their
    ``notifications/initialized`` on, and the ``subscriptions/listen`` streams of
    2026-07-28 sessions (:attr:`listen`).

    A handshake-era session ends without a word to the server's handlers (its
    notifications are then dropped, silently), so an HTTP one is forgotten as the session
    manager forgets it: at its ``DELETE``, or after ``idle_timeout`` seconds without a
    request in flight (:meth:`activity` is told of each of its requests). A stdio session
    lasts as long as the server's lifespan.
    """

    def __init__(
        self, registry: ServiceRegistry, *, idle_timeout: float | None = None, native_tools: bool = False
    ) -> None:
        self._registry = registry
        self._idle_timeout = idle_timeout
        #: Also list Anthropic's ``bash`` and ``str_replace_based_edit_tool`` by those names
        #: (registered here: :mod:`worker.native`), for clients that want the tools their
        #: model was trained on. Off by default: most clients bring a shell of their own.
        self._native = native_tools
        if native_tools:
            from .native import ANTHROPIC_NAMES, install

            install(registry, ANTHROPIC_NAMES)
        self._rendered: tuple[int, list[types.Tool]] = (-1, [])
        self.bus = InMemorySubscriptionBus()
        #: The ``subscriptions/listen`` handler (serving it also declares ``listChanged``).
        self.listen = ListenHandler(self.bus)
        self._sessions: dict[object, _Session] = {}  # by HTTP session id (stdio: a token)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def sessions(self) -> int:
        """How many handshake-era sessions are kept to be told of changes."""
        return len(self._sessions)

    def tools(self) -> list[types.Tool]:
        version = self._registry.tools_version
        if self._rendered[0] != version:
            tools = [
                types.Tool.model_validate(s)
                for s in self._registry.all_schemas("mcp", native=self._native)
                if s["name"] not in _OPENAI_NATIVE  # (Responses API tools: no MCP form)
            ]
            self._rendered = (version, tools)
        return self._rendered[1]

    # -- handshake-era sessions --------------------------------------------------------------

    async def session_initialized(self, ctx: ServerRequestContext[Any, Any], _params: types.NotificationParams) -> None:
        """``notifications/initialized``: a handshake-era session is ready for notifications."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        self._prune()
        sid = _http_session_id(ctx.request)
        # Over HTTP the request carrying this notification is in flight (it ends with an
        # activity(sid, -1)); on stdio there are no requests to count.
        self._sessions[sid if sid is not None else object()] = _Session(ctx.session, 1, time.monotonic())

    def activity(self, sid: str, change: int) -> None:
        """An HTTP request of session ``sid`` started (``change`` 1) or ended (-1)."""
        entry = self._sessions.get(sid)
        if entry is not None:
            entry.in_flight += change
            entry.last = time.monotonic()

    def forget(self, sid: str) -> None:
        """The HTTP session ``sid`` was closed (``DELETE``)."""
        self._sessions.pop(sid, None)

    def _prune(self) -> None:
        if self._idle_timeout is None:
            return
        now = time.monotonic()
        for key, entry in list(self._sessions.items()):
            if entry.in_flight <= 0 and now - entry.last > self._idle_timeout:
                del self._sessions[key]

    # -- telling them ------------------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self, _server: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        """Tell the sessions of tool changes for as long as the server runs."""
        self._loop = asyncio.get_running_loop()
        unsubscribe = self._registry.subscribe_tools(self._changed)
        try:
            yield {}
        finally:
            unsubscribe()
            self.listen.close()
            for task in list(self._tasks):
                task.cancel()
            self._sessions.clear()
            self._loop = None

    def _changed(self) -> None:
        # Called by the registry in the thread that changed it, usually mid-task on the
        # loop: the notification goes out from a task of its own, once for the changes
        # made until that task starts.
        loop = self._loop
        if loop is None or self._scheduled:
            return
        self._scheduled = True
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.call_soon(self._start)
        else:
            loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        self._scheduled = False
        if self._loop is None:
            return
        task = self._loop.create_task(self._notify())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _notify(self) -> None:
        await self.bus.publish(ToolsListChanged())
        self._prune()
        entries = list(self._sessions.items())
        # Notifications are fire-and-forget in the SDK (a closed session drops them); the
        # timeout only keeps one stuck stream from holding the others' back.
        results = await asyncio.gather(
            *(asyncio.wait_for(e.session.send_tool_list_changed(), NOTIFY_TIMEOUT) for _, e in entries),
            return_exceptions=True,
        )
        for (key, _), result in zip(entries, results, strict=True):
            if isinstance(result, BaseException):
                log.info("mcp.notify_failed", error=repr(result)[:200])
                self._sessions.pop(key, None)


def _http_session_id(request: object) -> str | None:
    """The ``Mcp-Session-Id`` of the HTTP request a message came with (None on stdio)."""
    if isinstance(request, Request):
        return request.headers.get(MCP_SESSION_ID_HEADER)
    return None


def build_server(
    registry: ServiceRegistry,
    runner: CallRunner,
    resolve_workspace: WorkspaceResolver,
    tool_list: ToolList | None = None,
    extra: Any = None,
) -> Server[Any]:
    """An MCP server whose tools are ``registry``'s (read live; sessions are told when
    they change, through ``tool_list``), run through ``runner`` in the workspace
    ``resolve_workspace(ctx)`` returns for each request; ``extra`` adds tools of the server
    alone (``tools``, ``names``, ``async call(name, arguments)``: the snapshot tools of
    :mod:`worker.snapshots.mcp_tools`), never the registry's."""
    if tool_list is None:
        tool_list = ToolList(registry)
    own_tools = list(extra.tools) if extra is not None else []

    async def list_tools(
        _ctx: ServerRequestContext[Any, Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list.tools() + own_tools)

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
                result = await _streamed(ctx, runner, params.name, arguments, workspace)
            else:
                async with runner.slot():
                    result = await runner.execute(params.name, arguments, workspace)
        except Busy as e:
            return types.CallToolResult(content=[types.TextContent(text=f"Error: {e}")], is_error=True)
        return types.CallToolResult(
            content=call_content(result),
            structured_content=json_safe(_structured(result)),
            is_error=not result.success,
        )

    server = _Server(
        "loom-worker",
        version=__version__,
        instructions=(
            "Tools that read, write, edit and search files and run shell commands in one workspace, "
            "inside an isolated sandbox. Paths are relative to the workspace root."
        ),
        lifespan=tool_list.lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_subscriptions_listen=tool_list.listen,
    )
    server.add_notification_handler(
        "notifications/initialized", types.NotificationParams, tool_list.session_initialized
    )
    return server


def call_content(result: ToolResult) -> list[types.ContentBlock]:
    """The result's text, then an ``ImageContent`` per image (:func:`worker.content.mcp_content`)."""
    return [_CONTENT.validate_python(block) for block in mcp_content(result)]


def _structured(result: ToolResult) -> dict[str, Any]:
    """``structuredContent``: the ToolResult, its images named (``mime_type``, size) but
    not repeated: their bytes are in ``content`` once."""
    out = result.to_dict()
    if "images" in out:
        out["images"] = [{k: v for k, v in i.items() if k != "data"} for i in out["images"]]
    return out


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
) -> ToolResult:
    """The call, with its output sent as progress notifications. Raises Busy."""
    sent = 0
    result: ToolResult | None = None
    async for item in runner.execute_stream(name, arguments, workspace):
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


async def serve_stdio(
    registry: ServiceRegistry,
    workspace: Path,
    *,
    max_concurrent: int = 64,
    native_tools: bool = False,
    extra: Any = None,
    max_message: int = MAX_REQUEST_BYTES,
) -> None:
    """Serve ``workspace`` over stdin/stdout until the client closes the stream; with
    ``native_tools`` Anthropic's ``bash`` and text editor are listed too (:class:`ToolList`),
    and the server-only tools ``extra`` (see :func:`build_server`). A message over
    ``max_message`` bytes is refused while it is read (:mod:`worker.mcp_stdio`)."""
    from .mcp_stdio import bounded_stdio_server

    ws = workspace.resolve()
    runner = CallRunner(registry, Metrics(), max_concurrent=max_concurrent)
    server = build_server(registry, runner, lambda _ctx: ws, ToolList(registry, native_tools=native_tools), extra)
    log.info("mcp.stdio.started", workspace=str(ws))
    async with bounded_stdio_server(max_message) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


class HttpMcp:
    """MCP streamable HTTP for the service: one session manager, the workspace from the URL.

    It serves behind the service's :class:`worker.auth.AccessGuard`, which has already
    checked the token, the Host (DNS rebinding) and the Origin of every request."""

    def __init__(
        self,
        registry: ServiceRegistry,
        runner: CallRunner,
        workspaces: Workspaces,
        *,
        native_tools: bool = False,
        max_message: int = MAX_REQUEST_BYTES,
    ) -> None:
        """``max_message``: the largest request body, the service's own limit (the SDK's
        default, 4 MiB, would refuse a ``write_file`` the tools take)."""
        self._workspaces = workspaces
        self.tool_list = ToolList(registry, idle_timeout=SESSION_IDLE_TIMEOUT, native_tools=native_tools)
        server = build_server(registry, runner, self._workspace_of, self.tool_list)
        # The SDK's own Host/Origin lists are off: the service's guard decides those for
        # every route, this one included, in one place (worker.auth).
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        self.manager = StreamableHTTPSessionManager(
            app=server,
            security_settings=security,
            json_response=False,
            session_idle_timeout=SESSION_IDLE_TIMEOUT,
            max_request_body_size=max_message,
        )

    @staticmethod
    def _workspace_of(ctx: ServerRequestContext[Any, Any]) -> Path | None:
        request = ctx.request
        if isinstance(request, Request):
            ws = request.scope.get(SCOPE_KEY)
            return ws if isinstance(ws, Path) else None
        return None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: find the workspace (404 when there is none), then hand over to the SDK."""
        ws_id = scope.get("path_params", {}).get("workspace_id", "")
        try:
            path = await self._workspaces.locate(ws_id)
        except (InvalidWorkspaceId, WorkspaceNotFound) as e:
            await JSONResponse({"detail": str(e)}, status_code=404)(scope, receive, send)
            return
        scope[SCOPE_KEY] = path
        sid = dict(scope.get("headers", [])).get(MCP_SESSION_ID_HEADER.encode())
        if sid is None:
            await self.manager.handle_request(scope, receive, send)
            return
        session_id = sid.decode("latin-1")
        self.tool_list.activity(session_id, 1)
        try:
            await self.manager.handle_request(scope, receive, send)
        finally:
            self.tool_list.activity(session_id, -1)
            if scope.get("method") == "DELETE":
                self.tool_list.forget(session_id)
