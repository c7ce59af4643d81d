"""A warm sandbox that fails before its container exists leaves nothing: its slot (the
directory, the pool's mark, the lock this process holds on it) goes with the failure,
also when the pool closes while the engine is still making it and the make then fails;
and the refill backs off by the fills that failed in a row, not by every failure the
pool ever counted."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.docker.pool import PoolConfig, PoolHooks, WarmPool, _Class
from sandbox.errors import SandboxError
from sandbox.spec import SandboxSpec


async def _prepared(_spec: SandboxSpec) -> None:
    return None


@contextlib.asynccontextmanager
async def _slot() -> AsyncIterator[None]:
    yield


def _pool(tmp_path: Path, config_for: Any, create: Any = None) -> WarmPool:
    (tmp_path / "pool").mkdir()
    hooks = PoolHooks(
        engine=None,  # type: ignore[arg-type]
        prepare=_prepared,
        config_for=config_for,
        create=create,
        start_slot=_slot,
    )
    return WarmPool(hooks, PoolConfig(mode="fixed", size=1, root=tmp_path / "pool"))


def _class() -> _Class:
    return _Class(SandboxSpec(image="x"), os.getuid(), os.getgid())


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _config(_ws: Path, _spec: SandboxSpec) -> dict[str, Any]:
    return {"labels": {}, "mounts": []}


async def test_a_config_that_fails_leaves_no_slot(tmp_path: Path) -> None:
    def broken(_ws: Path, _spec: SandboxSpec) -> dict[str, Any]:
        raise RuntimeError("no config")

    pool = _pool(tmp_path, broken)
    before = _fds()
    with pytest.raises(RuntimeError, match="no config"):
        await pool._make("k", _class())
    assert list((tmp_path / "pool").iterdir()) == []
    assert _fds() == before  # the slot's lock closed


async def test_a_create_refused_leaves_no_slot(tmp_path: Path) -> None:
    async def refused(_cfg: dict[str, Any]) -> Any:
        raise SandboxError("the engine refused")

    pool = _pool(tmp_path, _config, refused)
    before = _fds()
    with pytest.raises(SandboxError):
        await pool._make("k", _class())
    assert list((tmp_path / "pool").iterdir()) == [] and _fds() == before


async def test_a_create_that_fails_after_the_pool_closed_leaves_no_slot(tmp_path: Path) -> None:
    made = asyncio.Event()

    async def slow_then_refused(_cfg: dict[str, Any]) -> Any:
        made.set()
        await asyncio.sleep(0.2)
        raise SandboxError("the engine refused")

    pool = _pool(tmp_path, _config, slow_then_refused)
    before = _fds()
    task = asyncio.create_task(pool._make("k", _class()))
    await made.wait()
    task.cancel()  # the pool closing while the engine makes it
    with pytest.raises(asyncio.CancelledError):
        await task
    assert list((tmp_path / "pool").iterdir()) == [] and _fds() == before


async def test_the_refill_backs_off_by_the_failures_in_a_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _pool(tmp_path, _config)
    outcomes: list[BaseException | None] = [SandboxError("down"), None]

    async def make(_key: str, _cls: _Class) -> Any:
        failure = outcomes.pop(0)
        if failure is not None:
            raise failure
        return object()

    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(pool, "_make", make)
    monkeypatch.setattr("sandbox.docker.pool.asyncio.sleep", sleep)
    pool.failures = 60  # a long life's failures elsewhere (lost renames, claims refused)
    cls = _class()
    for _ in range(2):
        cls.filling += 1
        await pool._fill("k", cls)
    assert waits == [0.5]  # one failed in a row, not 61 (30 s)
    assert pool.failures == 61 and pool._failing == 0 and len(cls.ready) == 1
