"""Every module of ``worker`` and ``sandbox`` imports (mypy, with ``ignore_missing_imports``,
passes a relative import that names a module moved away: this does not). The agent's
modules are left out: they run in the sandbox, as one bundle."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import sandbox
import worker


def _modules() -> list[str]:
    out = []
    for pkg in (worker, sandbox):
        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if m.name.startswith("sandbox.agent") or m.name.endswith("__main__"):
                continue
            out.append(m.name)
    return out


@pytest.mark.parametrize("name", _modules())
def test_the_module_imports(name: str) -> None:
    importlib.import_module(name)
