"""How many threads the agent gives ripgrep: every core (at most 4) for a search after a
quiet spell, since the CPU quota caps time per period and not parallelism; as many as the
quota allows when the container has been using its quota (searches back to back), since
more threads would only be throttled."""

from __future__ import annotations

import pytest

from sandbox.agent import cgroup, search


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    state = {"now": 1000.0, "used": 50.0}
    monkeypatch.setattr(search.time, "monotonic", lambda: state["now"])
    monkeypatch.setattr(cgroup, "cpu_used", lambda: state["used"])
    monkeypatch.setattr(search.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    monkeypatch.setattr(search, "_cpu_seen", [0.0, None])
    return state


def test_no_quota_uses_every_core(clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup, "cpu_quota", lambda: None)
    assert search._search_threads() == 2


def test_quiet_container_gets_every_core_busy_one_gets_its_quota(clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup, "cpu_quota", lambda: 1.0)
    assert search._search_threads() == 2  # first search: nothing known, burst
    clock["now"] += 0.05
    clock["used"] += 0.045  # the last 50 ms: 0.9 CPU in use
    assert search._search_threads() == 1
    clock["now"] += 0.15
    clock["used"] += 0.03  # 0.2 CPU: headroom again
    assert search._search_threads() == 2
    clock["now"] += 5.0
    clock["used"] += 4.0  # busy, but long ago: the window is too old to judge, burst
    assert search._search_threads() == 2


def test_quota_of_several_cpus_caps_the_busy_case(clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search.os, "sched_getaffinity", lambda _pid: set(range(8)), raising=False)
    monkeypatch.setattr(cgroup, "cpu_quota", lambda: 2.5)
    assert search._search_threads() == 4  # at most 4
    clock["now"] += 0.1
    clock["used"] += 0.2  # 2 CPUs in use
    assert search._search_threads() == 2


def test_cgroup_readers_tolerate_missing_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup, "read_first", lambda paths: None)
    assert cgroup.cpu_quota() is None and cgroup.cpu_used() is None
