"""Fixtures shared by the changelog's unit tests (local backend). A module that needs
other ones (limits, a spy sandbox) defines its own, which take precedence."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

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
