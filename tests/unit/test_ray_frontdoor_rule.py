"""The cluster front door's rule (:func:`worker.integrations.ray.forward.carried`), walked
over the route table of the front door's own app: every route is forwarded to its
workspace's node by the rule, served at the front by name with why, or refused with why;
a request's path is decided as its route's template is; the tables name only real routes.
(The answers themselves, route by route against one node: tests/ray/.)"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from starlette.routing import Mount, WebSocketRoute

from worker.http.app import route_table
from worker.integrations.ray.forward import FRONT, FRONT_UNDER_WORKSPACE, REFUSED, carried
from worker.integrations.ray.frontdoor import front_door
from worker.settings import Settings


@pytest.fixture(scope="module")
def app() -> Any:
    # Nothing connects before the app's startup, which these tests never run.
    return front_door(Settings.model_construct(api_token="t"), "127.0.0.1:1", namespace="unit")


def _routes(app: Any) -> list[tuple[str, str]]:
    """(method, path template) of every route; ``*`` for a route of any method."""
    out = []
    for route in route_table(app):
        path = route.path if isinstance(route, Mount) else str(route.path)  # type: ignore[attr-defined]
        methods = getattr(route, "methods", None) or {"*"}  # (Starlette's routes: not ours)
        if isinstance(route, WebSocketRoute):
            methods = {"WEBSOCKET"}
        out += [(m, path) for m in sorted(methods - {"HEAD"} or methods)]
    return out


def _concrete(path: str) -> str:
    """A request path of a route template (each parameter given a value)."""
    return re.sub(r"\{[^}]+\}", lambda m: "8080" if ":int" in m.group() else "ws-1", path)


def test_every_route_is_forwarded_at_the_front_or_refused(app: Any) -> None:
    decided: dict[str, list[str]] = {"forward": [], "front": [], "refuse": [], "unlisted": []}
    for method, path in _routes(app):
        decision, why = carried(method, path)
        decided[decision].append(f"{method} {path}")
        assert decision == "unlisted" or why, (method, path)
    assert not decided["unlisted"], f"routes in no table and under no workspace: {decided['unlisted']}"
    # The rule carries the workspace's routes (the MCP endpoint among them); the front keeps
    # what spans nodes, under a workspace only deleting, forking and the port stream.
    assert "* /v1/workspaces/{workspace_id}/mcp" in decided["forward"]
    assert "POST /v1/workspaces/{workspace_id}/execute" in decided["forward"]
    under = [r for r in decided["front"] if r.split()[1].startswith("/v1/workspaces/{")]
    assert sorted(under) == [
        "* /v1/workspaces/{workspace_id}/ports/{port:int}",
        "* /v1/workspaces/{workspace_id}/ports/{port:int}/{path:path}",
        "DELETE /v1/workspaces/{workspace_id}",
        "POST /v1/workspaces/{workspace_id}/fork",
        "POST /v1/workspaces/{workspace_id}/fork",  # (the front door's, then the app's own)
        "WEBSOCKET /v1/workspaces/{workspace_id}/ports/{port:int}",  # (the port proxy's WebSockets)
        "WEBSOCKET /v1/workspaces/{workspace_id}/ports/{port:int}/{path:path}",
    ]
    assert sorted(decided["refuse"]) == sorted(f"{m} {p}" for m, p in REFUSED)


def test_a_request_is_decided_as_its_route(app: Any) -> None:
    for method, path in _routes(app):
        m = "GET" if method == "*" else method
        assert carried(m, _concrete(path))[0] == carried(method, path)[0], (method, path)
    # A path no route has is the node's to answer under a workspace, the front's elsewhere.
    assert carried("GET", "/v1/workspaces/ws-1/no-such-route")[0] == "forward"
    assert carried("GET", "/v1/no-such-route")[0] == "unlisted"
    assert carried("GET", "/v1/workspaces/ws-1/fork/x")[0] == "forward"
    assert carried("GET", "/v1/workspaces/ws-1")[0] == "forward"
    assert carried("DELETE", "/v1/workspaces/ws-1/")[0] == "front"


def test_the_tables_name_only_real_routes(app: Any) -> None:
    routes = _routes(app)
    paths = {p for _m, p in routes}
    assert set(FRONT) <= paths | {"/"}, set(FRONT) - paths
    firsts = {p.split("/")[4] if p.count("/") > 3 else "" for p in paths if p.startswith("/v1/workspaces/{")}
    assert {pattern.split("/")[0] for _m, pattern in FRONT_UNDER_WORKSPACE} <= firsts
    assert set(REFUSED) <= set(routes)


async def test_a_refused_route_is_answered_501_naming_why(app: Any) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        r = await c.get("/v1/secrets", headers={"Authorization": "Bearer t"})
    assert r.status_code == 501 and "Not served by a cluster's front door" in r.json()["detail"], r.text
    assert "LOOM_DATA_DIR" in r.json()["detail"]
