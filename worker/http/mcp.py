"""``/v1/workspaces/{id}/mcp``: MCP streamable HTTP for one workspace, served by the app's
:class:`worker.mcp_server.HttpMcp` (any method: POST for requests, GET for the server's
stream, DELETE to end a session)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .state import service_of


class _McpEndpoint:
    """MCP streamable HTTP for the workspace: POST a request, GET the server's stream,
    DELETE to end the session.

    (The ASGI endpoint handing them to the running service's MCP server.)"""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await service_of(scope["app"]).mcp.handle(scope, receive, send)


router = APIRouter()
router.routes.append(Route("/v1/workspaces/{workspace_id}/mcp", endpoint=_McpEndpoint()))
