"""``loom-worker tools search QUERY``, ``tools index``, ``tools sources`` (issue 6).

Added to the ``tools`` group of :mod:`worker.cli.tools`; when that group is missing they
are registered under a top-level ``catalog`` command instead. ``loom-worker tools``
(the schema listing) is given the catalog's tools too: ``tool_search``, the custom YAML
tools and the MCP tools indexed so far. Exit codes: 0 ok, 1 some source failed to
index, 2 usage error (empty query).

Stdio MCP servers run inside a workspace sandbox, so ``tools index`` indexes them only
with ``--workspace DIR`` (its sandbox starts them); HTTP servers are always indexed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..catalog.tags import CAPABILITIES

if TYPE_CHECKING:  # imported when a command runs: --help and `call` must not pay for them
    from ..catalog import IndexReport
    from ..registry import ToolRegistry
    from ..settings import Settings
    from ..tools.catalog_tools import CatalogTools


def _run(coro: Any) -> Any:
    from .. import aio

    return aio.run(coro)


def _logging(settings: Settings) -> None:
    """Logs (e.g. a custom tool file that failed to load) go to stderr; stdout is the result."""
    from . import verbosity

    verbosity.configure(settings)


def _plain_registry(settings: Settings) -> tuple[ToolRegistry, CatalogTools]:
    """The builtin tools plus the catalog's, with no sandbox backend (nothing runs here)."""
    from ..registry import ToolRegistry
    from ..tools.catalog_tools import CatalogTools, install

    _logging(settings)
    registry = ToolRegistry()
    tools = CatalogTools.from_settings(settings)
    install(registry, tools)
    return registry, tools


def _sandbox_registry(settings: Settings, backend: str) -> ToolRegistry:
    from ..registry import ToolRegistry
    from ..tools.catalog_tools import CatalogTools, install

    _logging(settings)
    if backend == "local":  # unit tests only: no isolation
        from sandbox.local import LocalProcessBackend

        registry = ToolRegistry(backend=LocalProcessBackend())
        install(registry, CatalogTools.from_settings(settings))
        return registry
    from ..registry import default_registry

    return default_registry(settings, catalog=True)


def _cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    async def run() -> IndexReport:
        if args.workspace is None:
            registry, tools = _plain_registry(settings)
            async with registry:
                return await tools.refresh(registry, None, mcp=not args.no_mcp)
        registry = _sandbox_registry(settings, args.backend)
        async with registry:
            ws = await registry.workspace(args.workspace)
            try:
                return await registry.catalog_tools.refresh(registry, ws, mcp=not args.no_mcp)
            finally:
                await registry.stop(ws.root)

    try:
        report = _run(run())
    except Exception as e:  # no sandbox, unreadable workspace: say so, no traceback
        print(f"loom-worker: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    return 1 if report.errors else 0


def _cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    from ..catalog import InvalidQueryError
    from ..catalog.tool_search import ToolSearchArgs

    try:
        search_args = ToolSearchArgs(
            query=args.query, mode=args.mode, capabilities=args.capability or [], max_results=args.max
        )
    except ValueError as e:
        print(f"loom-worker: error: {e}", file=sys.stderr)
        return 2

    async def run() -> dict[str, Any]:
        registry, tools = _plain_registry(settings)
        async with registry:
            # As seen from a workspace: every registered tool can be run there.
            return await tools.search(registry, search_args, has_workspace=True)

    try:
        out = _run(run())
    except InvalidQueryError as e:
        print(f"loom-worker: error: INVALID_QUERY: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 0


def _cmd_sources(args: argparse.Namespace, settings: Settings) -> int:
    async def run() -> dict[str, Any]:
        registry, tools = _plain_registry(settings)
        async with registry:
            sources = await tools.catalog().list_sources()
            return {"sources": [s.__dict__ for s in sources], "load_errors": tools.errors}

    out = _run(run())
    sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 1 if out["load_errors"] else 0


def _cmd_tools(args: argparse.Namespace, _settings: Settings | None) -> int:
    """``loom-worker tools``: every schema a ``default_registry`` offers, catalog tools
    included; from the cache when nothing it depends on changed (:mod:`.schema_cache`)."""
    from . import schema_cache

    text = schema_cache.load(args.format)
    if text is None:
        from ..localworker.inputs import registry_inputs
        from ..registry import ToolRegistry
        from . import load_settings

        settings = load_settings()
        if settings.catalog:
            registry, tools = _plain_registry(settings)
            problems = bool(tools.errors)
        else:
            registry, problems = ToolRegistry(), False
        text = json.dumps(registry.all_schemas(args.format), indent=2, ensure_ascii=False) + "\n"
        if not problems:  # a listing that logged a warning is built (and warns) each time
            schema_cache.store(args.format, text, registry_inputs(settings, registry))
    sys.stdout.write(text)
    return 0


def _add(group: argparse._SubParsersAction[Any]) -> None:
    p = group.add_parser(
        "search",
        help="Search the tool catalog.",
        description="Search the tool catalog, as the tool_search tool does; prints its JSON answer.",
        epilog="Exit status: 0; 2 usage error (an invalid query, --max out of range).",
    )
    p.add_argument("query", help="What you want to do, in words.")
    p.add_argument(
        "--mode",
        choices=("fast", "balanced", "accurate"),
        default="fast",
        help="fast: the full-text index only; balanced: its candidates re-ranked by the chat model; accurate: the "
        "query expanded by it first. Both need LOOM_LLM_BASE_URL and LOOM_LLM_MODEL, else fast is used.",
    )
    p.add_argument("--capability", action="append", choices=CAPABILITIES, help="Filter (repeatable).")
    p.add_argument("--max", type=int, default=5, help="Maximum results (1-10).")
    p.set_defaults(func=_cmd_search, own_settings=False)
    p = group.add_parser(
        "index",
        help="(Re)index builtin, custom and MCP tools.",
        description="Index every tool source. Stdio MCP servers run in a workspace sandbox: give --workspace.",
        epilog="Exit status: 0 every source indexed; 1 a source failed (the report says which) or no sandbox; "
        "2 usage error.",
    )
    p.add_argument("--no-mcp", action="store_true", help="Skip the configured MCP servers.")
    p.add_argument("--workspace", "-w", default=None, help="Workspace whose sandbox runs the stdio MCP servers.")
    p.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_index, own_settings=False)
    p = group.add_parser(
        "sources",
        help="Indexed tool sources, their status, and files that failed to load.",
        epilog="Exit status: 0; 1 a custom tool or MCP servers file failed to load.",
    )
    p.set_defaults(func=_cmd_sources, own_settings=False)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    try:
        from .tools import tools_subparsers

        group = tools_subparsers(subparsers)
    except (ImportError, LookupError):
        p = subparsers.add_parser("catalog", help="Search and index the tool catalog.")
        group = p.add_subparsers(dest="catalog_command", metavar="SUBCOMMAND", parser_class=type(p))
    else:
        # (Its subcommands set own_settings=False: a parent's defaults reach them.)
        subparsers.choices["tools"].set_defaults(func=_cmd_tools, own_settings=True)
    _add(group)
