"""``Sandbox.warm``: a new workspace's sandbox starts while the registry opens the rest
of the workspace, and the first call takes that start's outcome (issue 44)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandbox.client import AgentSandbox
from sandbox.errors import SandboxUnavailableError


class _Conn:
    closed = False

    async def close(self) -> None:
        self.closed = True


def _box(tmp_path: Path, connect: Any) -> AgentSandbox:
    return AgentSandbox(tmp_path, connect)


async def test_the_first_call_takes_the_warm_start_and_nothing_starts_twice(tmp_path: Path) -> None:
    started: list[bool] = []
    gate = asyncio.Event()

    async def connect(lost: bool) -> Any:
        started.append(lost)
        await gate.wait()
        return _Conn()

    box = _box(tmp_path, connect)
    box.warm()
    box.warm()  # (a second warm while the first runs starts nothing)
    await asyncio.sleep(0)
    assert started == [False]  # it began before any call
    first = asyncio.create_task(box.connection())
    second = asyncio.create_task(box.connection())
    await asyncio.sleep(0.01)
    assert not first.done() and not second.done()
    gate.set()
    a, b = await asyncio.gather(first, second)
    assert a is b and started == [False]


async def test_a_failed_warm_start_is_the_first_callers_error_once(tmp_path: Path) -> None:
    calls = 0

    async def connect(lost: bool) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise SandboxUnavailableError("the engine said no")
        return _Conn()

    box = _box(tmp_path, connect)
    box.warm()
    await asyncio.sleep(0.01)
    with pytest.raises(SandboxUnavailableError, match="the engine said no"):
        await box.connection()
    assert calls == 1  # the failed start was not made again for that caller
    assert isinstance(await box.connection(), _Conn)  # the next caller tries again
    assert calls == 2


async def test_a_caller_given_up_on_does_not_cancel_the_start(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def connect(lost: bool) -> Any:
        await gate.wait()
        return _Conn()

    box = _box(tmp_path, connect)
    box.warm()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(box.connection(), 0.02)
    gate.set()
    conn = await asyncio.wait_for(box.connection(), 5)
    assert isinstance(conn, _Conn) and not conn.closed


async def test_close_stops_a_warm_start_and_a_done_one_is_not_reused_once_lost(tmp_path: Path) -> None:
    cancelled = asyncio.Event()

    async def hang(lost: bool) -> Any:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return _Conn()

    box = _box(tmp_path, hang)
    box.warm()
    await asyncio.sleep(0)
    await box.close()
    assert cancelled.is_set()

    conns: list[_Conn] = []

    async def connect(lost: bool) -> Any:
        conns.append(_Conn())
        return conns[-1]

    box = _box(tmp_path, connect)
    box.warm()
    await asyncio.sleep(0.01)
    conns[0].closed = True  # lost before anybody used it
    fresh = await box.connection()
    assert fresh is conns[1] and not fresh.closed
