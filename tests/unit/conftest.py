"""Fixtures shared by the changelog's unit tests (local backend), and the in-process agent's
(``agent_root``). A module that needs other ones (limits, a spy sandbox) defines its own,
which take precedence."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.agent import scan as agent_scan
from sandbox.agent import state
from sandbox.base import Sandbox
from worker.changelog import Changelog


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def box(local_backend: Any, workspace: Path) -> Sandbox:
    return await local_backend.get(workspace)


@pytest.fixture
async def cl(data_dir: Path, workspace: Path) -> AsyncIterator[Changelog]:
    c = Changelog.open(data_dir, workspace)
    yield c
    await c.aclose()


@pytest.fixture
def agent_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The agent's modules in this process, rooted at ``tmp_path``, watching with inotify as
    on runc (the subreaper bit); the scan snapshots it made are closed after."""
    monkeypatch.setattr(state, "ROOT", str(tmp_path))
    monkeypatch.setattr(state, "ROOT_FD", os.open(tmp_path, os.O_PATH | os.O_DIRECTORY))
    monkeypatch.setattr(state, "subreaper", True)  # a real Linux kernel: watching allowed
    try:
        yield tmp_path
    finally:
        for snap in agent_scan._snapshots.values():
            snap.close()
        agent_scan._snapshots.clear()
        os.close(state.ROOT_FD)
