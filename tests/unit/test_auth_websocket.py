"""worker.auth's decisions on WebSocket handshakes: a handshake is state-changing (a
browser's is refused unless its ``Origin`` is the service; one without ``Origin`` is a
client that is not a browser), and its token is the bearer header, or for the port proxy
the Basic password, or the ``loom.bearer.<base64url>`` subprotocol, which a route never
echoes. (Every route of the app, walked from its route table: test_http_access.py.)"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from tests.asgi_ws import handshake
from worker.auth import (
    BEARER_SUBPROTOCOL,
    Access,
    AccessGuard,
    Facts,
    Kind,
    Paths,
    accept_subprotocol,
    bearer_subprotocol,
    offered_subprotocols,
    subprotocol_token,
)

TOKEN = "s3cret+/=token~"
HOST = "127.0.0.1:8080"
ACCESS = Access(TOKEN)


def ws_facts(headers: dict[str, str] | None = None, subprotocols: tuple[str, ...] = (), host: str = HOST) -> Facts:
    scope = {
        "type": "websocket",
        "headers": [(b"host", host.encode())] + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "subprotocols": list(subprotocols),
    }
    return Facts.of(scope)


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_subprotocol_carries_the_token_as_base64url_without_padding() -> None:
    p = bearer_subprotocol(TOKEN)
    encoded = p.removeprefix(BEARER_SUBPROTOCOL)
    assert p.startswith("loom.bearer.") and "=" not in p and "+" not in p and "/" not in p
    assert base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode() == TOKEN
    assert subprotocol_token([p]) == TOKEN
    assert subprotocol_token(["chat", p, bearer_subprotocol("second")]) == TOKEN  # the first one
    for malformed in ("loom.bearer.!!", "loom.bearer.a", "loom.bearer.__8", p + "=", p.replace("-", "+")):
        assert subprotocol_token([malformed]) is None, malformed
    assert subprotocol_token(["loom.bearer."]) == ""
    assert subprotocol_token(["chat"]) is None
    assert subprotocol_token([bearer_subprotocol("tökén ✓")]) == "tökén ✓"


@pytest.mark.parametrize(
    ("headers", "subprotocols"),
    [
        ({}, ()),  # unauthenticated
        (bearer("wrong"), ()),
        ({}, (bearer_subprotocol("wrong"),)),
        ({}, ("loom.bearer.!!",)),
        ({"Authorization": "Basic " + base64.b64encode(f"u:{TOKEN}".encode()).decode()}, ()),  # Basic: ports only
    ],
)
def test_a_handshake_without_the_token_is_refused(headers: dict[str, str], subprotocols: tuple[str, ...]) -> None:
    refusal = ACCESS.check(ws_facts(headers, subprotocols), Kind.API)
    assert refusal is not None and (refusal.status, refusal.reason) == (401, "auth")
    assert refusal.headers == {"WWW-Authenticate": "Bearer"} and "loom.bearer." in refusal.detail


@pytest.mark.parametrize(
    ("headers", "subprotocols"),
    [
        (bearer(), ()),
        ({}, (bearer_subprotocol(TOKEN), "loom.terminal.v1")),
        ({}, ("loom.terminal.v1", bearer_subprotocol(TOKEN))),
        (bearer("wrong"), (bearer_subprotocol(TOKEN),)),  # either way is enough
    ],
)
def test_a_handshake_with_the_token_passes(headers: dict[str, str], subprotocols: tuple[str, ...]) -> None:
    assert ACCESS.check(ws_facts(headers, subprotocols), Kind.API) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:9999"},
        {"Origin": "not a url"},
        {"Sec-Fetch-Site": "cross-site"},  # (a browser without Origin: none sends that)
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"},  # Origin decides
    ],
)
@pytest.mark.parametrize("kind", [Kind.API, Kind.PORTS, Kind.PUBLIC])
def test_a_cross_origin_handshake_is_refused_everywhere(headers: dict[str, str], kind: Kind) -> None:
    # A read from another origin reaches the port proxy (its pages are sandboxed); a
    # handshake never does: it is state-changing, on every path.
    for token in ({"headers": bearer()}, {"subprotocols": (bearer_subprotocol(TOKEN),)}):
        facts = ws_facts({**token.get("headers", {}), **headers}, token.get("subprotocols", ()))  # type: ignore[dict-item]
        refusal = ACCESS.check(facts, kind)
        assert refusal is not None and (refusal.status, refusal.reason) == (403, "origin"), (headers, kind)
        assert "WebSocket handshake" in refusal.detail


@pytest.mark.parametrize(
    "headers",
    [
        {},  # not a browser: a script, a tool
        {"Origin": "http://127.0.0.1:8080"},  # the service's own page
        {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"},
        {"Origin": "http://localhost:8080", "Sec-Fetch-Site": "same-origin", "_host": "localhost:8080"},
        {"Origin": "https://service.example", "_host": "service.example"},  # behind a TLS-terminating proxy
    ],
)
def test_a_same_origin_or_non_browser_handshake_passes(headers: dict[str, str]) -> None:
    host = headers.pop("_host", HOST)
    assert ACCESS.check(ws_facts({**bearer(), **headers}, host=host), Kind.API) is None
    assert ACCESS.check(ws_facts(headers, (bearer_subprotocol(TOKEN),), host=host), Kind.PORTS) is None


def test_the_port_proxy_takes_basic_bearer_or_the_subprotocol_and_needs_a_token() -> None:
    basic = {"Authorization": "Basic " + base64.b64encode(f"anyone:{TOKEN}".encode()).decode()}
    for headers, subprotocols in ((basic, ()), (bearer(), ()), ({}, (bearer_subprotocol(TOKEN),))):
        assert ACCESS.check(ws_facts(headers, subprotocols), Kind.PORTS) is None
    refusal = ACCESS.check(ws_facts(), Kind.PORTS)
    assert refusal is not None and refusal.status == 401 and refusal.headers["WWW-Authenticate"].startswith("Basic")
    open_mode = Access(None)
    refusal = open_mode.check(ws_facts(), Kind.PORTS)
    assert refusal is not None and refusal.status == 403 and "port-forward" in refusal.detail
    assert open_mode.check(ws_facts(), Kind.API) is None  # loopback-only mode: no token asked
    assert open_mode.check(ws_facts(host="evil.example"), Kind.API) is not None  # DNS rebinding


def test_the_subprotocol_is_no_token_outside_a_websocket() -> None:
    scope = {
        "type": "http",
        "method": "GET",
        "headers": [(b"host", HOST.encode()), (b"sec-websocket-protocol", bearer_subprotocol(TOKEN).encode())],
    }
    refusal = ACCESS.check(Facts.of(scope), Kind.API)
    assert refusal is not None and refusal.status == 401 and "loom.bearer." not in refusal.detail


def test_a_route_accepts_with_its_own_subprotocol_never_the_tokens() -> None:
    token = bearer_subprotocol(TOKEN)
    scope: dict[str, Any] = {"subprotocols": [token, "b.v1", "a.v1"]}
    assert accept_subprotocol(scope, ("a.v1", "b.v1")) == "b.v1"  # the client's order
    assert accept_subprotocol(scope, ("c.v1",)) is None
    assert accept_subprotocol(scope, (token,)) is None  # even a route that would
    assert accept_subprotocol({}, ("a.v1",)) is None
    assert offered_subprotocols(scope) == ["b.v1", "a.v1"]


# -- the guard, on handshakes -------------------------------------------------------------------


def _app(on_reject: Any = None, *, echo_token: bool = False) -> Starlette:
    async def terminal(ws: WebSocket) -> None:
        chosen = ws.scope["subprotocols"][0] if echo_token else accept_subprotocol(ws.scope, ("t.v1",))
        await ws.accept(subprotocol=chosen)
        await ws.close()

    app = Starlette(routes=[WebSocketRoute("/ws", terminal)])
    app.add_middleware(AccessGuard, access=ACCESS, paths=Paths(), on_reject=on_reject)
    return app


async def test_the_guard_answers_a_refused_handshake_with_http_or_closes_it() -> None:
    rejected: list[str] = []
    app = _app(rejected.append)
    answer = await handshake(app, "/ws")
    assert (answer.kind, answer.status) == ("http", 401) and answer.headers["www-authenticate"] == "Bearer"
    assert "Missing or wrong bearer token" in answer.detail
    answer = await handshake(app, "/ws", {**bearer(), "Origin": "http://evil.example"})
    assert (answer.kind, answer.status) == ("http", 403) and "Cross-site" in answer.detail
    # A server without the denial extension: closed before it is accepted, the reason cut
    # to what a close frame holds.
    answer = await handshake(app, "/ws", {"Origin": "http://" + "e" * 300 + ".example"}, denial=False)
    assert (answer.kind, answer.code) == ("close", 1008) and answer.reason.startswith("Cross-site")
    assert len(answer.reason.encode()) <= 123
    assert rejected == ["auth", "origin", "origin"]
    answer = await handshake(app, "/ws", {}, ["t.v1", bearer_subprotocol(TOKEN)])
    assert (answer.kind, answer.subprotocol) == ("accept", "t.v1")


async def test_the_guard_never_lets_a_route_echo_the_token() -> None:
    app = _app(echo_token=True)
    with pytest.raises(RuntimeError, match="token's subprotocol"):
        await handshake(app, "/ws", {}, [bearer_subprotocol(TOKEN), "t.v1"])
