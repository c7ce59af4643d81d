"""The tools: ``GET /v1/tools`` (their definitions, for a model's tool list) and
``GET /v1/tools/search`` (the tool catalog, ``tool_search``'s output).

Both read the registry on every request: tools can be added while the service runs (the
catalog's MCP servers, custom tools), and a listing must show them at once.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import Field

from sandbox.logs import get_logger

from ..catalog.search import InvalidQueryError
from ..catalog.tool_search import ToolSearchArgs
from ..registry.contract import SearchesCatalog
from .common import ERRORS, Problem, StrictModel
from .errors import NoToolSearch, Unavailable
from .state import ServiceDep

log = get_logger("worker.http")

router = APIRouter(tags=["tools"])


class SearchProblem(StrictModel):
    detail: Any
    code: str | None = Field(None, description="INVALID_QUERY for an empty query.")


@router.get("/v1/tools", responses=ERRORS)
async def tools(
    service: ServiceDep, format: Literal["openai", "anthropic", "mcp"] = Query("openai")
) -> list[dict[str, Any]]:
    # Rendered on each request (a few ms): the list is the registry's as it is now.
    return service.registry.all_schemas(format)


@router.get(
    "/v1/tools/search",
    responses={
        **ERRORS,
        404: {"model": Problem, "description": "Tool search is not enabled"},
        422: {"model": SearchProblem, "description": "Empty query (INVALID_QUERY) or bad parameters"},
        503: {"model": Problem, "description": "The catalog could not be searched"},
    },
)
async def search_tools(
    service: ServiceDep,
    query: str = Query(max_length=2000, description="What you want to do, in words."),
    mode: Literal["fast", "balanced", "accurate"] = Query("fast"),
    capability: Annotated[list[str] | None, Query(max_length=16, description="Capability filter (repeatable).")] = None,
    max_results: int = Query(5, ge=1, le=10),
) -> dict[str, Any]:
    """Search the tool catalog (``tool_search``'s output): only tools this service can
    run in a workspace are returned."""
    registry = service.registry
    catalog_tools = registry.catalog_tools if isinstance(registry, SearchesCatalog) else None
    if catalog_tools is None:
        raise NoToolSearch
    args = ToolSearchArgs(query=query, mode=mode, capabilities=capability or [], max_results=max_results)
    try:
        out: dict[str, Any] = await catalog_tools.search(registry, args, has_workspace=True)
    except InvalidQueryError:
        raise
    except Exception as e:  # the catalog's storage or an MCP source: never a 500
        log.warning("tools.search_failed", error=f"{type(e).__name__}: {e}"[:300])
        raise Unavailable(f"Tool search failed: {type(e).__name__}: {e}"[:500]) from None
    return out
