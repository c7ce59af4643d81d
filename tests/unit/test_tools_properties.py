"""Property tests (hypothesis) on the real agent through LocalProcessBackend:

* write_file then read_file returns exactly the text written (any Unicode, CR, CRLF);
* an edit followed by its inverse restores the file byte for byte;
* ``truncate_output`` always fits the cap and keeps both ends.

NUL is left out of the generated text on purpose: a NUL in the first 8 KiB makes a file
binary, which read_file reports by size instead of returning its content.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sandbox.local import LocalProcessBackend
from worker import ToolRegistry
from worker.result import MAX_OUTPUT_BYTES, truncate_output

TEXT = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=300,
)
SNIPPET = st.text(
    alphabet=st.sampled_from(list("ab\r\n é☃𝄞\t{}")),
    min_size=1,
    max_size=12,
)
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

Runner = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture
def run_tools() -> Iterator[tuple[Runner, ToolRegistry]]:
    """One event loop and one agent for all examples of a property (hypothesis is sync)."""
    with asyncio.Runner() as runner:
        reg = ToolRegistry(backend=LocalProcessBackend())
        try:
            yield runner.run, reg
        finally:
            runner.run(reg.aclose())


def test_write_then_read_round_trips(run_tools: tuple[Runner, ToolRegistry], workspace: Path) -> None:
    run, reg = run_tools

    @PROPS
    @given(text=TEXT)
    def prop(text: str) -> None:
        w = run(reg.execute("write_file", {"path": "p/round.txt", "content": text}, workspace))
        assert w.success, w.error
        assert w.data is not None and w.data["bytes_written"] == len(text.encode())
        r = run(reg.execute("read_file", {"path": "p/round.txt"}, workspace))
        assert r.success, r.error
        assert r.data is not None and r.data["content"] == text
        assert (workspace / "p/round.txt").read_bytes() == text.encode()

    prop()


def test_edit_then_inverse_restores(run_tools: tuple[Runner, ToolRegistry], workspace: Path) -> None:
    run, reg = run_tools
    path = workspace / "e.txt"

    @PROPS
    @given(prefix=TEXT, old=SNIPPET, new=SNIPPET, suffix=TEXT)
    def prop(prefix: str, old: str, new: str, suffix: str) -> None:
        original = prefix + old + suffix
        edited = prefix + new + suffix
        assume(original.count(old) == 1 and edited.count(new) == 1)
        path.write_bytes(original.encode())
        r = run(reg.execute("edit_file", {"path": "e.txt", "old_str": old, "new_str": new}, workspace))
        assert r.success, r.error
        assert path.read_bytes() == edited.encode()
        r = run(reg.execute("edit_file", {"path": "e.txt", "edits": [{"old_str": new, "new_str": old}]}, workspace))
        assert r.success, r.error
        assert path.read_bytes() == original.encode()

    prop()


def test_failed_batch_leaves_file_identical(run_tools: tuple[Runner, ToolRegistry], workspace: Path) -> None:
    run, reg = run_tools
    path = workspace / "b.txt"

    @PROPS
    @given(prefix=TEXT, good=SNIPPET, raw=st.binary(max_size=20))
    def prop(prefix: str, good: str, raw: bytes) -> None:
        # Invalid UTF-8 bytes around the text must survive the failed batch too.
        original = prefix.encode() + good.encode() + raw.replace(b"\x00", b"")
        path.write_bytes(original)
        edits = [
            {"old_str": good, "new_str": "CHANGED", "replace_all": True},
            {"old_str": "\x01never present\x02", "new_str": "x"},
        ]
        r = run(reg.execute("edit_file", {"path": "b.txt", "edits": edits}, workspace))
        assert not r.success and r.error is not None and "not found" in r.error
        assert path.read_bytes() == original

    prop()


@given(text=st.text(max_size=30_000), limit=st.integers(min_value=200, max_value=12_000))
@settings(max_examples=200, deadline=None)
def test_truncate_output_fits(text: str, limit: int) -> None:
    cut, was_cut = truncate_output(text, limit)
    assert len(cut.encode("utf-8", "replace")) <= limit or not was_cut
    if not was_cut:
        assert cut == text
    else:
        raw = text.encode("utf-8", "replace")
        assert raw.startswith(cut.split("\n\n[... ")[0].encode())
        assert raw.endswith(cut.rsplit(" ...]\n\n", 1)[1].encode())


def test_max_output_is_10kb() -> None:
    assert MAX_OUTPUT_BYTES == 10 * 1024
