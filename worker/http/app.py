"""The HTTP API (``loom-worker serve``): :func:`create_app` composes the route groups, a
module each with its own ``APIRouter`` and models:

    :mod:`.health`      GET /healthz (public), GET /metrics
    :mod:`.tools`       GET /v1/tools, GET /v1/tools/search
    :mod:`.workspaces`  POST /v1/workspaces, GET /v1/workspaces, DELETE /v1/workspaces/{id}
    :mod:`.execute`     POST .../execute, POST .../tool_calls
    :mod:`.changelog`   GET .../changelog, .../changelog/{entry}/members, .../diff; POST .../undo
    :mod:`.settings`    GET and PATCH /v1/workspaces/{id}
    :mod:`.egress`      GET .../egress
    :mod:`.processes`   GET .../processes, .../processes/{pid}/output; POST .../input, .../kill
    :mod:`.terminals`   POST, GET .../terminals; GET, DELETE .../terminals/{tid}; WS .../terminals/{tid}/ws
    :mod:`.calls`       GET .../calls, .../calls/stream
    :mod:`.changes`     GET .../changelog/diff
    :mod:`.sandbox`     GET .../sandbox
    :mod:`.harness`     POST .../sandbox/exec, GET and PUT .../sandbox/files   the harness API
    :mod:`.stream`      POST .../execute/stream
    :mod:`.ports`       * .../ports/{port}/{path}   a server in the sandbox
    :mod:`.ports_ws`    WEBSOCKET .../ports/{port}/{path}   its WebSockets
    :mod:`.mcp`         * .../mcp                   MCP streamable HTTP
    :mod:`worker.dashboard`   GET / and /ui/*  (public)

Routes raise; the status of every error is decided by one table, :mod:`.errors`.
Every route list, with its parameters and models: ``docs/reference/http.md`` (generated,
:mod:`worker.docs_gen`). Who may call is decided once, for every route, by
:class:`worker.auth.AccessGuard`; the routes reach the service's state through
:data:`.state.ServiceDep`.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, FastAPI
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from sandbox import __version__

from .. import dashboard
from ..auth import Access, AccessGuard, Paths, UnsafeBindError
from ..auth import check_bind as _check_bind
from ..metrics import Metrics
from ..registry.contract import ServiceRegistry
from ..service import Workspaces
from ..settings import Settings
from . import (
    calls,
    changelog,
    changes,
    code,
    egress,
    execute,
    harness,
    health,
    images,
    mcp,
    native,
    ports,
    ports_ws,
    processes,
    sandbox,
    secrets,
    snapshots,
    stream,
    terminals,
    tools,
    workspaces,
)
from . import settings as workspace_settings
from .body_limit import BodyLimit
from .common import SafeJSONResponse
from .errors import HANDLERS, Handlers
from .lifespan import RegistryFactory, lifespan
from .state import Service

#: The route groups, in the order their routes are matched and documented. A new group
#: (an ``APIRouter`` in a module of its own) is added here.
ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    tools.router,
    images.router,
    workspaces.router,
    execute.router,
    changelog.router,
    workspace_settings.router,
    egress.router,
    processes.router,
    terminals.router,
    code.router,
    calls.router,
    changes.router,
    sandbox.router,
    harness.router,
    secrets.router,
    snapshots.router,
    stream.router,
    native.router,
    ports.router,
    ports_ws.router,
)


def check_bind(settings: Settings) -> None:
    """Refuse to listen beyond loopback without a token. Raises UnsafeBindError."""
    _check_bind(settings.host, settings.api_token)


def create_app(
    settings: Settings,
    registry: ServiceRegistry | None = None,
    *,
    metrics: Metrics | None = None,
    registry_factory: RegistryFactory | None = None,
    workspaces: Workspaces | None = None,
    routes: Sequence[BaseRoute] = (),
    middleware: Sequence[Middleware] = (),
    exception_handlers: Handlers | None = None,
) -> FastAPI:
    """The service. With ``registry=None`` the app opens the default (Docker) registry at
    startup and closes it at shutdown; a given registry stays the caller's to close.

    The extension points (a cluster's front door uses them all): ``workspaces`` replaces
    the directories under ``LOOM_WORKSPACE_ROOT``; ``routes`` are matched before the
    service's own (one with a route's method and path replaces it); ``middleware`` runs
    innermost, after the token and body-limit checks, before the routes;
    ``exception_handlers`` are added to the service's.
    """
    service = Service(
        settings=settings,
        workspaces=workspaces or Workspaces(settings.workspace_root, uid=settings.uid, gid=settings.gid),
        access=Access(settings.api_token),
    )
    # The gauges read the running service when scraped.
    service.metrics = metrics or Metrics(
        live=service.sandboxes_open, restarts=service.sandbox_restarts, pool=service.warm_pool
    )
    app = FastAPI(
        title="loom-worker",
        version=__version__,
        description="Sandboxed tool execution for AI coding agents.",
        lifespan=lifespan(registry, registry_factory),
        default_response_class=SafeJSONResponse,
        exception_handlers={**HANDLERS, **(exception_handlers or {})},
        middleware=list(middleware),
    )
    app.state.service = service
    app.router.routes.extend(routes)
    for router in ROUTERS:
        app.include_router(router)
    dashboard.mount(app)
    app.include_router(mcp.router)
    app.add_middleware(
        AccessGuard,
        access=service.access,
        paths=public_paths(app),
        on_reject=service.reject,
    )
    # Outermost: the limit applies before anything reads the body.
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        on_reject=lambda: service.reject("too_large"),
        exempt=ports.is_proxied,
        limit_for=harness.body_limit,
    )
    return app


def route_table(app: FastAPI) -> list[BaseRoute]:
    """Every route ``app`` serves, in the order requests are matched, the routes of the
    included routers in their place (FastAPI 0.12x and later keep an included router as
    one node of ``app.routes``; earlier ones copied its routes). Raises RuntimeError for
    a router included with a prefix (none is: each route declares its whole path)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # a FastAPI that copies included routes into app.routes
        return list(app.routes)
    out: list[BaseRoute] = []
    for ctx in iter_route_contexts(app.routes):
        route = ctx.original_route
        if getattr(route, "path", None) != ctx.path:  # no router is included with a prefix
            raise RuntimeError(f"route {ctx.name!r}: served at {ctx.path!r}, declared at {route!r}")
        out.append(route)
    return out


def public_paths(app: FastAPI) -> Paths:
    """The paths served without a token: the health check, the OpenAPI document and its
    pages, the dashboard's page and assets (none holds data); and the port proxy's."""
    docs = (app.openapi_url, app.docs_url, app.swagger_ui_oauth2_redirect_url, app.redoc_url)
    return Paths(
        public=frozenset({"/healthz", dashboard.PAGE, *(p for p in docs if p)}),
        public_prefixes=(dashboard.ASSETS_PREFIX,),
        ports=ports.is_port_path,
    )


__all__ = ["ROUTERS", "UnsafeBindError", "check_bind", "create_app", "public_paths", "route_table"]
