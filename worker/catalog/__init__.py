"""The tool catalog (issue 6, Go Loom tool registry): a SQLite FTS5 index of builtin,
custom (YAML) and MCP tools, searched by ``tool_search``, the CLI and HTTP.

Entry points for the service and CLI: :func:`open_catalog` (from settings) and
:func:`index_all` (every source, errors reported per file / per server).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .custom import CustomTool, load_custom_tools
from .index import IndexStats
from .llm import OpenAICompatProvider
from .mcp_source import MCPSource, index_mcp_sources, load_mcp_config
from .search import Catalog, InvalidQueryError, SearchMode

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["Catalog", "IndexReport", "InvalidQueryError", "SearchMode", "index_all", "open_catalog"]


def db_path(settings: Settings) -> Path:
    return settings.data_dir / "catalog" / "tools.db"


def tools_dir(settings: Settings) -> Path:
    return settings.tools_dir or settings.data_dir / "tools"


def mcp_file(settings: Settings) -> Path:
    return settings.mcp_servers_file or settings.data_dir / "mcp_servers.yaml"


def open_catalog(settings: Settings) -> Catalog:
    """The catalog in the data directory, with a chat provider when one is configured."""
    llm = None
    if settings.llm_base_url and settings.llm_model:
        llm = OpenAICompatProvider(
            settings.llm_base_url,
            settings.llm_model,
            api_key=settings.llm_api_key,
            timeout=settings.llm_timeout,
        )
    return Catalog.open(db_path(settings), llm)


@dataclass
class IndexReport:
    stats: dict[str, IndexStats] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # "custom:<file>" / "mcp:<server>" -> why
    custom_tools: list[CustomTool] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sources": {k: {"total": s.total, "written": s.written, "pruned": s.pruned} for k, s in self.stats.items()},
            "errors": self.errors,
        }
        return out


async def index_all(
    catalog: Catalog, settings: Settings, builtin_schemas: Sequence[dict[str, Any]], *, mcp: bool = True
) -> IndexReport:
    """Index builtin tools, custom YAML tools and (with ``mcp``) the configured MCP servers."""
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
