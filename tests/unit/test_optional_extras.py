"""An optional integration whose extra is not installed: the core goes on without it and
says what to install (here E2B's API under ``loom-worker serve``, found once by a new user
who ran ``pip install .`` without the ``e2b`` extra: ``serve`` died on an ImportError)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from worker.cli.service import e2b_routes
from worker.plugins import IntegrationUnavailable, integration
from worker.settings import Settings


@pytest.fixture
def without_e2b(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if the ``e2b`` package were not installed (the integration's modules unloaded)."""
    for name in [m for m in sys.modules if m == "worker.integrations.e2b" or m.startswith("worker.integrations.e2b.")]:
        monkeypatch.delitem(sys.modules, name)
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "e2b" or name.startswith("e2b.") else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_serve_goes_on_without_e2bs_api_when_its_extra_is_missing(
    without_e2b: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(IntegrationUnavailable, match=r"needs 'e2b': pip install 'loom-worker\[e2b\]'"):
        integration("e2b")
    assert e2b_routes(Settings(data_dir=tmp_path, e2b_api=None)) == []  # (served when installed)
    assert capsys.readouterr().err == ""
    # Asked for explicitly: serve stops, saying what to install.
    assert e2b_routes(Settings(data_dir=tmp_path, e2b_api=True)) is None
    assert "pip install 'loom-worker[e2b]'" in capsys.readouterr().err


def test_with_its_extra_the_routes_are_served(tmp_path: Path) -> None:
    routes = e2b_routes(Settings(data_dir=tmp_path))
    assert routes, "the e2b extra is installed in the test environment: its routes are served"
