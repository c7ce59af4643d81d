"""Push mode: the attach-stream transport (an ``asyncio.Protocol``) hands bytes straight to
the connection. The far end here is a real socket speaking Docker's framing (what the
engine sends over an attach stream), so the framing, line splitting, flow control and
failure paths run exactly as on a Docker connection, minus the engine."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from sandbox import protocol
from sandbox.connection import AgentConnection
from sandbox.docker import DockerExecTransport
from sandbox.errors import SandboxLostError, SandboxTimeoutError
from sandbox.local import ProcessTransport


def frame(stream: int, payload: bytes) -> bytes:
    """One frame of Docker's multiplexed attach stream (1 stdout, 2 stderr)."""
    return struct.pack(">BxxxL", stream, len(payload)) + payload


class FakeAgent:
    """The far end of the attach stream: reads what the host writes, answers in frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.buf = b""
        self.nonce = ""

    async def _fill(self) -> bool:
        data = await self.loop.sock_recv(self.sock, 1 << 16)
        self.buf += data
        return bool(data)

    async def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not await self._fill():
                raise EOFError
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    async def read_line(self) -> bytes:
        while b"\n" not in self.buf:
            if not await self._fill():
                raise EOFError
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    async def boot(self) -> None:
        """Take the agent bundle and the config the host sends, answer with a hello."""
        bundle = protocol.agent_bundle()
        assert await self.read_exact(len(bundle)) == bundle
        self.nonce = json.loads(await self.read_line())["nonce"]
        await self.send(frame(1, self.line({"id": 0, "ok": True, "result": {"version": "1"}})))

    async def request(self) -> dict[str, Any]:
        req: dict[str, Any] = json.loads(await self.read_line())
        return req

    def line(self, msg: dict[str, Any], *, nonce: bool = True) -> bytes:
        return protocol.encode({**msg, "k": self.nonce} if nonce else msg)

    def answer(self, req: dict[str, Any], result: dict[str, Any]) -> bytes:
        return self.line({"id": req["id"], "ok": True, "result": result})

    async def send(self, data: bytes, *, chunk: int = 0, pause: float = 0.002) -> None:
        """Send ``data``; with ``chunk``, in pieces that arrive separately."""
        if not chunk:
            await self.loop.sock_sendall(self.sock, data)
            return
        for i in range(0, len(data), chunk):
            await self.loop.sock_sendall(self.sock, data[i : i + chunk])
            await asyncio.sleep(pause)

    async def sees_eof(self, timeout: float = 5.0) -> bool:
        """True once the host closed its end (everything it sent is drained first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = await asyncio.wait_for(self.loop.sock_recv(self.sock, 1 << 16), deadline - time.monotonic())
            except TimeoutError:
                return False
            if not data:
                return True
        return False


@dataclass
class Wired:
    conn: AgentConnection
    agent: FakeAgent
    transport: DockerExecTransport


@pytest.fixture
async def wired() -> AsyncIterator[Wired]:
    host, far = socket.socketpair()
    far.setblocking(False)
    transport = await DockerExecTransport.open(host)
    conn = AgentConnection(transport, label="push-test")
    agent = FakeAgent(far)
    starting = asyncio.create_task(conn.start({}, timeout=5))
    await agent.boot()
    assert await starting == {"version": "1"}
    assert conn._reader is None  # push mode: no reader task
    try:
        yield Wired(conn, agent, transport)
    finally:
        await conn.close()
        far.close()


async def test_lines_and_frames_split_across_chunks_are_reassembled(wired: Wired) -> None:
    conn, agent = wired.conn, wired.agent
    first = asyncio.create_task(conn.request("stat", {"path": "a"}, timeout=5))
    second = asyncio.create_task(conn.request("stat", {"path": "b"}, timeout=5))
    r1, r2 = await agent.request(), await agent.request()
    assert (r1["op"], r1["path"], r2["path"]) == ("stat", "a", "b")
    one = agent.answer(r1, {"which": "first", "pad": "x" * 300})
    two = agent.answer(r2, {"which": "second"})
    # the first line spans three stdout frames, with a stderr frame in between; the second
    # starts in the same frame the first ends in
    stream = (
        frame(1, one[:50])
        + frame(2, b"a warning on stderr\n")
        + frame(1, one[50:200])
        + frame(1, one[200:] + two[:10])
        + frame(1, two[10:])
    )
    await agent.send(stream, chunk=7)  # every header and line cut in pieces
    assert (await first)["which"] == "first"
    assert (await second)["which"] == "second"
    assert "a warning on stderr" in conn.diagnostics()
    assert not conn.closed and conn._pending == {}


async def test_many_whole_lines_in_one_chunk(wired: Wired) -> None:
    conn, agent = wired.conn, wired.agent
    calls = [asyncio.create_task(conn.request("stat", {"path": str(i)}, timeout=5)) for i in range(20)]
    reqs = [await agent.request() for _ in calls]
    await agent.send(frame(1, b"".join(agent.answer(r, {"path": r["path"]}) for r in reversed(reqs))))
    assert [(await c)["path"] for c in calls] == [str(i) for i in range(20)]


@pytest.mark.parametrize("whole", [False, True], ids=["growing", "complete-line"])
async def test_oversized_line_closes_the_connection_with_a_protocol_error(
    wired: Wired, monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    monkeypatch.setattr(protocol, "MAX_RESPONSE_BYTES", 4096)
    conn, agent = wired.conn, wired.agent
    call = asyncio.create_task(conn.request("read", {"path": "big"}, timeout=5))
    await agent.request()
    payload = b'{"id":1,"ok":true,"result":{"data":"' + b"A" * 5000
    if whole:
        await agent.send(frame(1, payload + b'"}}\n'))
    else:
        await agent.send(frame(1, payload), chunk=1000)
    with pytest.raises(SandboxLostError):
        await call
    assert conn.closed
    assert conn.close_reason == "protocol error: agent response line exceeds the size limit"
    assert await agent.sees_eof()  # the stream is closed: the agent exits
    with pytest.raises(SandboxLostError, match="closed"):
        await conn.request("stat", {"path": "a"}, timeout=5)


async def test_non_json_line_closes_the_connection(wired: Wired) -> None:
    conn, agent = wired.conn, wired.agent
    call = asyncio.create_task(conn.request("stat", {"path": "a"}, timeout=5))
    await agent.request()
    await agent.send(frame(1, b"Traceback (most recent call last):\n"))
    with pytest.raises(SandboxLostError):
        await call
    assert conn.close_reason.startswith("protocol error: agent sent a line that is not JSON")
    assert await agent.sees_eof()


async def test_forged_lines_without_the_nonce_are_dropped(wired: Wired) -> None:
    conn, agent = wired.conn, wired.agent
    call = asyncio.create_task(conn.request("stat", {"path": "a"}, timeout=5))
    req = await agent.request()
    forged = agent.line({"id": req["id"], "ok": True, "result": {"forged": True}}, nonce=False)
    wrong = protocol.encode({"id": req["id"], "ok": True, "result": {"forged": True}, "k": "0" * 32})
    real = agent.answer(req, {"forged": False})
    await agent.send(frame(1, forged + wrong[:20]), chunk=9)
    await agent.send(frame(1, wrong[20:] + real))
    assert await call == {"forged": False}
    assert conn.forged == 2 and not conn.closed


async def test_silent_agent_times_out_and_the_connection_is_closed(wired: Wired) -> None:
    conn, agent = wired.conn, wired.agent
    started = time.monotonic()
    call = asyncio.create_task(conn.request("stat", {"path": "a"}, timeout=0.3))
    await agent.request()  # read, never answered
    with pytest.raises(SandboxTimeoutError, match=r"did not answer stat within 0\.3s"):
        await call
    assert 0.25 <= time.monotonic() - started < 3
    assert conn.closed and conn.close_reason == "no answer to stat within 0.3s"
    assert conn._pending == {}
    assert await agent.sees_eof()


async def test_timer_is_cancelled_when_the_answer_comes(wired: Wired) -> None:
    """An answered request leaves no live timer behind that could close the connection."""
    conn, agent = wired.conn, wired.agent
    call = asyncio.create_task(conn.request("stat", {"path": "a"}, timeout=0.2))
    await agent.send(frame(1, agent.answer(await agent.request(), {"ok": 1})))
    assert await call == {"ok": 1}
    await asyncio.sleep(0.35)
    assert not conn.closed


async def test_cancelled_caller_leaves_the_connection_usable(wired: Wired) -> None:
    conn, agent = wired.conn, wired.agent
    call = asyncio.create_task(conn.request("stat", {"path": "slow"}, timeout=5))
    slow = await agent.request()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert conn._pending == {} and not conn.closed
    late = agent.answer(slow, {"late": True})  # dropped: nobody waits for it any more
    nxt = asyncio.create_task(conn.request("stat", {"path": "next"}, timeout=5))
    req = await agent.request()
    await agent.send(frame(1, late + agent.answer(req, {"path": "next"})))
    assert await nxt == {"path": "next"}
    assert not conn.closed


async def test_agent_exit_fails_pending_calls_with_its_last_words(wired: Wired) -> None:
    conn, agent = wired.conn, wired.agent
    lost: list[dict[str, Any]] = []
    conn.event_handlers[7] = lost.append
    call = asyncio.create_task(conn.request("stat", {"path": "a"}, timeout=5))
    await agent.request()
    await agent.send(frame(2, b"MemoryError: agent died\n"))
    agent.sock.close()
    with pytest.raises(SandboxLostError, match="agent died"):
        await call
    assert conn.closed and conn.close_reason == "agent exited"
    assert lost == [{"event": "lost", "reason": "agent exited"}]


async def test_events_reach_their_handler(wired: Wired) -> None:
    conn, agent = wired.conn, wired.agent
    seen: list[dict[str, Any]] = []
    conn.event_handlers[3] = seen.append
    ev = agent.line({"event": "stdout", "proc": 3, "data": "aGk="})
    forged = agent.line({"event": "stdout", "proc": 3, "data": "bm8="}, nonce=False)
    await agent.send(frame(1, ev[:5]) + frame(1, ev[5:] + forged))
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert [e["data"] for e in seen] == ["aGk="]


async def test_a_large_write_waits_for_the_reader(wired: Wired) -> None:
    """Write flow control: 8 MiB cannot sit in the socket buffer; the request's write
    waits until the agent has read it, and every byte arrives in order."""
    conn, agent = wired.conn, wired.agent
    data = "0123456789abcdef" * (1 << 19)  # 8 MiB
    call = asyncio.create_task(conn.request("write", {"path": "big", "data": data}, timeout=30))
    await asyncio.sleep(0.1)
    assert conn._write_lock.locked()  # still writing: the agent has not read yet
    req = await agent.request()
    assert req["data"] == data
    await asyncio.sleep(0.05)
    assert not conn._write_lock.locked()
    await agent.send(frame(1, agent.answer(req, {"size": len(data)})))
    assert await call == {"size": len(data)}


async def test_pull_mode_read_still_works() -> None:
    """Without start(), the transport queues what arrives for read() (the reader-task path)."""
    host, far = socket.socketpair()
    far.setblocking(False)
    transport = await DockerExecTransport.open(host)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(far, frame(1, b"out")[:5])
        await asyncio.sleep(0.01)
        await loop.sock_sendall(far, frame(1, b"out")[5:] + frame(2, b"err"))
        got = b"", b""
        while got != (b"out", b"err"):
            out, err = await asyncio.wait_for(transport.read(), 5)
            got = got[0] + out, got[1] + err
        await transport.write(b"to the agent\n")
        assert await loop.sock_recv(far, 100) == b"to the agent\n"
        far.close()
        assert await asyncio.wait_for(transport.read(), 5) == (b"", b"")
        with pytest.raises(ConnectionResetError):
            await transport.write(b"x")
    finally:
        await transport.close()
        far.close()


async def test_close_is_idempotent_and_ends_the_stream(wired: Wired) -> None:
    await wired.transport.close()
    await wired.transport.close()
    assert await wired.agent.sees_eof()
    for _ in range(100):
        if wired.conn.closed:
            break
        await asyncio.sleep(0.01)
    assert wired.conn.closed


async def test_local_process_agent_that_dies_reports_its_stderr() -> None:
    """The host-subprocess transport pushes too; an agent that dies at boot is reported
    with what it wrote to stderr."""
    code = "import sys; sys.stdin.readline(); sys.stderr.write('agent boom at boot'); sys.exit(3)"
    transport = await ProcessTransport.spawn(sys.executable, "-c", code)
    conn = AgentConnection(transport, label="dies")
    with pytest.raises(SandboxLostError, match="agent boom at boot"):
        await conn.start({}, timeout=10)
    assert conn._reader is None and conn.closed


def test_demuxer_whole_frames_and_split_headers() -> None:
    d = protocol.Demuxer()
    chunk = frame(1, b"abc") + frame(2, b"") + frame(2, b"E") + frame(1, b"def") + frame(1, b"gh")[:3]
    assert d.feed(chunk) == (b"abcdef", b"E")
    assert d.feed(frame(1, b"gh")[3:6]) == (b"", b"")  # still inside the header
    assert d.feed(frame(1, b"gh")[6:] + frame(1, b"i")) == (b"ghi", b"")
    big = frame(1, b"x" * 100_000)  # one frame over a hundred chunks: output once, at the end
    outs = [d.feed(big[i : i + 1000]) for i in range(0, len(big), 1000)]
    assert [o for o in outs if o != (b"", b"")] == [(b"x" * 100_000, b"")]


async def test_a_boot_nobody_reads_fails_within_its_timeout() -> None:
    """A container removed under its attach stream may leave the stream open and unread
    (seen with the engine's attach): the agent's payload fills the socket, and the start
    must fail within its timeout instead of waiting on the write forever."""
    host, far = socket.socketpair()
    far.setblocking(False)
    host.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    transport = await DockerExecTransport.open(host)
    conn = AgentConnection(transport, label="unread")
    try:
        with pytest.raises(SandboxLostError, match="did not start"):
            await asyncio.wait_for(conn.start({}, timeout=0.5), 10)  # (the bundle is far larger than the buffers)
        assert conn.closed
    finally:
        far.close()


async def test_removing_a_container_ends_the_boot_of_its_main_agent() -> None:
    """Two calls of one process may race: one removes the container (other settings)
    whose main agent the other is booting. That boot ends at once, not at its timeout."""
    from types import SimpleNamespace

    from sandbox.docker.channel import AgentChannels
    from sandbox.spec import SandboxSpec

    host, far = socket.socketpair()
    far.setblocking(False)
    transport = await DockerExecTransport.open(host)
    channels = AgentChannels(None, None)  # type: ignore[arg-type]  # (a preloaded stream: no engine call)
    container = SimpleNamespace(id="c0ffee", name="loom-sbx-test", attrs={})
    spec = SandboxSpec(image="loom-sandbox:latest", agent_start_timeout=60)
    booting = asyncio.create_task(channels.attach_agent(container, spec, transport))
    await asyncio.sleep(0.1)
    assert not booting.done()
    t = time.monotonic()
    channels.abort_boots("c0ffee")
    try:
        with pytest.raises(SandboxLostError):
            await asyncio.wait_for(booting, 10)
        assert time.monotonic() - t < 5
        channels.abort_boots("c0ffee")  # (nothing left to end)
    finally:
        far.close()
