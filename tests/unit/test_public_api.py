"""The public names of ``worker`` and ``sandbox`` (their ``__all__``): each importable,
documented in its code (a docstring; a ``#:`` comment for a constant) and listed, one line
each, in the API reference ``docs/api.md``, whose list is generated from them
(:mod:`worker.docs_api`; ``python -m worker.docs_gen`` writes it)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from worker.docs_api import BEGIN, END, PACKAGES, docstring, generated, package, summary

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api.md"


def _doc_block() -> str:
    text = DOC.read_text()
    start, end = text.find(BEGIN), text.find(END)
    assert start >= 0 and end > start, f"{DOC} has lost its markers {BEGIN!r} / {END!r}"
    return text[start : end + len(END)]


# -- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("pkg_name", PACKAGES)
def test_every_public_name_is_importable(pkg_name: str) -> None:
    pkg = package(pkg_name)
    assert len(set(pkg.__all__)) == len(pkg.__all__), "a name is listed twice"
    for name in pkg.__all__:
        namespace: dict[str, object] = {}
        exec(f"from {pkg_name} import {name}", namespace)
        assert namespace[name] is getattr(pkg, name)


@pytest.mark.parametrize("pkg_name", PACKAGES)
def test_every_public_name_is_documented(pkg_name: str) -> None:
    pkg = package(pkg_name)
    missing = [name for name in pkg.__all__ if not docstring(pkg, name)]
    assert not missing, f"{pkg_name}: no docstring (a `#:` comment for a constant): {missing}"


def test_the_lazy_exports_of_worker_are_its_public_names() -> None:
    worker = package("worker")
    assert set(worker._EXPORTS) == set(worker.__all__)


def test_every_sandbox_error_is_exported() -> None:
    import sandbox
    import sandbox.errors

    errors = {n for n, o in vars(sandbox.errors).items() if inspect.isclass(o) and issubclass(o, Exception)}
    assert errors <= set(sandbox.__all__), sorted(errors - set(sandbox.__all__))
    assert "ImageUnusableError" in sandbox.__all__


def test_the_api_reference_lists_every_public_name() -> None:
    assert _doc_block() == generated(), (
        "docs/api.md is out of date: run `python -m worker.docs_gen` and review the diff"
    )


def test_summary_is_the_first_sentence() -> None:
    assert summary("Run one call. Never raises.\n\nMore.") == "Run one call."
    assert summary("A :class:`~worker.tool.Tool` and its\n``name``: the rest") == "A `Tool` and its `name`: the rest"
    assert summary(":meth:`execute <worker.registry.ToolRegistry.execute>` runs it.") == "`execute` runs it."
    assert summary("See :meth:`Sandbox.read`. Then") == "See `Sandbox.read`."
