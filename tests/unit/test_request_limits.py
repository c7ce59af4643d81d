"""The request limit's readers on their own (no server, no Docker): the local worker's
frames, MCP's stdio lines, the CLI's ``--args``. The real servers' tests, with requests
of 100 MiB and 1 GiB and their memory measured, are in tests/docker/test_request_limits.py."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from worker.cli.tools import _bounded_lines, read_arguments
from worker.limits import MAX_REQUEST_BYTES, max_request_bytes
from worker.localworker import wire
from worker.localworker.server import FrameTooLarge, read_frame
from worker.mcp_stdio import BoundedLines


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=4096)  # pieces smaller than the frames, as in the worker
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_frames_within_their_ops_limit_pass_and_a_larger_call_is_refused_by_its_id() -> None:
    ok = wire.encode({"id": 1, "op": "call", "arguments": {"content": "x" * 5000}})
    big = wire.encode({"id": 2, "op": "call", "arguments": {"content": "x" * 100_000}})
    reader = _reader(ok + big + wire.encode({"id": 3, "op": "status"}))
    assert await read_frame(reader, max_request=20_000, piece=4096) == ok
    with pytest.raises(FrameTooLarge) as e:
        await read_frame(reader, max_request=20_000, piece=4096)
    assert (e.value.op, e.value.rid) == ("call", 2)
    assert e.value.read <= 20_000 + wire.ENVELOPE + 4096  # dropped at the limit, a piece at most past it
    assert "over the limit of 20000 bytes (LOOM_MAX_BODY_BYTES)" in e.value.message


async def test_an_exec_frame_has_its_own_limit_and_other_ops_the_envelope() -> None:
    stdin = wire.encode({"id": 1, "op": "exec", "harness": {"stdin": "A" * 300_000}})
    assert await read_frame(_reader(stdin), max_request=20_000) == stdin
    with pytest.raises(FrameTooLarge) as e:
        await read_frame(_reader(wire.encode({"id": 4, "op": "status", "pad": "x" * wire.ENVELOPE})), 20_000)
    assert (e.value.op, e.value.rid) == ("status", 4)


async def test_the_end_of_the_stream_is_an_empty_frame() -> None:
    assert await read_frame(_reader(b""), max_request=20_000) == b""


async def test_mcp_lines_over_the_limit_are_answered_by_id_and_skipped() -> None:
    from mcp.shared.message import SessionMessage

    big = b'{"jsonrpc": "2.0", "id": "req-7", "method": "tools/call", "params": {"x": "' + b"y" * 5000 + b'"}}\n'
    small = b'{"jsonrpc": "2.0", "id": 8, "method": "ping"}\n'
    lines = BoundedLines(io.BytesIO(big + small + b"x" * 3000), limit=1000)
    send, receive = anyio.create_memory_object_stream[SessionMessage](10)
    lines.reply_to = send
    got = [line async for line in lines]
    assert got == [small.decode()] and lines.refused == 2  # the last one, unterminated, too
    answer = json.loads(receive.receive_nowait().message.model_dump_json(by_alias=True, exclude_unset=True))
    assert answer["id"] == "req-7" and "over the limit of 1000 bytes" in answer["error"]["message"]
    with pytest.raises(anyio.WouldBlock):  # the line without an id gets no answer
        receive.receive_nowait()


def test_the_limit_comes_from_the_environment_or_the_default() -> None:
    assert max_request_bytes({}) == MAX_REQUEST_BYTES == 24 << 20
    assert max_request_bytes({"LOOM_MAX_BODY_BYTES": "2048"}) == 2048
    assert max_request_bytes({"LOOM_MAX_BODY_BYTES": "12"}) == MAX_REQUEST_BYTES  # under the minimum
    from worker.settings import Settings

    assert Settings().max_body_bytes == MAX_REQUEST_BYTES


def test_cli_args_over_the_limit_are_refused_reading_one_byte_past_it(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stdin:
        def __init__(self) -> None:
            self.buffer = self
            self.asked: list[int] = []

        def read(self, n: int = -1) -> bytes:
            self.asked.append(n)
            return b"{" + b" " * (n - 1)

    stdin = Stdin()
    monkeypatch.setenv("LOOM_MAX_BODY_BYTES", "2048")
    monkeypatch.setattr(sys, "stdin", stdin)
    message = read_arguments("-")
    assert (
        message
        == "--args -: Request too large: over the limit of 2048 bytes (LOOM_MAX_BODY_BYTES); refused while reading it"
    )
    assert stdin.asked == [2049]


def test_batch_lines_over_the_limit_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_MAX_BODY_BYTES", "1024")
    data = b'{"tool": "a"}\n' + b"z" * 5000 + b"\n" + b'{"tool": "b"}\n'
    got: list[Any] = list(_bounded_lines(io.BytesIO(data)))
    assert got == ['{"tool": "a"}\n', 1024, '{"tool": "b"}\n']


def test_cp_refuses_a_file_larger_than_the_sandbox_takes_reading_one_byte_past_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    import worker.harness
    from worker.cli.cp import _cmd_cp
    from worker.settings import Settings

    monkeypatch.setattr(worker.harness, "MAX_WRITE", 1000)
    src = tmp_path / "big.bin"
    src.write_bytes(b"z" * 1001)
    args = argparse.Namespace(src=str(src), dest=":big.bin", workspace=str(tmp_path), call_id=None)
    assert _cmd_cp(args, Settings()) == 1
    assert "larger than 1000 bytes" in capsys.readouterr().err
