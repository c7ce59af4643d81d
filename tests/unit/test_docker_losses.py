"""How the backend tells a sandbox killed for memory from one lost otherwise
(``sandbox.docker.losses.reset_after_lost_exec``), against a scripted engine: the engine
hears of an exit and of an OOM kill as two events, in either order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.docker import losses


class FakeContainer:
    """A container whose ``reload`` steps through ``states`` (State dicts), staying on the last."""

    def __init__(self, states: list[dict[str, Any]]) -> None:
        self.name = "loom-sbx-test"
        self._states = states
        self.attrs: dict[str, Any] = {"State": states[0]}
        self.reloads = 0

    @property
    def status(self) -> str:
        return str(self.attrs["State"]["Status"])

    def reload(self) -> None:
        self.reloads += 1
        self.attrs = {"State": self._states[min(self.reloads, len(self._states) - 1)]}


class FakeEngine:
    def __init__(self, container: FakeContainer | None) -> None:
        self.container = container

    async def find(self, name: str) -> Any:
        return self.container

    async def call(self, what: str, fn: Any, *args: Any) -> Any:
        return fn(*args)


def state(status: str, oom: bool = False, code: int = 0) -> dict[str, Any]:
    return {"Status": status, "OOMKilled": oom, "ExitCode": code}


async def verdict(states: list[dict[str, Any]] | None, monkeypatch: pytest.MonkeyPatch) -> tuple[str | None, list[Any]]:
    async def no_sleep(_s: float) -> None:
        return None

    monkeypatch.setattr(losses.asyncio, "sleep", no_sleep)
    removed: list[Any] = []

    async def remove(c: Any) -> None:
        removed.append(c)

    container = FakeContainer(states) if states is not None else None
    got = await losses.reset_after_lost_exec(FakeEngine(container), remove, "loom-sbx-test", Path("/ws"))  # type: ignore[arg-type]
    return got, removed


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        pytest.param([state("exited", True, 137)], "oom", id="oom-at-once"),
        pytest.param([state("running"), state("running"), state("exited", True, 137)], "oom", id="oom-after-running"),
        pytest.param(
            [state("exited", False, 137), state("exited", False, 137), state("exited", True, 137)],
            "oom",
            id="oom-flag-after-exit",
        ),
        pytest.param([state("exited", False, 137)], "reset", id="killed-not-for-memory"),
        pytest.param([state("exited", False, 255), state("exited", True, 255)], "oom", id="oom-flag-after-exit-255"),
        pytest.param([state("exited", False, 1)], "reset", id="exited"),
        pytest.param([state("exited", False, 0), state("exited", True, 0)], "reset", id="exited-0-not-waited-for"),
        pytest.param([state("running")], "reset", id="agent-died-container-lives"),
    ],
)
async def test_oom_or_reset(states: list[dict[str, Any]], expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    got, removed = await verdict(states, monkeypatch)
    assert got == expected
    assert len(removed) == 1  # whatever it was, the container is removed


async def test_a_container_already_gone_is_a_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    assert await verdict(None, monkeypatch) == ("reset", [])
