"""A command's output as it happens, at the sandbox contract (``exec(on_output=...)``,
``exec_stream``), on the agent run as a host subprocess. The same agent code runs in the
containers (tests/docker/test_stream_ports.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import ExecControl, ExecRequest, ExecResult, OutputChunk


async def _collect(box: Any, command: str, **kw: Any) -> tuple[list[OutputChunk], ExecResult]:
    chunks: list[OutputChunk] = []
    result = None
    async for item in box.exec_stream(ExecRequest(command, **kw)):
        if isinstance(item, ExecResult):
            result = item
        else:
            assert result is None, "a chunk after the result"
            chunks.append(item)
    assert result is not None
    return chunks, result


async def test_a_line_arrives_while_the_command_still_runs(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    seen_before_sleep_ended = None
    async for item in box.exec_stream(ExecRequest("echo first; sleep 2; touch slept; echo second")):
        if isinstance(item, OutputChunk) and item.data == b"first\n":
            # The order of events, not a clock: the command has not got past its sleep.
            seen_before_sleep_ended = not (workspace / "slept").exists()
        if isinstance(item, ExecResult):
            assert item.exit_code == 0 and item.stdout == b"first\nsecond\n"
    assert seen_before_sleep_ended is True
    assert (workspace / "slept").exists()


async def test_streams_are_kept_apart_and_bytes_survive(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    chunks, result = await _collect(box, r"printf 'a\377b\n'; printf 'e\200rr' >&2; printf 'ü'")
    out = b"".join(c.data for c in chunks if c.stream == "stdout")
    err = b"".join(c.data for c in chunks if c.stream == "stderr")
    assert out == b"a\xffb\n\xc3\xbc" == result.stdout
    assert err == b"e\x80rr" == result.stderr


async def test_everything_is_streamed_while_the_result_keeps_its_cap(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    chunks, result = await _collect(box, "head -c 3000000 /dev/zero | tr '\\0' x", max_output=1000)
    assert sum(len(c.data) for c in chunks) == 3_000_000
    assert result.truncated and result.stdout_bytes == 3_000_000 and len(result.stdout) < 1200


async def test_timeout_and_exit_codes_come_after_the_output(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    chunks, result = await _collect(box, "echo before; sleep 30", timeout=1)
    assert b"".join(c.data for c in chunks) == b"before\n"
    assert result.outcome == "timeout" and result.exit_code is None
    chunks, result = await _collect(box, "echo x; exit 3")
    assert result.exit_code == 3 and [c.data for c in chunks] == [b"x\n"]


async def test_on_output_callback_and_argv(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    got: list[tuple[str, bytes]] = []
    r = await box.exec(
        ExecRequest("", argv=["sh", "-c", 'echo "$0 $1"', "one", "two words"]),
        on_output=lambda s, d: got.append((s, d)),
    )
    assert r.exit_code == 0 and got == [("stdout", b"one two words\n")]


async def test_ctrl_c_reaches_the_command(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    control = ExecControl()
    result = None
    script = "trap 'echo got INT; exit 130' INT; echo ready; sleep 20 & wait"
    seen, sent = b"", False
    async for item in box.exec_stream(ExecRequest(script, timeout=30), control=control):
        if isinstance(item, OutputChunk):
            seen += item.data  # (one echo may come in more than one chunk on a loaded machine)
            if b"ready\n" in seen and not sent:
                sent = True
                await control.signal(2)
        elif isinstance(item, ExecResult):
            result = item
    assert result is not None and result.exit_code == 130 and result.stdout == b"ready\ngot INT\n"
    with pytest.raises(ValueError):
        await control.signal(11)


async def test_a_signal_before_the_command_starts_reaches_it(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    control = ExecControl()
    await control.signal(15)  # e.g. a Ctrl-C while the command waited for the workspace
    r = await box.exec(ExecRequest("sleep 20; echo never", timeout=30), control=control)
    assert r.outcome == "signal" and r.signal == 15 and r.stdout == b""


async def test_leaving_the_iterator_early_lets_the_command_finish(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    stream = box.exec_stream(ExecRequest("echo go; sleep 0.3; echo done > finished"))
    async for item in stream:
        assert item == OutputChunk("stdout", b"go\n")
        break
    await stream.aclose()
    r = await box.exec(ExecRequest("cat finished"))  # waits for the exec lock: the first command ends first
    assert r.stdout == b"done\n"


async def test_a_sandbox_lost_mid_stream_ends_it_with_the_result(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    items = []
    async for item in box.exec_stream(ExecRequest("echo hi; kill -9 $PPID; sleep 5")):
        items.append(item)
    assert isinstance(items[-1], ExecResult) and items[-1].outcome == "sandbox_lost"
    r = await box.exec(ExecRequest("echo back"))  # the next call gets a fresh agent
    assert r.stdout == b"back\n"


async def test_other_requests_run_beside_a_streamed_command(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    (workspace / "f").write_text("x")
    streamed = asyncio.ensure_future(_collect(box, "for i in 1 2 3; do echo $i; sleep 0.05; done"))
    reads = await asyncio.gather(*(box.read("f") for _ in range(20)))
    chunks, result = await streamed
    assert all(r.data == b"x" for r in reads)
    assert b"".join(c.data for c in chunks) == b"1\n2\n3\n" == result.stdout
