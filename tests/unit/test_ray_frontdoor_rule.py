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
from worker.integrations.ray.e2brule import CATCH_ALL, E2B_FRONT, e2b_carried
from worker.integrations.ray.forward import FRONT, FRONT_UNDER_WORKSPACE, REFUSED, WEBSOCKET, carried
from worker.integrations.ray.frontdoor import front_door
from worker.settings import Settings


@pytest.fixture(scope="module")
def app() -> Any:
    # Nothing connects before the app's startup, which these tests never run.
    return front_door(Settings.model_construct(api_token="t"), "127.0.0.1:1", namespace="unit")


def _routes(app: Any) -> list[tuple[str, str]]:
    """(method, path template) of every route; ``*`` for a route of any method,
    ``WEBSOCKET`` for a WebSocket's."""
    out = []
    for route in route_table(app):
        path = route.path if isinstance(route, Mount) else str(route.path)  # type: ignore[attr-defined]
        if isinstance(route, WebSocketRoute):  # (FastAPI's APIWebSocketRoute is one)
            out.append((WEBSOCKET, path))
            continue
        methods = getattr(route, "methods", None) or {"*"}  # (Starlette's routes: not ours)
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
    # A WebSocket under a workspace is relayed to its node as any request (a terminal's screen).
    assert "WEBSOCKET /v1/workspaces/{workspace_id}/terminals/{terminal_id}/ws" in decided["forward"]
    # Loom's refusals, then E2B's (its control plane outside one sandbox: .e2brule).
    e2b_refused = [r for r in decided["refuse"] if e2b_carried(*r.split(" ", 1)) is not None]
    assert sorted(set(decided["refuse"]) - set(e2b_refused)) == sorted(f"{m} {p}" for m, p in REFUSED)


def test_every_route_of_e2bs_api_is_decided_by_its_rule(app: Any) -> None:
    """E2B's routes (served by the front door as by ``serve``): each names one sandbox
    (forwarded to its node), is one the front door answers (create, list), or is refused
    with why; nothing of E2B's is left to the front door's own E2B routes by accident."""
    e2b = [(m, p) for m, p in _routes(app) if e2b_carried("GET" if m == "*" else m, p) is not None]
    assert e2b, "the front door serves E2B's routes (the e2b extra is installed in the test environment)"
    front = set()
    for method, path in e2b:
        decision, why = e2b_carried("GET" if method == "*" else method, path)  # type: ignore[misc]
        assert why, (method, path)
        if decision == "front":
            front.add((method, path))
        # The rule decides a request's path as its route's template.
        assert CATCH_ALL.fullmatch(path) or carried(method, _concrete(path))[0] == decision, (method, path)
    # Only create and list stay at the front (each twice: the front door's route, then E2B's
    # own), and a route of every path (the code interpreter's 404, matched by its port).
    assert {r for r in front if not CATCH_ALL.fullmatch(r[1])} == set(E2B_FRONT), front
    for m, p in [("POST", "/sandboxes/{sandbox_id}/connect"), ("DELETE", "/sandboxes/{sandbox_id}")]:
        assert carried(m, p)[0] == "forward", (m, p)


def test_a_request_is_decided_as_its_route(app: Any) -> None:
    for method, path in _routes(app):
        if CATCH_ALL.fullmatch(path):
            continue  # (a route of every path, matched by a header: e2brule.ANY_PATH)
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
        # E2B's refusals in E2B's shape (its SDK reads "message").
        for method, path, words in [
            ("GET", "/sandboxes/metrics", "GET /sandboxes/{sandboxID}/metrics"),
            ("POST", "/sandboxes/i123/fork", "POST /v1/workspaces/{id}/fork"),
            ("GET", "/templates", "creating and listing sandboxes"),
        ]:
            r = await c.request(method, path, headers={"X-API-KEY": "t"})
            assert r.status_code == 501 and r.json()["code"] == 501, r.text
            assert r.json()["message"].startswith("Not served by a cluster's front door") and words in r.text, r.text


async def test_a_front_door_without_e2b_serves_none_of_it() -> None:
    app = front_door(Settings.model_construct(api_token="t"), "127.0.0.1:1", namespace="unit", e2b=[])
    assert not any(e2b_carried("GET" if m == "*" else m, p) for m, p in _routes(app))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        for method, path in [("GET", "/v2/sandboxes"), ("GET", "/sandboxes/metrics"), ("GET", "/health")]:
            r = await c.request(method, path, headers={"X-API-KEY": "t"})
            assert r.status_code == 404, (method, path, r.text)
