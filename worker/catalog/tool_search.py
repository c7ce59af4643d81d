"""The ``tool_search`` builtin tool: an agent searches the catalog for the tool it needs.

Schema and output follow the Go Loom ``SearchTool``. Only tools the caller could run are
ever returned: the caller passes ``allowed_ids`` (the ids it can execute) and the filter
is applied inside the SQL query, so hidden tools never even count as candidates.

``tool_search`` raises :class:`worker.catalog.search.InvalidQueryError` for an empty query
(the model's problem; the registry turns it into ``success=false``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from ..tool import ToolArgs
from .capabilities import CAPABILITIES
from .search import Catalog, SearchHit

NAME = "tool_search"
DESCRIPTION = (
    "Search the catalog of available tools by describing what you want to do. Returns the best "
    "matching tools with their parameters and a confidence; call a returned tool by its name."
)

_SOURCE_LABEL = {"builtin": "BUILTIN", "custom": "CUSTOM", "mcp": "MCP"}


class ToolSearchArgs(ToolArgs):
    """Arguments of ``tool_search``."""

    query: str = Field(description="Natural language description of what you want to do")
    mode: Literal["fast", "balanced", "accurate"] = Field(
        "fast", description="Search accuracy mode: fast (index only), balanced (re-ranked), accurate"
    )
    capabilities: list[str] = Field(
        default_factory=list,
        description="Capability filters (e.g. ['notification', 'database']); one of " + ", ".join(CAPABILITIES),
    )
    max_results: int = Field(5, ge=1, le=10, description="Maximum results (default: 5, max: 10)")
    task_context: str | None = Field(None, max_length=2000, description="Optional context for ranking")


def openai_schema() -> dict[str, Any]:
    """The OpenAI-format schema, generated from :class:`ToolSearchArgs`."""
    params = ToolSearchArgs.model_json_schema()
    params.pop("title", None)
    for p in params.get("properties", {}).values():
        p.pop("title", None)
    return {"type": "function", "function": {"name": NAME, "description": DESCRIPTION, "parameters": params}}


def simplify_parameters(schema: dict[str, Any]) -> dict[str, str]:
    """``{"param": "description (type[, required])"}`` from a JSON Schema object."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return {}
    required = set(schema.get("required") or ())
    out: dict[str, str] = {}
    for name, p in props.items():
        p = p if isinstance(p, dict) else {}
        typ = p.get("type")
        if isinstance(typ, list):
            typ = "|".join(str(t) for t in typ)
        if typ is None and "anyOf" in p:
            typ = "|".join(str(a.get("type")) for a in p["anyOf"] if isinstance(a, dict) and a.get("type"))
        desc = str(p.get("description") or "").strip()
        tail = f"{typ or 'any'}{', required' if name in required else ''}"
        out[str(name)] = f"{desc} ({tail})" if desc else f"({tail})"
    return out


def _result(hit: SearchHit, call_names: Mapping[str, str] | None) -> dict[str, Any]:
    t = hit.tool
    return {
        # The name to call it by: an MCP tool is registered as mcp__<server>__<tool>.
        "name": (call_names or {}).get(t.id, t.name),
        "id": t.id,
        "description": t.description,
        "confidence": f"{round(hit.confidence * 100)}%",
        "source": _SOURCE_LABEL.get(t.source, t.source.upper()),
        "mcp_server": t.mcp_server or None,
        "match_reason": hit.match_reason,
        "capabilities": list(t.capabilities),
        "parameters": simplify_parameters(t.input_schema),
    }


async def tool_search(
    catalog: Catalog,
    args: ToolSearchArgs,
    *,
    allowed_ids: set[str] | None,
    call_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run a search for an agent. ``allowed_ids=None`` means every indexed tool is callable;
    ``call_names`` maps a catalog id to the registry name to call it by (default: its name).

    Raises InvalidQueryError for an empty query.
    """
    resp = await catalog.search(
        args.query,
        mode=args.mode,
        capabilities=args.capabilities,
        max_results=args.max_results,
        task_context=args.task_context,
        allowed_ids=allowed_ids,
    )
    meta = resp.metadata
    out: dict[str, Any] = {
        "query": args.query,
        "results_count": len(resp.results),
        "results": [_result(h, call_names) for h in resp.results],
        "search_mode": meta.mode_used.value.upper(),
        "search_time_ms": round(meta.total_ms, 2),
        "total_tools_indexed": meta.total_indexed,
    }
    if meta.fallback_reason:
        out["note"] = f"searched in FAST mode: {meta.fallback_reason}"
    unknown = [c for c in args.capabilities if c not in CAPABILITIES]
    if unknown:
        out["note"] = (out.get("note", "") + f" unknown capabilities {unknown}; known: {list(CAPABILITIES)}").strip()
    return out
