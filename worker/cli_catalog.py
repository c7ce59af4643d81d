"""``loom-worker tools search QUERY`` and ``loom-worker tools index`` (issue 6).

Added to the ``tools`` group of :mod:`worker.cli_tools`; when that group is missing they
are registered under a top-level ``catalog`` command instead. Exit codes: 0 ok, 1 some
source failed to index, 2 usage error (empty query).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from .catalog import IndexReport, InvalidQueryError, index_all, open_catalog
from .catalog.capabilities import CAPABILITIES
from .catalog.search import Catalog
from .catalog.tool_search import ToolSearchArgs, tool_search
from .catalog.tool_search import openai_schema as tool_search_schema
from .settings import Settings


def _builtin_schemas() -> list[dict[str, Any]]:
    try:
        from .registry import ToolRegistry
    except ImportError:  # the registry is another area; the catalog works without it
        return [tool_search_schema()]
    schemas = list(ToolRegistry().all_schemas())
    if not any(s.get("function", {}).get("name") == "tool_search" for s in schemas):
        schemas.append(tool_search_schema())
    return schemas


async def _index(catalog: Catalog, settings: Settings, *, mcp: bool) -> IndexReport:
    return await index_all(catalog, settings, _builtin_schemas(), mcp=mcp)


def _cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    async def run() -> IndexReport:
        catalog = open_catalog(settings)
        try:
            return await _index(catalog, settings, mcp=not args.no_mcp)
        finally:
            await catalog.aclose()

    report = asyncio.run(run())
    sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    return 1 if report.errors else 0


def _cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    try:
        search_args = ToolSearchArgs(
            query=args.query, mode=args.mode, capabilities=args.capability or [], max_results=args.max
        )
    except ValueError as e:
        print(f"loom-worker: error: {e}", file=sys.stderr)
        return 2

    async def run() -> dict[str, Any]:
        catalog = open_catalog(settings)
        try:
            if await catalog.total() == 0:  # first use: index the local sources (MCP with `tools index`)
                await _index(catalog, settings, mcp=False)
            return await tool_search(catalog, search_args, allowed_ids=None)
        finally:
            await catalog.aclose()

    try:
        out = asyncio.run(run())
    except InvalidQueryError as e:
        print(f"loom-worker: error: INVALID_QUERY: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 0


def _add(group: argparse._SubParsersAction[Any]) -> None:
    p = group.add_parser("search", help="Search the tool catalog.", description="Search the tool catalog.")
    p.add_argument("query", help="What you want to do, in words.")
    p.add_argument("--mode", choices=("fast", "balanced", "accurate"), default="fast")
    p.add_argument("--capability", action="append", choices=CAPABILITIES, help="Filter (repeatable).")
    p.add_argument("--max", type=int, default=5, help="Maximum results (1-10).")
    p.set_defaults(func=_cmd_search)
    p = group.add_parser("index", help="(Re)index builtin, custom and MCP tools.")
    p.add_argument("--no-mcp", action="store_true", help="Skip the configured MCP servers.")
    p.set_defaults(func=_cmd_index)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    try:
        from .cli_tools import tools_subparsers

        group = tools_subparsers(subparsers)
    except (ImportError, LookupError):
        p = subparsers.add_parser("catalog", help="Search and index the tool catalog.")
        group = p.add_subparsers(dest="catalog_command", metavar="SUBCOMMAND", parser_class=type(p))
    _add(group)
