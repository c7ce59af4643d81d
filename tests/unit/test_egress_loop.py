"""The handler's loop performs what :mod:`worker.egress.decide` decides, on real sockets:
a refusal of a request line is answered and logged, a tunnel's first bytes are read until
the decision has enough of them (a request split anywhere is still checked), and a
tunnel that passes reaches its server. The decisions themselves: test_egress_decide.py."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from worker.egress.addresses import HostAddresses, IPAddress, parse_networks
from worker.egress.gateway import SOCKET, EgressGateway, Limits
from worker.egress.log import EgressLog
from worker.egress.policy import EgressPolicy
from worker.egress.upstream import Upstream


async def resolver(host: str, port: int) -> list[IPAddress]:
    if host not in ("allowed.test", "other.test"):
        raise OSError(-2, "Name or service not known")
    return [ipaddress.ip_address("127.0.0.1")]


@dataclass
class Env:
    gw: EgressGateway
    root: Path
    port: int
    log: EgressLog

    async def open(self, header: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_unix_connection(str(self.gw.socket_dir(self.root) / SOCKET))
        writer.write(f"LOOM-EGRESS/1 {header}\n".encode())
        return reader, writer

    async def record(self, **match: object) -> dict[str, object]:
        for _ in range(200):  # the log line is written as the connection ends
            recs = [r for r in self.log.read(self.root, limit=100) if all(r.get(k) == v for k, v in match.items())]
            if recs:
                return recs[-1]
            await asyncio.sleep(0.01)
        raise AssertionError((match, self.log.read(self.root, limit=100)))


async def _server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        body = b"hello from " + head.split(b" ")[1]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
    finally:
        writer.close()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    server = await asyncio.start_server(_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    root = tmp_path / "ws"
    root.mkdir()
    log = EgressLog(tmp_path / "data")
    policy = EgressPolicy.parse([f"allowed.test:{port}", f"other.test:{port}"])
    upstream = Upstream(HostAddresses(), trusted=parse_networks("127.0.0.1/32"), resolver=resolver)
    gw = EgressGateway(tmp_path / "egress", log, lambda r: policy, upstream, Limits(8, 64 << 20))
    await gw.serve(root)
    try:
        yield Env(gw, root, port, log)
    finally:
        await gw.aclose()
        server.close()


async def _status(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head


@pytest.mark.parametrize(
    ("request_line", "kind", "reason"),
    [
        ("CONNECT 2001:db8::1:443 HTTP/1.1", "connect", "CONNECT needs host:port"),
        ("CONNECT user@allowed.test:443 HTTP/1.1", "connect", "CONNECT needs host:port"),
        ("GET http://allowed.test:0/ HTTP/1.1", "http", "is not a host[:port]"),
        ("GET https://allowed.test/ HTTP/1.1", "http", "use CONNECT"),
    ],
)
async def test_a_bad_request_line_is_a_400_that_is_logged(env: Env, request_line: str, kind: str, reason: str) -> None:
    reader, writer = await env.open("proxy")
    writer.write(f"{request_line}\r\nHost: allowed.test\r\n\r\n".encode())
    status, head = await _status(reader)
    body = await reader.read(-1)
    writer.close()
    assert status == 400 and b"X-Loom-Egress: denied" in head and reason.encode() in body
    rec = await env.record(kind=kind)
    assert reason in str(rec["reason"])


async def _tunnel(env: Env, *pieces: bytes) -> tuple[bytes, asyncio.StreamWriter]:
    reader, writer = await env.open("proxy")
    target = f"allowed.test:{env.port}"
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    status, _head = await _status(reader)
    assert status == 200
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0.02)  # (so that the pieces tend to arrive apart; either way the outcome is the same)
    return await reader.read(-1), writer


async def test_a_request_split_anywhere_in_a_tunnel_reaches_its_server(env: Env) -> None:
    out, writer = await _tunnel(env, b"GE", b"T /split HTTP/1.1\r\nHo", b"st: allowed.test\r\n\r\n")
    writer.close()
    assert out.endswith(b"hello from /split")
    rec = await env.record(kind="connect", verdict="allowed")
    assert rec["host"] == "allowed.test"


@pytest.mark.parametrize(
    ("pieces", "reason"),
    [
        # a method cut after two bytes is read on, and its Host checked (on any port)
        ((b"GE", b"T / HTTP/1.1\r\nHost: other.test\r\n\r\n"), "HTTP Host other.test differs from allowed.test"),
        ((b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n",), "more than one Host header"),
        ((b"GET / HTTP/1.1\r\nHost: other.test@allowed.test\r\n\r\n",), "HTTP Host (none) differs"),
    ],
)
async def test_a_tunnel_whose_first_bytes_name_another_host_is_refused(
    env: Env, pieces: tuple[bytes, ...], reason: str
) -> None:
    out, writer = await _tunnel(env, *pieces)
    writer.close()
    assert b"hello" not in out
    rec = await env.record(kind="connect", verdict="denied")
    assert reason in str(rec["reason"])
