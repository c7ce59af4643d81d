"""The node's side of the front door's relay (:class:`worker.integrations.ray.nodeapp._Answer`),
over small ASGI apps: a whole answer comes back in one ask; a streamed one's beginning
first, then the rest in order, each ask taking what is queued; an app's failure reaches the
asker; a cancelled answer cancels its request. (Through a real front door: tests/ray/.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from worker.integrations.ray.nodeapp import _Answer, _scope
from worker.integrations.ray.nodews import QUEUED, NodeSocket, ws_scope


def _request() -> dict[str, Any]:
    return _scope("POST", "/v1/workspaces/w/x", b"/v1/workspaces/w/x", b"", [(b"authorization", b"Bearer a")], "node")


async def test_a_whole_answer_comes_back_at_once() -> None:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((await receive())["body"])
        headers = dict(scope["headers"])
        assert headers[b"host"] == b"127.0.0.1" and headers[b"authorization"] == b"Bearer node"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    answer = _Answer(app, _request(), b"the body")
    messages = await answer.first()
    assert answer.whole and [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert seen == [b"the body"] and messages[-1]["body"] == b"done"


async def test_a_streamed_answer_comes_back_in_order() -> None:
    go = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await go.wait()  # the head goes alone: its client sees it before the first event
        for i in range(40):  # more than the queue holds: the app waits for the asks
            await send({"type": "http.response.body", "body": b"%d," % i, "more_body": True})
        await send({"type": "http.response.body", "body": b"end"})

    answer = _Answer(app, _request(), b"")
    first = await answer.first()
    assert not answer.whole and [m["type"] for m in first] == ["http.response.start"]
    go.set()
    body = b""
    while not answer.whole:
        batch = await answer.next()
        assert batch
        body += b"".join(m["body"] for m in batch)
    assert body == b"".join(b"%d," % i for i in range(40)) + b"end"


async def test_a_failing_app_fails_the_ask_and_a_cancelled_answer_cancels_the_request() -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        raise RuntimeError("the app broke")

    with pytest.raises(RuntimeError, match="the app broke"):
        await _Answer(broken, _request(), b"").first()

    cancelled = asyncio.Event()

    async def endless(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        try:
            await receive()  # (a forwarded request's client stays until its answer is cancelled)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    answer = _Answer(endless, _request(), b"")
    assert [m["type"] for m in await answer.first()] == ["http.response.start", "http.response.body"]
    answer.cancel()
    await asyncio.wait_for(cancelled.wait(), 30)


# -- a relayed WebSocket (worker.integrations.ray.wsrelay.NodeSocket) ------------------------------


def _socket_scope() -> dict[str, Any]:
    headers = [(b"authorization", b"Bearer front"), (b"origin", b"http://x"), (b"sec-websocket-protocol", b"p")]
    path = "/v1/workspaces/w/t/ws"
    return ws_scope(path, path.encode(), b"since=3", headers, ["p", "loom.bearer.dA"], "node")


async def test_a_websocket_runs_in_the_node_app_both_ways() -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope["headers"])
        assert scope["type"] == "websocket" and scope["subprotocols"] == ["p"]  # never the token's
        assert headers[b"authorization"] == b"Bearer node" and b"origin" not in headers
        assert b"sec-websocket-protocol" not in headers and scope["query_string"] == b"since=3"
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept", "subprotocol": "p", "headers": []})
        await send({"type": "websocket.send", "text": "hello"})
        while (m := await receive())["type"] == "websocket.receive":
            seen.append(m.get("bytes"))
            await send({"type": "websocket.send", "bytes": m["bytes"].upper()})
        seen.append(m["type"])

    sock = NodeSocket(app, _socket_scope())
    first = await sock.next(first=True)
    assert first[0]["type"] == "websocket.accept" and not sock.done
    rest = first[1:] or await sock.next()
    assert rest[0] == {"type": "websocket.send", "text": "hello"}
    await sock.push([{"type": "websocket.receive", "bytes": b"abc"}])
    assert await sock.next() == [{"type": "websocket.send", "bytes": b"ABC"}]
    sock.left(1001)  # the client went away: the app hears it and ends; its end closes the relay
    closing = await asyncio.wait_for(sock.next(), 10)
    assert closing[-1]["type"] == "websocket.close" and sock.done
    assert seen == [b"abc", "websocket.disconnect"]


async def test_a_refusal_before_acceptance_and_a_slow_client() -> None:
    async def refuses(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept", "subprotocol": None, "headers": []})
        await send({"type": "websocket.close", "code": 4404, "reason": "No terminal t"})

    sock = NodeSocket(refuses, _socket_scope())
    out = await sock.next(first=True)
    assert [m["type"] for m in out] == ["websocket.accept"] or out[-1]["code"] == 4404
    while not sock.done:
        out = await sock.next()
    assert out[-1] == {"type": "websocket.close", "code": 4404, "reason": "No terminal t"}

    sent = 0

    async def floods(scope: Any, receive: Any, send: Any) -> None:
        nonlocal sent
        await receive()
        await send({"type": "websocket.accept", "subprotocol": None, "headers": []})
        for i in range(100):
            await send({"type": "websocket.send", "bytes": b"%d" % i})
            sent += 1

    sock = NodeSocket(floods, _socket_scope())
    first = await sock.next(first=True)
    got = [m["bytes"] for m in first if m["type"] == "websocket.send"]
    await asyncio.sleep(0.2)
    assert sent <= len(got) + QUEUED  # the app waits for the front door's asks: nothing piles up
    while not sock.done:
        batch = await sock.next()
        assert len(batch) <= QUEUED + 1
        got += [m["bytes"] for m in batch if m["type"] == "websocket.send"]
    assert got == [b"%d" % i for i in range(100)]
    # (an app that ends without closing is closed 1011 for it: the front door's side ends too)
    assert batch[-1] == {"type": "websocket.close", "code": 1011, "reason": ""}
