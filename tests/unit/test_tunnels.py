"""Tunnels to a port on the sandbox's loopback, over the agent's channel, with the agent
run as a host subprocess (so "the sandbox's loopback" is this host's here; the Docker
tests run the same code in containers). Real sockets, real servers."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox import tunnel as T
from sandbox.base import ExecRequest
from sandbox.errors import AgentError, TunnelClosedError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[int]:
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
        await srv.wait_closed()


async def _hash_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads to EOF, answers with the sha256 and size of what it got, then sends 8 MB."""
    h = hashlib.sha256()
    n = 0
    while data := await reader.read(1 << 16):
        h.update(data)
        n += len(data)
    writer.write(f"{h.hexdigest()} {n}\n".encode())
    block = bytes(range(256)) * 4096
    for _ in range(8):
        writer.write(block)
        await writer.drain()
    writer.close()


async def read_all(t: T.SandboxTunnel) -> bytes:
    out = bytearray()
    while data := await t.read():
        out += data
    return bytes(out)


async def test_bytes_both_ways_with_half_close(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    payload = os.urandom(5_000_000)
    async with server(_hash_all) as port:
        t = await box.open_tunnel(port)
        assert t.address == "127.0.0.1"
        await t.write(payload)
        await t.write_eof()  # the server reads to EOF, then answers: reading goes on
        got = await read_all(t)
    head, _, rest = got.partition(b"\n")
    assert head.decode() == f"{hashlib.sha256(payload).hexdigest()} {len(payload)}"
    assert rest == bytes(range(256)) * 4096 * 8
    assert t.error is None
    with pytest.raises(TunnelClosedError):
        await t.write(b"more")


async def test_nothing_listening_is_a_clear_refusal(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(AgentError) as e:
        await box.open_tunnel(free)
    assert e.value.code == "connection_refused" and f"port {free}" in str(e.value)
    with pytest.raises(ValueError):
        await box.open_tunnel(70000)


async def test_a_slow_reader_holds_at_most_the_window(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    sent = asyncio.Event()

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(64):  # 32 MiB, far more than the window
                writer.write(b"z" * (512 << 10))
                await writer.drain()
            sent.set()
            writer.close()

    async with server(flood) as port:
        t = await box.open_tunnel(port)
        for _ in range(50):  # nobody reads: the agent stops at the window
            await asyncio.sleep(0.02)
            assert t._buffered <= T.WINDOW
        assert not sent.is_set()  # the server is held back by TCP, not buffered anywhere
        assert len(await read_all(t)) == 32 << 20
        assert sent.is_set()


async def test_a_server_that_does_not_read_holds_our_writes(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    release = asyncio.Event()

    async def stubborn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        n = 0
        while data := await reader.read(1 << 16):
            n += len(data)
        writer.write(b"%d" % n)
        writer.close()

    async with server(stubborn) as port:
        t = await box.open_tunnel(port)
        writing = asyncio.ensure_future(t.write(b"w" * (64 << 20)))
        for _ in range(50):
            await asyncio.sleep(0.02)
            assert t._in_flight <= T.SEND_WINDOW
        assert not writing.done()  # 64 MiB cannot all be somewhere in between
        release.set()
        await writing
        await t.write_eof()
        assert await read_all(t) == b"%d" % (64 << 20)


async def test_many_tunnels_at_once(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def one(port: int, i: int) -> bytes:
        t = await box.open_tunnel(port)
        msg = os.urandom(100_000 + i)
        await t.write(msg)
        await t.write_eof()
        assert await read_all(t) == msg
        return msg

    async with server(echo) as port:
        await asyncio.gather(*(one(port, i) for i in range(40)))


async def test_a_reset_and_a_lost_sandbox_end_the_tunnel(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()

    async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async with server(reset) as port:
        t = await box.open_tunnel(port)
        await t.write(b"x")
        assert await read_all(t) == b""
        assert t.error is not None and "reset" in t.error.lower()
    async with server(idle) as port:
        t = await box.open_tunnel(port)
        await box.close()
        assert await read_all(t) == b""
        assert t.error is not None and "lost" in t.error


async def test_an_agent_that_ignores_the_window_loses_its_tunnel(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)

    async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async with server(idle) as port:
        t = await box.open_tunnel(port)
        t._on_event({"event": "tunnel", "tunnel": t.id, "data": b"x" * (T.WINDOW + 1)})
        assert t.closed and "window" in (t.error or "")
        t2 = await box.open_tunnel(port)
        t2._on_event({"event": "tunnel", "tunnel": t2.id, "data": "not bytes"})
        assert t2.closed and "malformed" in (t2.error or "")
        assert (await box.exec(ExecRequest("echo fine"))).stdout == b"fine\n"  # the connection lives on


async def test_relay_joins_a_client_connection(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = await reader.readline()
        writer.write(b"hello " + name)
        await writer.drain()
        writer.close()

    async with server(greet) as port:

        async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await T.relay(await box.open_tunnel(port), reader, writer)

        front = await asyncio.start_server(forward, "127.0.0.1", 0)
        fport = front.sockets[0].getsockname()[1]
        try:
            r, w = await asyncio.open_connection("127.0.0.1", fport)
            w.write(b"world\n")
            await w.drain()
            assert await r.read() == b"hello world\n"
            w.close()
        finally:
            front.close()
            await front.wait_closed()


def test_bytes_sent_right_after_the_open_answer_are_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the agent's own module: the host may send its first bytes as soon as it has the
    open's answer, before the agent's thread has run what follows the answer."""
    import base64
    import io

    from sandbox.agent import channel
    from sandbox.agent import tunnel as agent_tunnel

    out = io.BytesIO()
    monkeypatch.setattr(channel, "_out", out)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        answer = agent_tunnel.op_tunnel_open({"tunnel": 991, "port": srv.getsockname()[1]})
        after = answer.pop("_after_send")
        conn, _ = srv.accept()
        with conn:
            # The answer is on its way; the host's bytes arrive before ``after`` ran.
            agent_tunnel.op_tunnel_send({"tunnel": 991, "data": base64.b64encode(b"early").decode()})
            conn.settimeout(10)
            assert conn.recv(100) == b"early"
            conn.sendall(b"back")
            after()
            for _ in range(500):  # the server's bytes, raw after the line announcing them
                if b'"raw":4' in out.getvalue():
                    break
                threading.Event().wait(0.01)
            assert {"event": "tunnel", "tunnel": 991, "k": None, "raw": 4, "data": b"back"} in _messages(out.getvalue())
            agent_tunnel.op_tunnel_close({"tunnel": 991})
            for _ in range(500):  # its last event written while ``out`` is still the channel
                if b'"closed":true' in out.getvalue():
                    break
                threading.Event().wait(0.01)
            assert 991 not in agent_tunnel._tunnels


def _messages(stream: bytes) -> list[dict[str, Any]]:
    """The agent's messages in ``stream``, the raw bytes after a line as its ``data``."""
    import json

    out = []
    while stream:
        line, _, stream = stream.partition(b"\n")
        msg = json.loads(line)
        if "raw" in msg:
            msg["data"], stream = stream[: msg["raw"]], stream[msg["raw"] :]
        out.append(msg)
    return out


# -- raw bytes after a line, through the push-mode transport ---------------------------------


async def test_raw_bytes_split_anywhere_are_reassembled_in_order() -> None:
    from sandbox.connection import AgentConnection
    from sandbox.docker import DockerExecTransport
    from sandbox.errors import SandboxLostError
    from tests.unit.test_transport_push import FakeAgent, frame

    host, far = socket.socketpair()
    far.setblocking(False)
    conn = AgentConnection(await DockerExecTransport.open(host), label="raw-test")
    agent = FakeAgent(far)
    starting = asyncio.create_task(conn.start({}, timeout=5))
    await agent.boot()
    await starting
    try:
        got: list[dict[str, Any]] = []
        conn.set_stream_handler("tunnel", 5, got.append)
        payloads = [os.urandom(n) for n in (1, 700, 65536, 300_000, 0)]
        stream = b""
        for p in payloads:
            stream += agent.line({"event": "tunnel", "tunnel": 5, "raw": len(p)}) + p
        stream += agent.line({"event": "tunnel", "tunnel": 5, "eof": True})
        # In pieces that cut lines and payloads anywhere, several per frame.
        cuts = [0, 3, 90, 91, 5000, 70_000, 200_001, 366_000, len(stream)]
        for a, b in itertools.pairwise(cuts):
            await agent.send(frame(1, stream[a:b]))
        for _ in range(200):
            if len(got) == len(payloads) + 1:
                break
            await asyncio.sleep(0.01)
        assert [m.get("data") for m in got[:-1]] == payloads and got[-1]["eof"] is True
        # A forged line announcing raw bytes is dropped, and its bytes end the stream
        # (they are not JSON): nothing of it is taken as a message.
        await agent.send(frame(1, agent.line({"event": "tunnel", "tunnel": 5, "raw": 6}, nonce=False) + b"forge\n"))
        for _ in range(200):
            if conn.closed:
                break
            await asyncio.sleep(0.01)
        assert conn.closed and len(got) == len(payloads) + 2 and got[-1]["event"] == "lost"
        with pytest.raises(SandboxLostError):
            await conn.request("stat", {}, timeout=5)
    finally:
        await conn.close()
        far.close()


async def test_more_raw_bytes_than_allowed_end_the_connection() -> None:
    from sandbox.connection import MAX_RAW, AgentConnection
    from sandbox.docker import DockerExecTransport
    from tests.unit.test_transport_push import FakeAgent, frame

    host, far = socket.socketpair()
    far.setblocking(False)
    conn = AgentConnection(await DockerExecTransport.open(host), label="raw-test")
    agent = FakeAgent(far)
    starting = asyncio.create_task(conn.start({}, timeout=5))
    await agent.boot()
    await starting
    try:
        await agent.send(frame(1, agent.line({"event": "tunnel", "tunnel": 1, "raw": MAX_RAW + 1})))
        for _ in range(200):
            if conn.closed:
                break
            await asyncio.sleep(0.01)
        assert conn.closed and "raw bytes" in conn.close_reason
    finally:
        await conn.close()
        far.close()


# -- the fd channel: a tunnel's socket handed over whole (runc) ---------------------------------


@contextlib.asynccontextmanager
async def fd_channel(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """The agent's handover module (in this process) and the host's FdChannel, joined by
    a SOCK_SEQPACKET pair as the container's socket joins them."""
    from sandbox.agent import handover as agent_handover
    from sandbox.handover import FdChannel

    agent_end, host_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    host_end.setblocking(False)
    monkeypatch.setitem(agent_handover._fds, "sock", agent_end)
    chan = FdChannel(host_end)
    chan.start()
    try:
        yield agent_handover, chan
    finally:
        chan.close()
        agent_end.close()


async def test_a_handed_over_socket_is_the_connection_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.handover import SocketTunnel, adopt

    async with fd_channel(monkeypatch) as (agent, chan), server(_hash_all) as port:
        handed = chan.expect(7)
        sock = socket.create_connection(("127.0.0.1", port))
        assert agent.hand_over(7, sock) is True and sock.fileno() == -1  # the agent's copy is closed
        t = SocketTunnel(adopt(await asyncio.wait_for(handed, 10), port), port, "127.0.0.1")
        payload = os.urandom(3_000_000)
        await t.write(payload)
        await t.write_eof()
        got = await read_all(t)
        assert got.split(b"\n", 1)[0].decode() == f"{hashlib.sha256(payload).hexdigest()} {len(payload)}"
        await t.close()
        with pytest.raises(TunnelClosedError):
            await t.write(b"x")


async def test_what_is_not_the_asked_connection_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sandbox.errors import ProtocolError
    from sandbox.handover import adopt

    ended = asyncio.Queue()  # type: asyncio.Queue[bool]

    async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        ended.put_nowait(True)  # the other end was closed
        writer.close()

    async with fd_channel(monkeypatch) as (agent, chan), server(idle) as port:
        # a file, not a socket
        handed = chan.expect(1)
        with (tmp_path / "f").open("w") as f:
            assert agent.hand_over(1, f) is True
        with pytest.raises(ProtocolError, match="not a socket"):
            adopt(await asyncio.wait_for(handed, 10), port)
        # a unix socket, not TCP
        handed = chan.expect(2)
        a, b = socket.socketpair()
        agent.hand_over(2, a)
        with pytest.raises(ProtocolError, match="not TCP"):
            adopt(await asyncio.wait_for(handed, 10), port)
        b.close()
        # a connection to another port than the one asked for
        handed = chan.expect(3)
        agent.hand_over(3, socket.create_connection(("127.0.0.1", port)))
        with pytest.raises(ProtocolError, match="not port 1"):
            adopt(await asyncio.wait_for(handed, 10), 1)
        assert await asyncio.wait_for(ended.get(), 10)  # the refused one was closed
        # one nobody waits for is closed, and the channel goes on
        agent.hand_over(99, socket.create_connection(("127.0.0.1", port)))
        assert await asyncio.wait_for(ended.get(), 10)
        handed = chan.expect(4)
        agent.hand_over(4, socket.create_connection(("127.0.0.1", port)))
        adopt(await asyncio.wait_for(handed, 10), port).close()
        assert await asyncio.wait_for(ended.get(), 10)
