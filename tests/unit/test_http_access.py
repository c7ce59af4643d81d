"""Who may call the service, proved route by route: the route table is read from the app
itself (every method of every path, path parameters filled in), so a route added later
is covered without being named here. Each must refuse a missing token, a wrong token and
a cross-site request, and without a token (loopback-only mode) a Host that is not a
loopback name. The exceptions are listed here, each with its reason (worker.auth).

The cross-site rule: a state-changing request (any method but GET, HEAD, OPTIONS) from another
origin is refused everywhere; a read (GET, HEAD, OPTIONS, the Server-Sent Event streams
included) is refused when a browser says it comes from another origin and it is not a
navigation, everywhere but the port proxy (the agent's app is a sandboxed document
there: an opaque origin, so the browser marks the app's own requests cross-site).

WebSocket routes are read from the same table and proved the same way with handshakes
(an unauthenticated, a wrong token, a cross-origin one refused; the token as a header or
as the ``loom.bearer.`` subprotocol, from no origin or this one, let through). A
WebSocket handshake is state-changing: the port proxy's are refused cross-site too. A
probe route (:data:`PROBE`, this test's own) stands for the service's routes until the
service has one of its own.
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Mount, WebSocketRoute
from starlette.websockets import WebSocket

from tests.asgi_ws import Answer, handshake
from tests.unit.test_http import AUTH, TOKEN, Service, lifespan_task, running
from worker.auth import accept_subprotocol, bearer_subprotocol
from worker.http.app import route_table
from worker.registry import ToolRegistry
from worker.settings import Settings

#: Served without a token: they hold no data (method, path as the route table has it).
PUBLIC = {
    ("GET", "/healthz"),  # a container's health check
    ("GET", "/openapi.json"),  # the API's description, and its two pages
    ("HEAD", "/openapi.json"),
    ("GET", "/docs"),
    ("HEAD", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("HEAD", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    ("HEAD", "/redoc"),
    ("GET", "/"),  # the dashboard's page and assets
    ("GET", "/ui/{path:path}"),
}
#: Reads that are not refused cross-site: the port proxy (see the module docstring).
PORTS = re.compile(r"^/v1/workspaces/\{workspace_id\}/ports/")
#: A value for each path parameter (an existing workspace: a refusal is then the guard's,
#: not a 404). A route with a parameter not listed here fails the test until it is.
NOTHING_LISTENS = 1  # tcpmux: privileged, and nothing serves it (the proxy answers 502)
FILL = {
    "workspace_id": "w1",
    "entry_id": "1",
    "process_id": "p1",
    "name": "TOKEN",
    "ref": "s1",
    "port": str(NOTHING_LISTENS),
    "path": "index.js",
}
#: The methods tried on a route that takes any (the port proxy, the MCP endpoint);
#: PROPFIND: the proxy carries any method to the app, and any but a read is a write.
ANY = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND")
READS = {"GET", "HEAD", "OPTIONS"}
CROSS_SITE_WRITE = {"Origin": "http://evil.example"}
CROSS_SITE_READ = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}


def fill(template: str) -> str:
    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        assert name in FILL, f"{template}: give the parameter {name!r} a value in FILL"
        return FILL[name]

    return re.sub(r"\{(\w+)(?::\w+)?\}", value, template)


def served(app: Any) -> Iterator[tuple[str, str]]:
    """(method, path template) of every HTTP route the app serves."""
    for route in route_table(app):
        if isinstance(route, Mount):
            yield "GET", route.path + "/{path:path}"
            continue
        if isinstance(route, WebSocketRoute):  # (FastAPI's APIWebSocketRoute is one too)
            continue
        for method in sorted(route.methods or ANY):  # type: ignore[attr-defined]
            yield method, route.path  # type: ignore[attr-defined]


def sockets(app: Any) -> list[str]:
    """The path template of every WebSocket route the app serves."""
    return [route.path for route in route_table(app) if isinstance(route, WebSocketRoute)]


async def _probe(ws: WebSocket) -> None:
    """Accepts with the probe's subprotocol, says hello, closes."""
    await ws.accept(subprotocol=accept_subprotocol(ws.scope, ("probe.v1",)))
    await ws.send_text("hello")
    await ws.close()


#: A WebSocket route of the API kind, this test's own (the service's WebSocket routes, when
#: it has them, are in the table and covered the same).
PROBE = WebSocketRoute("/v1/workspaces/{workspace_id}/ws-probe", _probe)


@pytest.fixture
async def svc(tmp_path: Path, local_backend: Any) -> AsyncIterator[Service]:
    async with running(tmp_path / "root", ToolRegistry(backend=local_backend), routes=[PROBE]) as s:
        await s.workspace("w1")
        yield s


def anonymous(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8080")


def test_the_table_is_the_whole_app(svc: Service) -> None:
    table = set(served(svc.app))
    assert len(table) > 40
    for expected in [
        ("POST", "/v1/workspaces/{workspace_id}/execute"),
        ("GET", "/v1/workspaces/{workspace_id}/calls/stream"),
        ("POST", "/v1/workspaces/{workspace_id}/mcp"),
        ("GET", "/v1/workspaces/{workspace_id}/mcp"),
        ("DELETE", "/v1/workspaces/{workspace_id}/mcp"),
        ("POST", "/v1/workspaces/{workspace_id}/ports/{port:int}/{path:path}"),
        ("GET", "/v1/workspaces/{workspace_id}/ports/{port:int}"),
    ]:
        assert expected in table
    assert PUBLIC <= table, PUBLIC - table  # an exception that no longer exists is removed
    assert {
        PROBE.path,
        "/v1/workspaces/{workspace_id}/ports/{port:int}",
        "/v1/workspaces/{workspace_id}/ports/{port:int}/{path:path}",
    } <= set(sockets(svc.app))


async def test_every_route_but_the_public_ones_refuses_a_missing_or_wrong_token(svc: Service) -> None:
    wrong = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer"},
        {"Authorization": TOKEN},
        {"Authorization": "Basic " + base64.b64encode(b"me:wrong").decode()},
        {"Authorization": "Basic " + TOKEN},  # the right token, not as Basic credentials
    ]
    answered_without_token = set()
    async with anonymous(svc.app) as c:
        for method, template in served(svc.app):
            for headers in wrong:
                r = await c.request(method, fill(template), headers=headers)
                if (method, template) in PUBLIC:
                    assert r.status_code != 401, (method, template)
                    if not headers:
                        answered_without_token.add((method, template))
                    continue
                assert r.status_code == 401, (method, template, headers, r.status_code, r.text[:200])
                challenge = r.headers["www-authenticate"]
                assert challenge == "Bearer" or (PORTS.match(template) and challenge.startswith("Basic ")), challenge
                if method != "HEAD":
                    assert "token" in r.json()["detail"]
    assert answered_without_token == PUBLIC
    assert not (svc.root / "x").exists()
    metrics = (await svc.client.get("/metrics")).text
    assert 'loom_http_rejected_total{reason="auth"}' in metrics


async def test_every_route_refuses_a_cross_site_request(svc: Service) -> None:
    async with anonymous(svc.app) as c:
        for method, template in served(svc.app):
            url = fill(template)
            if method not in READS:
                for headers in (CROSS_SITE_WRITE, {"Origin": "null"}, {"Sec-Fetch-Site": "same-site"}):
                    r = await c.request(method, url, headers={**AUTH, **headers})
                    assert r.status_code == 403, (method, template, headers, r.status_code)
                    assert "Cross-site request refused" in r.json()["detail"]
                continue
            for headers in (CROSS_SITE_READ, {"Origin": "http://evil.example"}):
                r = await c.request(method, url, headers={**AUTH, **headers})
                if PORTS.match(template):  # the exception: the request reaches the proxy
                    assert r.status_code in (308, 502), (method, template, r.status_code, r.text[:200])
                    continue
                assert r.status_code == 403, (method, template, headers, r.status_code)
                if method != "HEAD":
                    assert "Cross-site request refused" in r.json()["detail"]
    assert (svc.root / "w1").is_dir()  # the DELETE was refused
    assert 'loom_http_rejected_total{reason="origin"}' in (await svc.client.get("/metrics")).text


async def test_with_the_token_the_guard_lets_every_route_through(svc: Service) -> None:
    # The refusals above are the guard's, not a route's own 401/403: the same requests,
    # made from this origin with the token, are never refused so.
    async with anonymous(svc.app) as c:
        for method, template in served(svc.app):
            if method not in READS or template.endswith("/stream") or "{process_id}" in template:
                continue  # not run: reads only (the streams never end; a process is waited for)
            r = await c.request(method, fill(template), headers={**AUTH, "Sec-Fetch-Site": "same-origin"})
            assert r.status_code not in (401, 403), (method, template, r.status_code, r.text[:200])


@pytest.fixture
async def open_app(tmp_path: Path, local_backend: Any) -> AsyncIterator[Any]:
    from worker.http import create_app

    app = create_app(Settings(workspace_root=tmp_path / "root"), ToolRegistry(backend=local_backend), routes=[PROBE])
    async with lifespan_task(app):
        (tmp_path / "root" / "w1").mkdir()
        yield app


async def test_without_a_token_every_route_refuses_a_host_that_is_not_loopback(open_app: Any) -> None:
    async with anonymous(open_app) as c:
        for method, template in served(open_app):
            for host in ("evil.example", "127.0.0.1.nip.io:8080"):
                r = await c.request(method, fill(template), headers={"Host": host})
                assert r.status_code == 403, (method, template, host, r.status_code)
                if method != "HEAD":
                    assert "DNS rebinding" in r.json()["detail"]
            if PORTS.match(template):  # the proxy answers only on a service with a token
                r = await c.request(method, fill(template))
                assert r.status_code == 403 and (method == "HEAD" or "port-forward" in r.json()["detail"])


# -- WebSocket routes ----------------------------------------------------------------------------

SAME_ORIGIN = {"Origin": "http://127.0.0.1:8080"}
WRONG_TOKENS: list[tuple[dict[str, str], list[str]]] = [
    ({}, []),
    ({"Authorization": "Bearer wrong"}, []),
    ({"Authorization": "Basic " + base64.b64encode(b"me:wrong").decode()}, []),
    ({}, [bearer_subprotocol("wrong")]),
    ({}, ["loom.bearer." + TOKEN]),  # the token, not as base64url
    ({}, ["loom.bearer.!!"]),
    ({}, ["probe.v1", "loom.bearer."]),
    ({}, [bearer_subprotocol(TOKEN) + "=="]),  # (no padding)
]
CROSS_SITE: list[dict[str, str]] = [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},  # a sandboxed frame (the port proxy's own pages too), a file: page
    {"Origin": "http://127.0.0.1:9999"},  # another port of this host: another origin
    {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "websocket", "Sec-Fetch-Dest": "websocket"},
    {"Sec-Fetch-Site": "same-site"},
]


def _expect_guard_refusal(answer: Answer, status: int, where: Any) -> None:
    assert answer.kind == "http" and answer.status == status, (where, answer)


async def test_every_websocket_route_refuses_a_missing_or_wrong_token(svc: Service) -> None:
    for template in sockets(svc.app):
        for headers, subprotocols in WRONG_TOKENS:
            answer = await handshake(svc.app, fill(template), {**SAME_ORIGIN, **headers}, subprotocols)
            _expect_guard_refusal(answer, 401, (template, headers, subprotocols))
            challenge = answer.headers["www-authenticate"]
            assert challenge == "Bearer" or (PORTS.match(template) and challenge.startswith("Basic ")), challenge
            assert "token" in answer.detail and "loom.bearer." in answer.detail
        # On a server without the denial extension: closed before it is accepted.
        closed = await handshake(svc.app, fill(template), SAME_ORIGIN, denial=False)
        assert (closed.kind, closed.code) == ("close", 1008) and "token" in closed.reason, closed
    metrics = (await svc.client.get("/metrics")).text
    assert 'loom_http_rejected_total{reason="auth"}' in metrics


async def test_every_websocket_route_refuses_a_cross_site_handshake(svc: Service) -> None:
    for template in sockets(svc.app):
        for headers in CROSS_SITE:
            for token in ({"headers": AUTH}, {"subprotocols": ["probe.v1", bearer_subprotocol(TOKEN)]}):
                given = {**token.get("headers", {}), **headers}  # type: ignore[dict-item]
                answer = await handshake(svc.app, fill(template), given, token.get("subprotocols", ()))
                _expect_guard_refusal(answer, 403, (template, headers))
                assert "Cross-site request refused" in answer.detail and "WebSocket" in answer.detail
    assert 'loom_http_rejected_total{reason="origin"}' in (await svc.client.get("/metrics")).text


async def test_with_the_token_the_guard_lets_every_websocket_route_through(svc: Service) -> None:
    # The token as a header or as the subprotocol; from a client that is not a browser (no
    # Origin) or from this service's own page. Then the route answers: the probe accepts
    # with its own subprotocol, never the token's; the port proxy finds nothing on the port.
    ways: list[tuple[dict[str, str], list[str]]] = [
        (AUTH, []),
        ({**AUTH, **SAME_ORIGIN, "Sec-Fetch-Site": "same-origin"}, ["probe.v1"]),
        (SAME_ORIGIN, [bearer_subprotocol(TOKEN), "probe.v1"]),
        ({}, ["probe.v1", bearer_subprotocol(TOKEN)]),
    ]
    for template in sockets(svc.app):
        for headers, subprotocols in ways:
            answer = await handshake(svc.app, fill(template), headers, subprotocols)
            if PORTS.match(template):
                assert (answer.kind, answer.status) == ("http", 502), (template, answer)
                assert "Nothing listens" in answer.detail
            elif template == PROBE.path:
                assert answer.kind == "accept", (headers, answer)
                assert answer.subprotocol == ("probe.v1" if subprotocols else None)
            else:
                assert answer.kind == "accept" or answer.status not in (401, 403), (template, headers, answer)


async def test_without_a_token_every_websocket_route_refuses_a_host_that_is_not_loopback(open_app: Any) -> None:
    for template in sockets(open_app):
        for host in ("evil.example", "127.0.0.1.nip.io:8080"):
            answer = await handshake(open_app, fill(template), host=host)
            _expect_guard_refusal(answer, 403, (template, host))
            assert "DNS rebinding" in answer.detail
        answer = await handshake(open_app, fill(template), {"Origin": "http://evil.example"})
        _expect_guard_refusal(answer, 403, template)
        if PORTS.match(template):  # the proxy answers only on a service with a token
            answer = await handshake(open_app, fill(template))
            _expect_guard_refusal(answer, 403, template)
            assert "port-forward" in answer.detail
