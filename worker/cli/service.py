"""``loom-worker serve`` (HTTP API + MCP over streamable HTTP) and ``loom-worker mcp`` (stdio).

Both configure logging once, here at the entry point, to stderr: JSON in a service, console
lines in a terminal (``LOOM_LOG_FORMAT``), at ``LOOM_LOG_LEVEL`` (info unless set; ``-v``
info, ``-vv`` debug), not at the other commands' quiet default.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from .common import path_arg, unsafe_local_refused

if TYPE_CHECKING:
    from pathlib import Path

    from ..settings import Settings


def register(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="Run the HTTP API (and MCP over streamable HTTP).",
        epilog="Exit status: 0 stopped (Ctrl-C, SIGTERM); 1 --token-file cannot be read or written; 2 usage error "
        "(a bind address beyond loopback without LOOM_API_TOKEN).",
    )
    serve.add_argument("--host", help="Bind address (default LOOM_HOST or 127.0.0.1).")
    serve.add_argument("--port", type=int, help="Port (default LOOM_PORT or 8080).")
    serve.add_argument("--workspace-root", type=path_arg, help="Directory of workspaces (LOOM_WORKSPACE_ROOT).")
    serve.add_argument(
        "--token-file",
        type=path_arg,
        metavar="PATH",
        help="Without LOOM_API_TOKEN: the API token is read from PATH, or generated there (mode 0600) at the first "
        "start. docker compose keeps it in its data volume.",
    )
    from .cluster import add_ray_options

    add_ray_options(serve, required=False)
    serve.set_defaults(func=_serve, own_logging=True)

    mcp = sub.add_parser(
        "mcp",
        help="Serve one workspace's tools over MCP stdio.",
        epilog="Exit status: 0 the client closed the stream; 2 usage error (the workspace is not a directory).",
    )
    mcp.add_argument("--workspace", type=path_arg, required=True, help="Workspace directory.")
    mcp.add_argument(
        "--native-tools",
        action="store_true",
        help="Also list Anthropic's bash and str_replace_based_edit_tool by those names (LOOM_MCP_NATIVE_TOOLS).",
    )
    mcp.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)
    mcp.add_argument(
        "--snapshot-tools",
        action="store_true",
        help="Also offer snapshot, fork and restore tools, for an orchestrating agent (never give this "
        "server to an agent that should not fork its workspace).",
    )
    mcp.set_defaults(func=_mcp, own_logging=True)


def token_from_file(path: Path) -> str:
    """The API token kept in ``path``; generated there first (``secrets.token_urlsafe``,
    mode 0600, written whole or not at all) when the file is missing or empty. The token
    itself is never logged, only where it is. Raises OSError."""
    import secrets

    from sandbox.logs import get_logger

    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        get_logger("worker.cli").info("service.api_token", source=str(path))
        return token
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    from ..storage.atomic import write_atomic

    write_atomic(path, token + "\n", fsync=False)
    get_logger("worker.cli").info("service.api_token", source=str(path), generated=True)
    return token


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from ..http import UnsafeBindError, check_bind, create_app
    from . import verbosity

    updates: dict[str, Any] = {}
    if args.host:
        updates["host"] = args.host
    if args.port:
        updates["port"] = args.port
    if args.workspace_root:
        updates["workspace_root"] = args.workspace_root.resolve()
    settings = settings.model_copy(update=updates)
    verbosity.configure(settings, service=True)
    if args.token_file and not settings.api_token:
        try:
            settings = settings.model_copy(update={"api_token": token_from_file(args.token_file)})
        except OSError as e:
            print(f"loom-worker serve: --token-file {args.token_file}: {e.strerror}", file=sys.stderr)
            return 1
    try:
        check_bind(settings)
    except UnsafeBindError as e:
        print(f"loom-worker serve: {e}", file=sys.stderr)
        return 2
    routes = e2b_routes(settings)
    if routes is None:
        return 2
    if args.ray:
        # The front door of a Ray cluster: the same app, its workspaces on the nodes.
        from .cluster import ray_integration

        ray_cli = ray_integration("loom-worker serve")
        if ray_cli is None:
            return 2
        app = ray_cli.front_door(settings, args.ray, args.ray_namespace, routes)
    else:
        app = create_app(settings, routes=routes)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        server_header=False,
        # Every tool call is logged once, by the registry; a second access line per
        # request would double the log volume and cost a stdlib record each.
        access_log=False,
        # "auto" picks uvloop and httptools (C; both dependencies) when installed, else
        # asyncio and h11: together they halve uvicorn's own per-request cost.
        loop="auto",
        http="auto",
        # WebSockets (the port proxy, terminals) through wsproto, a dependency: "auto" would
        # take `websockets` instead wherever it happens to be installed, or serve none.
        ws="wsproto",
    )
    _quiet_exit_server()(config).run()
    return 0


def _quiet_exit_server() -> type:
    import contextlib

    import uvicorn

    class QuietExitServer(uvicorn.Server):
        """uvicorn's server, but a clean shutdown on SIGTERM/SIGINT exits 0 as the CLI
        reference says: uvicorn raises the signal again once it has shut down (so the
        process dies of it: status 143), which a service manager reads as a failure."""

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

    return QuietExitServer


def _mcp(args: argparse.Namespace, settings: Settings) -> int:
    from ..mcp_server import serve_stdio
    from ..registry import ToolRegistry, default_registry
    from . import verbosity

    workspace: Path = args.workspace.expanduser()
    if not workspace.is_dir():
        print(f"loom-worker mcp: workspace {workspace} is not a directory", file=sys.stderr)
        return 2
    verbosity.configure(settings, service=True)
    registry: ToolRegistry
    if args.backend == "local":
        if refused := unsafe_local_refused("local"):
            print(f"loom-worker mcp: error: {refused}", file=sys.stderr)
            return 2
        from sandbox.local import LocalProcessBackend

        registry = ToolRegistry(backend=LocalProcessBackend())
    else:
        registry = default_registry(settings)

    async def main() -> None:
        async with registry:
            extra = None
            if args.snapshot_tools:
                from ..snapshots import Snapshots
                from ..snapshots.mcp_tools import OrchestratorTools

                extra = OrchestratorTools(Snapshots.from_settings(registry, settings), workspace)
            await serve_stdio(
                registry,
                workspace,
                max_concurrent=settings.max_concurrent_calls,
                native_tools=args.native_tools or settings.mcp_native_tools,
                extra=extra,
                max_message=settings.max_body_bytes,
            )

    from .. import aio

    try:
        aio.run(main())  # uvloop, as the CLI's other commands and `serve`
    except KeyboardInterrupt:
        pass
    return 0


def e2b_routes(settings: Settings) -> list[Any] | None:
    """The routes of E2B's API when it is served (``LOOM_E2B_API``: None serves it when
    the e2b extra is installed); None (after saying why) when it must be and cannot."""
    if settings.e2b_api is False:
        return []
    from ..plugins import IntegrationUnavailable, integration

    try:
        e2b = integration("e2b")
    except IntegrationUnavailable as e:
        if settings.e2b_api:
            print(f"loom-worker serve: LOOM_E2B_API=true: {e}", file=sys.stderr)
            return None
        return []
    return list(e2b.routes(settings))
