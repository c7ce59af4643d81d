"""``ToolRegistry.execute_stream``: output chunks as a command prints, then the ToolResult,
with the real tools and changelog on the local backend."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from worker import ToolOutput, ToolRegistry, ToolResult
from worker.changelog import Changelog


async def _all(stream: Any) -> tuple[list[ToolOutput], ToolResult]:
    chunks: list[ToolOutput] = []
    async for item in stream:
        if isinstance(item, ToolResult):
            return chunks, item
        chunks.append(item)
    raise AssertionError("no result")


async def test_output_before_the_result_and_the_result_as_execute_gives(local_backend: Any, workspace: Path) -> None:
    registry = ToolRegistry(backend=local_backend)
    first_seen_before_sleep_ended = None
    chunks: list[ToolOutput] = []
    result = None
    async for item in registry.execute_stream(
        "shell_execute", {"command": "echo first; sleep 2; touch slept; echo second >&2"}, workspace
    ):
        if isinstance(item, ToolOutput):
            if not chunks:
                first_seen_before_sleep_ended = not (workspace / "slept").exists()
            chunks.append(item)
        else:
            result = item
    assert first_seen_before_sleep_ended is True
    assert [(c.stream, c.text) for c in chunks] == [("stdout", "first\n"), ("stderr", "second\n")]
    assert result is not None and result.success
    plain = await registry.execute("shell_execute", {"command": "echo first; echo second >&2"}, workspace)
    assert result.output == plain.output and result.data is not None and plain.data is not None
    assert {k: v for k, v in result.data.items() if k != "duration_ms"} == {
        k: v for k, v in plain.data.items() if k != "duration_ms"
    }


async def test_other_tools_and_failures_yield_just_the_result(local_backend: Any, workspace: Path) -> None:
    registry = ToolRegistry(backend=local_backend)
    (workspace / "a.txt").write_text("hello\n")
    chunks, result = await _all(registry.execute_stream("read_file", {"path": "a.txt"}, workspace))
    assert chunks == [] and result.success and "hello" in result.output
    chunks, result = await _all(registry.execute_stream("shell_execute", {"comand": "x"}, workspace))
    assert chunks == [] and not result.success and "'comand'" in result.output
    chunks, result = await _all(registry.execute_stream("no_such_tool", {}, workspace))
    assert chunks == [] and "Unknown tool" in result.output
    chunks, result = await _all(registry.execute_stream("shell_execute", {"command": "echo x; exit 3"}, workspace))
    assert [c.text for c in chunks] == ["x\n"] and not result.success and result.data["exit_code"] == 3  # type: ignore[index]


async def test_bytes_are_kept_and_text_is_whole_characters(local_backend: Any, workspace: Path) -> None:
    registry = ToolRegistry(backend=local_backend)
    # "ü" is \303\274: its two bytes come in two chunks; then a byte that is not UTF-8.
    cmd = r"printf '\303'; sleep 0.3; printf '\274 \377\n'"
    chunks, result = await _all(registry.execute_stream("shell_execute", {"command": cmd}, workspace))
    assert b"".join(c.data for c in chunks) == b"\xc3\xbc \xff\n"
    assert "".join(c.text for c in chunks) == "ü \ufffd\n"
    assert chunks[0].data == b"\xc3" and chunks[0].text == ""  # held back until it is whole
    assert result.success


async def test_a_slow_reader_gets_counts_of_what_was_dropped(local_backend: Any, workspace: Path) -> None:
    registry = ToolRegistry(backend=local_backend)
    cmd = "for i in $(seq 1 200); do printf '%0999d\\n' $i; done; printf '%0999d\\n' 0 >&2; touch done"
    stream = registry.execute_stream("shell_execute", {"command": cmd}, workspace, max_buffered=10_000)
    for _ in range(1000):  # nobody reads while the command prints
        if (workspace / "done").exists():
            break
        await asyncio.sleep(0.02)
    chunks, result = await _all(stream)
    out = [c for c in chunks if c.stream == "stdout"]
    assert sum(len(c.data) for c in out) <= 10_000
    assert sum(len(c.data) + c.dropped for c in out) == 200_000
    assert any(c.dropped for c in out)
    assert result.success and result.data is not None and result.data["stdout"].endswith("0200\n")


async def test_a_reader_that_leaves_does_not_stop_the_call(local_backend: Any, workspace: Path, tmp_path: Path) -> None:
    changelog = Changelog.open(tmp_path / "data", workspace)
    registry = ToolRegistry(backend=local_backend, recorder_factory=lambda _root: changelog)
    try:
        stream = registry.execute_stream(
            "shell_execute", {"command": "echo go; sleep 0.5; echo made > new.txt"}, workspace
        )
        async for item in stream:
            assert isinstance(item, ToolOutput) and item.text == "go\n"
            break
        await stream.aclose()  # type: ignore[attr-defined]
        # The command goes on, and what it changed is recorded.
        r = await registry.execute("shell_execute", {"command": "cat new.txt"}, workspace)
        assert r.output == "made\n"
        entries = await changelog.log()
        assert any(e.path == "new.txt" and e.tool == "shell_execute" for e in entries)
    finally:
        await changelog.aclose()
