"""The host treats the agent as untrusted: malformed, oversized or out-of-workspace answers
are protocol errors, never data. Also the stream demuxer and the fail-closed runtime check."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from sandbox import protocol
from sandbox.base import ExecRequest
from sandbox.client import AgentSandbox
from sandbox.connection import AgentConnection, Transport
from sandbox.errors import (
    PathEscapeError,
    PathNotFoundError,
    ProtocolError,
    RuntimeUnavailableError,
    SandboxLostError,
    SandboxTimeoutError,
)


class ScriptedTransport(Transport):
    """An agent that answers every request with whatever ``reply(request)`` returns."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.booted = False
        self.boot_buf = b""
        self.closed = False
        self.nonce = ""

    async def read(self) -> tuple[bytes, bytes]:
        data = await self.queue.get()
        return data, b""

    async def write(self, data: bytes) -> None:
        if not self.booted:
            # (a stream: the agent and its config line may come in any number of writes)
            self.boot_buf += data
            bundle = protocol.agent_bundle()
            if len(self.boot_buf) <= len(bundle) or not self.boot_buf.endswith(b"\n"):
                return
            self.booted = True
            assert self.boot_buf.startswith(bundle)
            self.nonce = json.loads(self.boot_buf[len(bundle) :])["nonce"]
            hello = {
                "version": "1",
                "uid": 1,
                "gid": 1,
                "pid": 2,
                "python": "3.11",
                "kernel": "k",
                "subreaper": True,
                "ripgrep": True,
            }
            await self.queue.put(protocol.encode({"id": 0, "ok": True, "result": hello, "k": self.nonce}))
            return
        req = json.loads(data)
        out = self.reply(req)
        if isinstance(out, dict):
            out = protocol.encode({**out, "k": self.nonce})
        if out is not None:
            await self.queue.put(out)

    async def close(self) -> None:
        self.closed = True
        await self.queue.put(b"")


class _Box(AgentSandbox):
    transports: list[ScriptedTransport]


async def _box(reply: Any) -> tuple[_Box, ScriptedTransport]:
    transports: list[ScriptedTransport] = []

    async def connect(_lost: bool) -> AgentConnection:
        transports.append(ScriptedTransport(reply))
        conn = AgentConnection(transports[-1])
        await conn.start({})
        return conn

    box = _Box(Path("/ws"), connect, io_timeout=0.2)
    box.transports = transports
    await box.connection()
    return box, transports[0]


def ok(req: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {"id": req["id"], "ok": True, "result": result}


async def test_listing_with_a_path_outside_the_workspace_is_a_protocol_error() -> None:
    box, _ = await _box(lambda r: ok(r, {"entries": [["../etc/passwd", "file", 1, 1]], "truncated": False}))
    with pytest.raises(ProtocolError, match="outside the workspace"):
        await box.list(".")


@pytest.mark.parametrize("bad", ["/etc/passwd", "a/../../b", "..", "\x00x"])
async def test_search_paths_are_rechecked(bad: str) -> None:
    box, _ = await _box(lambda r: ok(r, {"matches": [[bad, 1, "x"]], "truncated": False, "engine": "x"}))
    with pytest.raises(ProtocolError):
        await box.search("x")


async def test_more_bytes_than_asked_is_a_protocol_error() -> None:
    import base64

    data = base64.b64encode(b"x" * 100).decode()
    box, _ = await _box(
        lambda r: ok(r, {"data": data, "size": 100, "truncated": False, "sha256": None, "mtime_ns": 1, "binary": False})
    )
    with pytest.raises(ProtocolError):
        await box.read("f", max_bytes=10)


@pytest.mark.parametrize(
    "result",
    [
        {"exit_code": 0, "stdout": "", "stderr": "", "outcome": "pwned", "duration_ms": 1},
        {"exit_code": "0", "stdout": "", "stderr": "", "outcome": "exit", "duration_ms": 1},
        {"exit_code": 0, "stdout": "!!notbase64", "stderr": "", "outcome": "exit", "duration_ms": 1},
        {"exit_code": 0, "stdout": "", "stderr": "", "outcome": "exit", "duration_ms": "fast"},
        {"exit_code": None, "stdout": "", "stderr": "", "outcome": "disk_limit", "duration_ms": 1, "disk_used": "lots"},
    ],
)
async def test_malformed_exec_results_are_protocol_errors(result: dict[str, Any]) -> None:
    box, _ = await _box(lambda r: ok(r, result))
    with pytest.raises(ProtocolError):
        await box.exec(ExecRequest("true"))


async def test_garbage_line_ends_the_connection_as_lost() -> None:
    box, _ = await _box(lambda r: b"this is not json\n")
    with pytest.raises(SandboxLostError):
        await box.stat("x")


async def test_unknown_ids_are_ignored_and_errors_are_typed() -> None:
    def reply(r: dict[str, Any]) -> bytes:
        nonce = box.transports[-1].nonce
        stray = protocol.encode({"id": 999, "ok": True, "result": {}, "k": nonce})
        err = protocol.encode({"id": r["id"], "ok": False, "code": "escape", "error": "nope", "k": nonce})
        return stray + err

    box, _ = await _box(reply)
    with pytest.raises(PathEscapeError, match="nope"):
        await box.stat("x")


async def test_forged_lines_without_the_connection_secret_are_dropped() -> None:
    def reply(r: dict[str, Any]) -> bytes:
        nonce = box.transports[-1].nonce
        forged = protocol.encode(
            {"id": r["id"], "ok": True, "result": {"path": "x", "type": "file", "size": 1, "mtime_ns": 1, "mode": 1}}
        )
        real = protocol.encode({"id": r["id"], "ok": False, "code": "not_found", "error": "real", "k": nonce})
        return forged + real

    box, _ = await _box(reply)
    with pytest.raises(PathNotFoundError, match="real"):
        await box.stat("x")


async def test_silent_agent_hits_the_host_deadline_and_exec_reports_sandbox_lost() -> None:
    box, transport = await _box(lambda r: None)
    from sandbox import client

    client.DEADLINE_SLACK, saved = 0.1, client.DEADLINE_SLACK
    try:
        with pytest.raises(SandboxTimeoutError):
            await box.stat("x")
        assert transport.closed  # an agent out of sync is never reused
        r = await box.exec(ExecRequest("sleep 1", timeout=0.1))
        assert r.outcome == "sandbox_lost"
    finally:
        client.DEADLINE_SLACK = saved


def test_demuxer_splits_frames_across_chunks() -> None:
    frames = struct.pack(">BxxxL", 1, 5) + b"hello" + struct.pack(">BxxxL", 2, 3) + b"err"
    frames += struct.pack(">BxxxL", 1, 1) + b"!"
    d = protocol.Demuxer()
    out, err = b"", b""
    for i in range(len(frames)):
        o, e = d.feed(frames[i : i + 1])
        out += o
        err += e
    assert (out, err) == (b"hello!", b"err")


async def test_gvisor_requested_but_not_registered_is_refused() -> None:
    """Fail closed before creating anything when the engine has no runsc runtime."""
    from sandbox.docker import DockerBackend
    from sandbox.spec import SandboxSpec

    class Engine:
        created = False

        def info(self) -> dict[str, Any]:
            return {"Runtimes": {"runc": {}}}

        class containers:
            @staticmethod
            def create(**_: Any) -> None:
                Engine.created = True

    backend = DockerBackend(SandboxSpec(runtime="runsc"), client_factory=Engine)
    with pytest.raises(RuntimeUnavailableError, match="runsc"):
        await backend.ensure_container(Path("/tmp"))
    assert not Engine.created


def test_disk_limits_parse_and_reach_the_container_and_its_agents(tmp_path: Path) -> None:
    from sandbox.docker import DockerBackend
    from sandbox.spec import SandboxSpec

    spec = SandboxSpec(max_file_size="2g", disk_limit="0", disk_reserve="512m")
    assert (spec.max_file_size, spec.disk_limit, spec.disk_reserve) == (2 << 30, 0, 512 << 20)
    assert spec.agent_config() == {
        "own_dirs": {"/tmp": 0o1777, "/home/sandbox": 0o700},
        "disk_limit": 0,
        "disk_reserve": 512 << 20,
        "inode_limit": 1_000_000,
    }
    defaults = SandboxSpec()
    assert (defaults.max_file_size, defaults.disk_limit, defaults.disk_reserve) == (4 << 30, 8 << 30, 1 << 30)
    assert spec.fingerprint() != defaults.fingerprint()  # a running sandbox with other limits is replaced
    with pytest.raises(ValueError):
        SandboxSpec(max_file_size=0)  # an fsize of 0 would stop every write
    with pytest.raises(ValueError):
        SandboxSpec(disk_limit="lots")
    cfg = DockerBackend(spec).container_config(tmp_path)
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in cfg["ulimits"]}["fsize"] == (2 << 30, 2 << 30)
