"""The node's side of the front door's relay (:class:`worker.integrations.ray.nodeapp._Answer`),
over small ASGI apps: a whole answer comes back in one ask; a streamed one's beginning
first, then the rest in order, each ask taking what is queued; an app's failure reaches the
asker; a cancelled answer cancels its request. (Through a real front door: tests/ray/.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from worker.integrations.ray.nodeapp import _Answer, _scope


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
