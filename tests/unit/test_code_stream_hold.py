"""A streamed code execution keeps what its caller handed it to hold (the service's slot)
until the execution ends, not until its consumer leaves; its ``on_end`` (the call
journal's line) runs then too (``worker.kernels.stream``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from worker.kernels import execute
from worker.kernels.model import Execution, OutputMessage


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """``run`` replaced: it prints one line, then waits for the gate before it ends."""
    opened = asyncio.Event()

    async def run(_ws: Any, code: str, *, emit: Any, call_id: str, **_kw: Any) -> Execution:
        await emit(OutputMessage("stdout", "started\n"))
        await opened.wait()
        ex = Execution(call_id=call_id, context_id="ctx")
        await emit(ex)  # (as the real one: the Execution is its last event)
        return ex

    monkeypatch.setattr(execute, "run", run)
    return opened


def _stream(hold: contextlib.AsyncExitStack | None, ended: list[Execution]) -> Any:
    return execute.stream(
        object(),  # type: ignore[arg-type]
        "x",
        context=None,
        language=None,
        timeout=5.0,
        call_id="call_1",
        tool="t",
        on_end=ended.append,
        hold=hold,
    )


async def test_a_consumer_that_leaves_keeps_the_slot_held_until_the_execution_ends(gate: asyncio.Event) -> None:
    released: list[str] = []
    stack = contextlib.AsyncExitStack()
    stack.callback(released.append, "slot")
    ended: list[Execution] = []
    events = _stream(stack, ended)
    first = await anext(events)
    assert isinstance(first, OutputMessage)
    await events.aclose()  # the client went away
    await stack.aclose()  # what the route's cleanup does: the slot is the execution's now
    await asyncio.sleep(0.05)
    assert released == [] and ended == []  # still running: still counted
    gate.set()
    for _ in range(100):
        if released:
            break
        await asyncio.sleep(0.01)
    assert released == ["slot"]
    assert [e.call_id for e in ended] == ["call_1"]  # journaled with nobody reading


async def test_a_consumer_that_stays_sees_the_execution_and_the_slot_released_once(gate: asyncio.Event) -> None:
    released: list[str] = []
    stack = contextlib.AsyncExitStack()
    stack.callback(released.append, "slot")
    ended: list[Execution] = []
    gate.set()
    seen = [ev async for ev in _stream(stack, ended)]
    assert isinstance(seen[-1], Execution) and len(ended) == 1
    await stack.aclose()
    await asyncio.sleep(0)
    assert released == ["slot"]


async def test_a_stream_never_started_leaves_the_hold_to_its_owner(gate: asyncio.Event) -> None:
    released: list[str] = []
    stack = contextlib.AsyncExitStack()
    stack.callback(released.append, "slot")
    events = _stream(stack, [])
    await events.aclose()  # closed before its first step: no execution ran
    assert released == []
    await stack.aclose()
    assert released == ["slot"]


async def test_a_response_that_ends_before_its_stream_starts_releases_the_slot() -> None:
    """The client gone before the first line: Starlette cancels the stream before its first
    step and never closes the iterator; the route's response releases the slot itself."""
    import anyio

    from worker.http import code

    released: list[str] = []
    stack = contextlib.AsyncExitStack()
    stack.callback(released.append, "slot")
    started: list[int] = []

    async def events() -> Any:
        started.append(1)
        yield OutputMessage("stdout", "x")

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(_msg: Any) -> None:
        await anyio.sleep(5)  # (the first send never completes: the client went)

    response = code._Stream(events(), stack)
    await response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
    assert started == [] and released == ["slot"]
