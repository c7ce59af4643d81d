"""The warm pool sized by demand (``LOOM_WARM_POOL=auto``, :mod:`sandbox.docker.demand`):
as many as the claims that come within one refill time, plus one; a burst keeps as many as
it asked for, a steady trickle two, and the pool's own ``target`` follows the same rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.docker import demand as demand_mod
from sandbox.docker.demand import DEMAND_WINDOW, IDLE_CLASS, Demand, peak
from sandbox.docker.pool import PoolConfig, PoolHooks, WarmPool, _Class
from sandbox.spec import SandboxSpec


def test_peak_is_the_most_within_any_stretch() -> None:
    assert peak([], 1.0) == 0
    assert peak([5.0], 1.0) == 1
    assert peak([0.0, 1.5, 3.0, 4.5], 1.0) == 1  # one every 1.5 s, refill 1 s
    assert peak([0.0, 0.5, 0.9, 3.0, 3.1], 1.0) == 3
    assert peak([0.0, 1.0, 2.0], 1.0) == 2  # the stretch's both ends count
    assert peak([float(i) * 0.001 for i in range(100)], 1.0) == 100


def test_nobody_asked_means_none_warm() -> None:
    d = Demand()
    assert d.target(1000.0, 32) == 0
    assert d.idle(1000.0)


def test_a_trickle_keeps_two_and_a_burst_keeps_as_many_as_it_asked() -> None:
    d = Demand(refill_s=0.8)
    for i in range(30):  # a new workspace a second for half a minute
        d.ask(100.0 + i)
    assert d.target(130.0, 32) == 2
    for _ in range(100):  # then a hundred at once
        d.ask(131.0)
    assert d.target(131.0, 32) == 32  # (capped)
    assert d.target(131.0, 1000) == 101
    # A minute later the burst is forgotten, and with it the trickle: one stays warm for
    # the next workspace, until ten minutes pass without one.
    assert d.target(131.0 + DEMAND_WINDOW + 0.1, 1000) == 1
    assert not d.idle(131.0 + DEMAND_WINDOW + 0.1)
    assert d.target(131.0 + IDLE_CLASS - 0.1, 1000) == 1
    assert d.idle(131.0 + IDLE_CLASS + 0.1)
    assert d.target(131.0 + IDLE_CLASS + 0.1, 1000) == 0


def test_a_slower_refill_needs_more_warm() -> None:
    fast, slow = Demand(refill_s=0.5), Demand(refill_s=3.0)
    for i in range(20):
        fast.ask(i * 0.7)
        slow.ask(i * 0.7)
    assert fast.target(14.0, 32) == 2
    assert slow.target(14.0, 32) == 6  # 3 s holds five claims 0.7 s apart (3.5 s with both ends: 5)


def test_the_refill_time_is_a_running_mean_of_what_makes_took() -> None:
    d = Demand()
    assert d.refill_s == demand_mod.REFILL_GUESS
    for _ in range(40):
        d.made(0.3, pause=0.2)
    assert d.refill_s == pytest.approx(0.5, abs=0.01)
    d.made(-1.0)  # (a clock that went back: ignored)
    assert d.refill_s == pytest.approx(0.5, abs=0.01)


def _pool(mode: Any, size: int) -> WarmPool:
    hooks = PoolHooks(engine=None, prepare=None, config_for=None, create=None, start_slot=None)  # type: ignore[arg-type]
    return WarmPool(hooks, PoolConfig(mode=mode, size=size, root=Path("/nonexistent/pool")))


def test_the_pool_targets_its_size_when_fixed_and_demand_when_auto() -> None:
    cls = _Class(SandboxSpec(image="x"), 1000, 1000)
    assert _pool("fixed", 4).target(cls) == 4
    demand = _pool("demand", 8)
    assert demand.target(cls) == 0
    import time

    now = time.monotonic()
    for k in range(3):
        cls.demand.ask(now - 0.01 * k)
    assert demand.target(cls) == 4  # three at once, plus one
    for _ in range(20):
        cls.demand.ask(now)
    assert demand.target(cls) == 8  # (its size caps it)
