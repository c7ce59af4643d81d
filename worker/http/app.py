"""The HTTP API (``loom-worker serve``): FastAPI app factory :func:`create_app`.

Routes (all under a bearer token when ``LOOM_API_TOKEN`` is set, except ``/healthz``)::

    GET    /healthz
    GET    /metrics                                  Prometheus text format
    GET    /v1/tools?format=openai|anthropic|mcp
    GET    /v1/tools/search?query=&mode=&capability=&max_results=   the tool catalog (tool_search)
    POST   /v1/workspaces            {"name"?}       creates <root>/<id>
    GET    /v1/workspaces
    DELETE /v1/workspaces/{id}?delete_files=false    stops its sandbox
    POST   /v1/workspaces/{id}/execute    {"tool", "arguments", "call_id"?, "subtask_id"?}
    POST   /v1/workspaces/{id}/execute/stream  the same, answered with SSE (:mod:`worker.http.stream`)
    *      /v1/workspaces/{id}/ports/{port}/{path}  a server in the sandbox (:mod:`worker.http.ports`)
    POST   /v1/workspaces/{id}/tool_calls [OpenAI tool_calls]  -> tool messages
    *      /v1/workspaces/{id}/mcp                   MCP streamable HTTP for that workspace
    + the changelog routes of :mod:`worker.http.changelog` when the changelog is present
    + settings, egress, call history (:mod:`worker.http.calls`), per-call diffs
      (:mod:`worker.http.changes`), sandbox state (:mod:`worker.http.sandbox`)
    GET    /  and /ui/*                         the dashboard (:mod:`worker.dashboard`)

Client input never produces a 500: bad bodies are 422 naming the field, unknown
workspaces 404, a full service 429, a large body 413; tool failures are results
(``success: false``), not HTTP errors.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox import __version__ as _pkg_version
from sandbox.logs import get_logger

from ..metrics import Metrics
from ..service import (
    WORKSPACE_ID_PATTERN,
    Busy,
    CallRunner,
    InvalidWorkspaceId,
    WorkspaceExists,
    WorkspaceNotFound,
    Workspaces,
    encode_json,
    parse_tool_arguments,
    result_dict,
    tool_message_content,
)
from ..settings import Settings
from ..workspace_settings import SettingsError, WorkspaceSettings

log = get_logger("worker.http")

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


class UnsafeBindError(ValueError):
    """A non-loopback bind address without an API token."""


def check_bind(settings: Settings) -> None:
    """Refuse to listen beyond loopback without a token. Raises UnsafeBindError."""
    if settings.host not in LOOPBACK_HOSTS and not settings.api_token:
        raise UnsafeBindError(
            f"Refusing to bind to {settings.host} without LOOM_API_TOKEN: anyone who can reach the port "
            "could run commands in the sandboxes. Set LOOM_API_TOKEN or bind to 127.0.0.1."
        )


# -- request / response models ---------------------------------------------------------

WorkspaceId = Annotated[str, PathParam(pattern=WORKSPACE_ID_PATTERN, description="Workspace id.")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateWorkspace(_Model):
    name: str | None = Field(None, pattern=WORKSPACE_ID_PATTERN, description="Id to use (random when absent).")
    settings: WorkspaceSettings | None = Field(
        None, description="Its own sandbox settings (image, runtime, limits, env, CA bundle); see PATCH."
    )


class WorkspaceOut(_Model):
    id: str
    path: str = Field(description="Absolute path on the host (identical inside the worker container).")


class ExecuteRequest(_Model):
    tool: str = Field(min_length=1, max_length=128, description="Tool name, e.g. read_file.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")
    call_id: str | None = Field(None, max_length=256)
    subtask_id: str | None = Field(None, max_length=256)


class SafeJSONResponse(JSONResponse):
    """The service's JSON response: a lone surrogate that reached a field (bytes of a file
    name or an output that are not UTF-8, which the tools and the changelog routes quote
    first) is sent as a ``\\uXXXX`` escape instead of failing the request with a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return encode_json(content)


class ToolResultOut(_Model):
    success: bool
    output: str
    data: dict[str, Any] | None = None
    files_changed: list[str] = Field(default_factory=list)
    error: str | None = None


class FunctionCall(_Model):
    name: str = Field(min_length=1, max_length=128)
    arguments: str | dict[str, Any] | None = Field(
        "{}", description="The JSON string the model produced (an object is accepted too)."
    )


class ToolCall(_Model):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall
    index: int | None = Field(None, description="Ignored (present in streamed tool calls).")


class ToolMessage(_Model):
    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str


class Problem(_Model):
    detail: str


class SearchProblem(_Model):
    detail: Any
    code: str | None = Field(None, description="INVALID_QUERY for an empty query.")


# -- middleware ------------------------------------------------------------------------


class BodyLimit:
    """Refuse bodies larger than ``limit`` bytes with 413, by Content-Length or while
    streaming; not on paths ``exempt`` accepts (the port proxy streams bodies through,
    holding none)."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        on_reject: Callable[[], None] = lambda: None,
        exempt: Callable[[str], bool] = lambda _path: False,
    ) -> None:
        self.app = app
        self.limit = limit
        self.on_reject = on_reject
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.exempt(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    too_big = int(v) > self.limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(scope, receive, send)
                    return
        seen = 0
        exceeded = False
        replaced = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    exceeded = True
                    raise _TooLarge
            return msg

        async def guarded_send(msg: Message) -> None:
            # The framework may turn the receive error into its own 400: answer 413 instead.
            nonlocal replaced
            if exceeded:
                if msg["type"] == "http.response.start" and not replaced:
                    replaced = True
                    await self._reject(scope, receive, send)
                return
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not replaced:
                await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.on_reject()
        resp = JSONResponse({"detail": f"Request body larger than {self.limit} bytes"}, status_code=413)
        await resp(scope, receive, send)


class _TooLarge(Exception):
    pass


# -- the app ---------------------------------------------------------------------------

RegistryFactory = Callable[[Settings], Any]


@asynccontextmanager
async def _default_registry_cm(settings: Settings) -> AsyncIterator[Any]:
    """The Docker registry, recording every change in the changelog under LOOM_DATA_DIR."""
    from ..registry import default_registry  # the Docker backend; imported only when used

    try:
        from .changelog import ChangelogPool
    except ImportError:  # the changelog is not part of this build
        async with default_registry(settings) as registry:
            yield registry
        return
    pool = ChangelogPool(settings.data_dir, settings.durability, limits=settings.changelog_limits())
    try:
        async with default_registry(settings, recorder_factory=pool.recorder) as registry:
            yield registry
    finally:
        await pool.aclose()


def create_app(
    settings: Settings,
    registry: Any | None = None,
    *,
    metrics: Metrics | None = None,
    registry_factory: RegistryFactory | None = None,
) -> FastAPI:
    """The service. With ``registry=None`` the app opens the default (Docker) registry at
    startup and closes it at shutdown; a given registry stays the caller's to close.
    """
    workspaces = Workspaces(settings.workspace_root, uid=settings.uid, gid=settings.gid)
    runner_box: dict[str, CallRunner] = {}
    box_metrics = metrics or Metrics(
        live=lambda: len(runner_box["r"].opened) if "r" in runner_box else 0,
        restarts=lambda: _backend_restarts(runner_box),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            reg: Any = registry
            if reg is None:
                reg = await stack.enter_async_context((registry_factory or _default_registry_cm)(settings))
            workspaces.ensure_root()
            observers = getattr(reg, "egress_observers", None)
            if observers is not None:
                observers.append(box_metrics.observe_egress)
            runner = CallRunner(reg, box_metrics, max_concurrent=settings.max_concurrent_calls)
            runner_box["r"] = runner
            app.state.runner = runner
            app.state.registry = reg
            from ..mcp_server import HttpMcp

            mcp = HttpMcp(reg, runner, workspaces, token=settings.api_token)
            await stack.enter_async_context(mcp.run())
            app.state.mcp = mcp
            log.info("service.started", workspace_root=str(workspaces.root), auth=bool(settings.api_token))
            try:
                yield
            finally:
                if settings.stop_sandboxes_on_exit:
                    await _stop_opened(reg, runner)
                log.info("service.stopped")

    app = FastAPI(
        title="loom-worker",
        version=_pkg_version,
        description="Sandboxed tool execution for AI coding agents.",
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
    )
    app.state.settings = settings
    app.state.workspaces = workspaces
    app.state.schema_cache = {}
    app.state.metrics = box_metrics

    def reject_auth() -> None:
        box_metrics.rejected.labels(reason="auth").inc()

    async def require_token(request: Request) -> None:
        token = settings.api_token
        if not token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            reject_auth()
            raise _AuthError

    auth = [Depends(require_token)]

    @app.exception_handler(_AuthError)
    async def _auth_error(_r: Request, _e: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": "Missing or wrong bearer token"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(WorkspaceNotFound)
    async def _not_found(_r: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=404)

    @app.exception_handler(InvalidWorkspaceId)
    async def _bad_id(_r: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=422)

    @app.exception_handler(WorkspaceExists)
    async def _exists(_r: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=409)

    @app.exception_handler(Busy)
    async def _busy(_r: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=429, headers={"Retry-After": "1"})

    errors: dict[int | str, dict[str, Any]] = {
        401: {"model": Problem, "description": "Missing or wrong bearer token"},
        413: {"model": Problem, "description": "Request body too large"},
    }
    ws_errors: dict[int | str, dict[str, Any]] = {
        **errors,
        404: {"model": Problem, "description": "No such workspace"},
    }
    call_errors: dict[int | str, dict[str, Any]] = {
        **ws_errors,
        429: {"model": Problem, "description": "Too many concurrent calls"},
    }

    def runner_of(request: Request) -> CallRunner:
        runner: CallRunner = request.app.state.runner
        return runner

    def known_tools(request: Request) -> frozenset[str]:
        # Computed once: rendering every schema per call would cost milliseconds.
        names: frozenset[str] | None = getattr(request.app.state, "tool_names", None)
        if names is None:
            names = frozenset(s["function"]["name"] for s in request.app.state.registry.all_schemas())
            request.app.state.tool_names = names
        return names

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": _pkg_version}

    @app.get("/metrics", tags=["service"], dependencies=auth, response_class=Response, responses=errors)
    async def metrics_route() -> Response:
        return Response(box_metrics.render(), media_type=box_metrics.content_type)

    @app.get("/v1/tools", tags=["tools"], dependencies=auth, responses=errors)
    async def tools(
        request: Request, format: Literal["openai", "anthropic", "mcp"] = Query("openai")
    ) -> list[dict[str, Any]]:
        cache: dict[str, list[dict[str, Any]]] = request.app.state.schema_cache
        if format not in cache:  # the tools do not change while the service runs
            cache[format] = _schemas(request.app.state.registry, format)
        return cache[format]

    @app.get(
        "/v1/tools/search",
        tags=["tools"],
        dependencies=auth,
        responses={
            **errors,
            404: {"model": Problem, "description": "Tool search is not enabled"},
            422: {"model": SearchProblem, "description": "Empty query (INVALID_QUERY) or bad parameters"},
            503: {"model": Problem, "description": "The catalog could not be searched"},
        },
    )
    async def search_tools(
        request: Request,
        query: str = Query(max_length=2000, description="What you want to do, in words."),
        mode: Literal["fast", "balanced", "accurate"] = Query("fast"),
        capability: Annotated[
            list[str] | None, Query(max_length=16, description="Capability filter (repeatable).")
        ] = None,
        max_results: int = Query(5, ge=1, le=10),
    ) -> dict[str, Any]:
        """Search the tool catalog (``tool_search``'s output): only tools this service can
        run in a workspace are returned."""
        from ..catalog.search import InvalidQueryError
        from ..catalog.tool_search import ToolSearchArgs

        registry = request.app.state.registry
        catalog_tools = getattr(registry, "catalog_tools", None)
        if catalog_tools is None:
            return JSONResponse({"detail": "Tool search is not enabled on this service"}, status_code=404)  # type: ignore[return-value]
        try:
            args = ToolSearchArgs(query=query, mode=mode, capabilities=capability or [], max_results=max_results)
            out: dict[str, Any] = await catalog_tools.search(registry, args, has_workspace=True)
        except InvalidQueryError as e:
            return JSONResponse({"detail": str(e), "code": e.code}, status_code=422)  # type: ignore[return-value]
        except Exception as e:  # the catalog's storage or an MCP source: never a 500
            log.warning("tools.search_failed", error=f"{type(e).__name__}: {e}"[:300])
            return JSONResponse(  # type: ignore[return-value]
                {"detail": f"Tool search failed: {type(e).__name__}: {e}"[:500]}, status_code=503
            )
        return out

    @app.post(
        "/v1/workspaces",
        tags=["workspaces"],
        status_code=201,
        dependencies=auth,
        responses={**errors, 409: {"model": Problem, "description": "Name already taken"}},
    )
    async def create_workspace(request: Request, body: CreateWorkspace | None = None) -> WorkspaceOut:
        from .settings import create_with, refused

        try:
            info = await create_with(
                request.app.state.registry, workspaces, body.name if body else None, body.settings if body else None
            )
        except SettingsError as e:
            return refused(e, "settings")  # type: ignore[return-value]
        log.info("workspace.created", workspace_id=info.id)
        return WorkspaceOut(id=info.id, path=info.path)

    @app.get("/v1/workspaces", tags=["workspaces"], dependencies=auth, responses=errors)
    async def list_workspaces() -> list[WorkspaceOut]:
        return [WorkspaceOut(id=w.id, path=w.path) for w in await workspaces.list()]

    @app.delete("/v1/workspaces/{workspace_id}", tags=["workspaces"], dependencies=auth, responses=ws_errors)
    async def delete_workspace(
        request: Request,
        workspace_id: WorkspaceId,
        delete_files: bool = Query(False, description="Also delete the directory and its files."),
    ) -> dict[str, Any]:
        path = workspaces.path(workspace_id)
        runner = runner_of(request)
        async with runner.lock(path):
            stopped = await _stop_sandbox(request.app.state.registry, path)
            runner.forget(path)
            if delete_files:
                await workspaces.delete_files(workspace_id)
        log.info("workspace.deleted", workspace_id=workspace_id, files_deleted=delete_files)
        return {"id": workspace_id, "sandbox_stopped": stopped, "files_deleted": delete_files}

    # The hot routes answer with bytes encoded once from the result: validating the result
    # into a response model and re-encoding it would cost more than the tool call itself
    # for a small read. ``response_model`` keeps the OpenAPI document as it was.
    @app.post(
        "/v1/workspaces/{workspace_id}/execute",
        tags=["tools"],
        dependencies=auth,
        responses=call_errors,
        response_model=ToolResultOut,
    )
    async def execute(request: Request, workspace_id: WorkspaceId, body: ExecuteRequest) -> Response:
        path = workspaces.path(workspace_id)
        runner = runner_of(request)
        async with runner.slot():
            result = await runner.execute(
                body.tool,
                body.arguments,
                path,
                call_id=body.call_id,
                subtask_id=body.subtask_id,
                known_tools=known_tools(request),
            )
        return Response(encode_json(result_dict(result)), media_type="application/json")

    @app.post(
        "/v1/workspaces/{workspace_id}/tool_calls",
        tags=["tools"],
        dependencies=auth,
        responses=call_errors,
        response_model=list[ToolMessage],
    )
    async def tool_calls(request: Request, workspace_id: WorkspaceId, calls: list[ToolCall]) -> Response:
        """Run an assistant message's ``tool_calls`` in order; returns the tool messages
        to append to the conversation. A malformed arguments string becomes a message
        explaining it, so the model can correct itself."""
        path = workspaces.path(workspace_id)
        runner = runner_of(request)
        known = known_tools(request)
        out = []
        async with runner.slot():
            for call in calls:
                args = parse_tool_arguments(call.function.name, call.function.arguments)
                if isinstance(args, str):
                    content = args
                else:
                    result = await runner.execute(call.function.name, args, path, call_id=call.id, known_tools=known)
                    content = tool_message_content(result)
                out.append({"role": "tool", "tool_call_id": call.id, "content": content})
        return Response(encode_json(out), media_type="application/json")

    _add_changelog_routes(app, workspaces, auth, ws_errors)
    from ..dashboard import mount as mount_dashboard
    from . import calls as http_calls
    from . import changes as http_changes
    from . import ports as http_ports
    from . import sandbox as http_sandbox
    from . import stream as http_stream

    for module in (http_calls, http_changes, http_sandbox, http_stream):
        module.add_routes(app, workspaces, auth, ws_errors)
    from .snapshots import router as snapshots_router

    app.include_router(snapshots_router, dependencies=auth, responses=ws_errors)
    http_ports.add_routes(
        app, workspaces, settings.api_token, lambda reason: box_metrics.rejected.labels(reason=reason).inc()
    )
    mount_dashboard(
        app,
        token_required=bool(settings.api_token),
        on_reject=lambda reason: box_metrics.rejected.labels(reason=reason).inc(),
    )
    app.router.routes.append(Route("/v1/workspaces/{workspace_id}/mcp", endpoint=_McpEndpoint(app)))
    # Outermost: the limit applies before anything reads the body.
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        on_reject=lambda: box_metrics.rejected.labels(reason="too_large").inc(),
        exempt=http_ports.is_proxied,
    )
    return app


class _AuthError(Exception):
    pass


class _McpEndpoint:
    """ASGI endpoint handing MCP requests to the app's :class:`worker.mcp_server.HttpMcp`."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app.state.mcp.handle(scope, receive, send)


def _schemas(registry: Any, fmt: str) -> list[dict[str, Any]]:
    return list(registry.all_schemas(fmt))


def _backend(registry: Any) -> Any:
    return getattr(registry, "backend", None)


def _backend_restarts(runner_box: dict[str, CallRunner]) -> int:
    runner = runner_box.get("r")
    backend = _backend(runner.registry) if runner else None
    return int(getattr(backend, "restarts", 0) or 0)


async def _stop_sandbox(registry: Any, path: Path) -> bool:
    stop: Callable[[Path], Awaitable[bool]] | None = getattr(registry, "stop", None)
    if stop is None:
        backend = _backend(registry)
        stop = getattr(backend, "stop", None)
    if stop is None:
        return False
    try:
        return bool(await stop(path))
    except Exception as e:  # an infrastructure failure must not turn a delete into a 500
        log.warning("sandbox.stop_failed", workspace=str(path), error=str(e)[:300])
        return False


async def _stop_opened(registry: Any, runner: CallRunner) -> None:
    for path in sorted(runner.opened):
        await _stop_sandbox(registry, path)
        runner.forget(path)


def _add_changelog_routes(
    app: FastAPI, workspaces: Workspaces, auth: list[Any], responses: dict[int | str, Any]
) -> None:
    try:
        from .changelog import add_routes
    except ImportError:  # the changelog is not part of this build
        return
    add_routes(app, workspaces, auth, responses)
    from .settings import add_routes as add_settings_routes

    add_settings_routes(app, workspaces, auth, responses)
    from .egress import add_routes as add_egress_routes

    add_egress_routes(app, workspaces, auth, responses)
    from .processes import add_routes as add_process_routes

    add_process_routes(app, workspaces, auth, responses)
