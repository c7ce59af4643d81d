"""The tool catalog (issue 6, Go Loom tool registry): a SQLite FTS5 index of builtin,
custom (YAML) and MCP tools, searched by ``tool_search``, the CLI and HTTP.

Entry points for the service and CLI: :func:`open_catalog` (from settings) and
:func:`index_all` (every source, errors reported per file / per server).

The submodules' names re-exported here are imported on first use (PEP 562): importing the
package (the CLI's ``--help`` reads :mod:`.tags`) must not load SQLite, pydantic and the
MCP SDK.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from worker.settings import Settings

    from .custom import CustomTool, load_custom_tools
    from .index import IndexStats
    from .llm import OpenAICompatProvider
    from .mcp_source import MCPSource, index_mcp_sources, load_mcp_config
    from .report import IndexReport
    from .search import Catalog, InvalidQueryError, SearchMode

__all__ = [
    "Catalog",
    "CustomTool",
    "IndexReport",
    "IndexStats",
    "InvalidQueryError",
    "MCPSource",
    "OpenAICompatProvider",
    "SearchMode",
    "index_all",
    "index_mcp_sources",
    "load_custom_tools",
    "load_mcp_config",
    "open_catalog",
]

_LAZY = {
    "CustomTool": ".custom",
    "load_custom_tools": ".custom",
    "IndexStats": ".index",
    "IndexReport": ".report",
    "OpenAICompatProvider": ".llm",
    "MCPSource": ".mcp_source",
    "index_mcp_sources": ".mcp_source",
    "load_mcp_config": ".mcp_source",
    "Catalog": ".search",
    "InvalidQueryError": ".search",
    "SearchMode": ".search",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def db_path(settings: Settings) -> Path:
    return settings.data_dir / "catalog" / "tools.db"


def tools_dir(settings: Settings) -> Path:
    return settings.tools_dir or settings.data_dir / "tools"


def mcp_file(settings: Settings) -> Path:
    return settings.mcp_servers_file or settings.data_dir / "mcp_servers.yaml"


def open_catalog(settings: Settings) -> Catalog:
    """The catalog in the data directory, with a chat provider when one is configured."""
    from .llm import OpenAICompatProvider
    from .search import Catalog

    llm = None
    if settings.llm_base_url and settings.llm_model:
        llm = OpenAICompatProvider(
            settings.llm_base_url,
            settings.llm_model,
            api_key=settings.llm_api_key,
            timeout=settings.llm_timeout,
        )
    return Catalog.open(db_path(settings), llm)


async def index_all(
    catalog: Catalog, settings: Settings, builtin_schemas: Sequence[dict[str, Any]], *, mcp: bool = True
) -> IndexReport:
    """Index builtin tools, custom YAML tools and (with ``mcp``) the configured MCP servers."""
    from .custom import load_custom_tools
    from .mcp_source import MCPSource, index_mcp_sources, load_mcp_config
    from .report import IndexReport

    report = IndexReport()
    report.stats["builtin"] = await catalog.index_builtin(builtin_schemas)
    loaded = load_custom_tools(tools_dir(settings))
    report.custom_tools = loaded.tools
    report.errors.update({f"custom:{f}": e for f, e in loaded.errors.items()})
    report.stats["custom"] = await catalog.index_tools("custom", [t.descriptor() for t in loaded.tools])
    if mcp:
        try:
            servers, errors = load_mcp_config(mcp_file(settings))
        except ValueError as e:
            report.errors["mcp"] = str(e)
            return report
        report.errors.update({f"mcp:{n}": e for n, e in errors.items()})
        for name, res in (await index_mcp_sources(catalog, [MCPSource(s) for s in servers])).items():
            if isinstance(res, str):
                report.errors[f"mcp:{name}"] = res
            else:
                report.stats[f"mcp:{name}"] = res
    return report
