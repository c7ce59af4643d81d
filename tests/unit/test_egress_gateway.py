"""The egress gateway on real sockets, without Docker: what a sandbox's relay would send to
its unix socket, and the gateway's answers, against HTTP and TLS servers on this machine's
loopback (reached through the operator's trusted-network override, as a test server is)
and a resolver that maps test names to chosen addresses (no real lookup is made)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import ssl
import stat
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from worker.egress import dns
from worker.egress.addresses import HostAddresses, IPAddress, parse_networks
from worker.egress.gateway import SOCKET, EgressGateway, Limits
from worker.egress.log import EgressLog
from worker.egress.policy import EgressPolicy
from worker.egress.upstream import Upstream

NAMES = {
    "allowed.test": ["127.0.0.1"],
    "other.test": ["127.0.0.1"],
    "rebind.test": ["203.0.113.9", "10.0.0.1"],
    "meta.test": ["169.254.169.254"],
    "loop.test": ["127.0.0.2"],
}
BIG = 1 << 20


async def fake_resolver(host: str, port: int) -> list[IPAddress]:
    if host not in NAMES:
        raise OSError(-2, "Name or service not known")
    return [ipaddress.ip_address(a) for a in NAMES[host]]


@dataclass
class Env:
    gw: EgressGateway
    root: Path
    policy: list[str]
    http_port: int
    tls_port: int
    ca: trustme.CA
    log: EgressLog

    @property
    def socket(self) -> str:
        return str(self.gw.socket_dir(self.root) / SOCKET)

    def records(self) -> list[dict[str, object]]:
        return self.log.read(self.root, limit=1000)


async def _http_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ")[1]
        body = b"x" * BIG if path == b"/big" else b"hello from " + path
        host = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"host:")]
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Seen-Host: %s\r\n\r\n" % (len(body), host[0][5:].strip())
            + body
        )
        await writer.drain()
    finally:
        writer.close()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("allowed.test", "other.test").configure_cert(server_ctx)
    http = await asyncio.start_server(_http_server, "127.0.0.1", 0)
    tls_srv = await asyncio.start_server(_http_server, "127.0.0.1", 0, ssl=server_ctx)
    http_port = http.sockets[0].getsockname()[1]
    tls_port = tls_srv.sockets[0].getsockname()[1]
    root = tmp_path / "ws"
    root.mkdir()
    policy: list[str] = []
    log = EgressLog(tmp_path / "data")
    upstream = Upstream(HostAddresses(), trusted=parse_networks("127.0.0.1/32"), resolver=fake_resolver)
    gw = EgressGateway(tmp_path / "egress", log, lambda r: EgressPolicy.parse(policy), upstream, Limits(8, 64 << 20))
    await gw.serve(root)
    try:
        yield Env(gw, root, policy, http_port, tls_port, ca, log)
    finally:
        await gw.aclose()
        http.close()
        tls_srv.close()


async def relay(env: Env, header: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(env.socket)
    writer.write(f"LOOM-EGRESS/1 {header}\n".encode())
    return reader, writer


async def connect(env: Env, target: str) -> tuple[int, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await relay(env, "proxy")
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    return status, headers, reader, writer


async def tls_get(env: Env, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sni: str, path: str) -> bytes:
    ctx = ssl.create_default_context()
    env.ca.configure_trust(ctx)
    await writer.start_tls(ctx, server_hostname=sni)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {sni}\r\n\r\n".encode())
    return await reader.read(-1)


def last(env: Env, **match: object) -> dict[str, object]:
    recs = [r for r in env.records() if all(r.get(k) == v for k, v in match.items())]
    assert recs, (match, env.records())
    return recs[-1]


async def test_connect_to_an_allowed_name_goes_through_and_is_logged(env: Env) -> None:
    env.policy[:] = [f"allowed.test:{env.tls_port}"]
    status, _h, reader, writer = await connect(env, f"allowed.test:{env.tls_port}")
    assert status == 200
    body = await tls_get(env, reader, writer, "allowed.test", "/hi")
    assert body.endswith(b"hello from /hi")
    writer.close()
    await asyncio.sleep(0.05)
    rec = last(env, kind="connect", host="allowed.test")
    assert rec["verdict"] == "allowed" and rec["address"] == "127.0.0.1" and rec["port"] == env.tls_port
    assert int(rec["bytes_up"]) > 200 and int(rec["bytes_down"]) > 500  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("nope.test:{tls}", "not on the allowlist"),
        ("127.0.0.1:{tls}", "IP address is refused"),
        ("allowed.test:9", "port 9 is not allowed"),
        ("rebind.test:443", "10.0.0.1: private"),
        ("meta.test:443", "metadata"),
        ("loop.test:443", "127.0.0.2: loopback"),
    ],
)
async def test_refusals_are_403s_that_say_why(env: Env, target: str, words: str) -> None:
    env.policy[:] = [f"allowed.test:{env.tls_port}", "rebind.test", "meta.test", "loop.test"]
    target = target.format(tls=env.tls_port)
    status, headers, reader, writer = await connect(env, target)
    body = (await reader.read(-1)).decode()
    writer.close()
    assert status == 403, body
    assert headers["x-loom-egress"].startswith("denied;") and target.split(":")[0] in headers["x-loom-egress"]
    assert words in body and "allowlist" in body
    rec = last(env, host=target.rsplit(":", 1)[0])
    assert rec["verdict"] == "denied" and words in str(rec["reason"])


async def test_a_server_name_other_than_the_connect_name_is_refused(env: Env) -> None:
    env.policy[:] = [f"allowed.test:{env.tls_port}", f"other.test:{env.tls_port}"]
    status, _h, reader, writer = await connect(env, f"allowed.test:{env.tls_port}")
    assert status == 200
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        await tls_get(env, reader, writer, "other.test", "/")
    writer.close()
    await asyncio.sleep(0.05)
    rec = last(env, kind="connect", verdict="denied")
    assert "other.test differs from allowed.test" in str(rec["reason"])


async def test_plain_http_is_filtered_by_its_absolute_uri(env: Env) -> None:
    env.policy[:] = [f"allowed.test:{env.http_port}"]

    async def get(url: str) -> tuple[bytes, bytes]:
        reader, writer = await relay(env, "proxy")
        writer.write(f"GET {url} HTTP/1.1\r\nHost: forged.example\r\n\r\n".encode())
        data = await reader.read(-1)
        writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return head, body

    head, body = await get(f"http://allowed.test:{env.http_port}/path?q=1")
    assert head.startswith(b"HTTP/1.1 200") and body == b"hello from /path?q=1"
    assert b"x-seen-host: allowed.test:%d" % env.http_port in head.lower()  # Host is the URI's, never forged
    head, body = await get(f"http://other.test:{env.http_port}/")
    assert head.startswith(b"HTTP/1.1 403") and b"not on the allowlist" in body
    head, body = await get(f"https://allowed.test:{env.http_port}/")
    assert head.startswith(b"HTTP/1.1 400") and b"CONNECT" in body
    assert int(last(env, kind="http", host="allowed.test", verdict="allowed")["bytes_down"]) > 20  # type: ignore[call-overload]


async def test_the_policy_changes_for_new_connections_at_once(env: Env) -> None:
    target = f"other.test:{env.tls_port}"
    status, *_ = await connect(env, target)
    assert status == 403  # no policy: nothing
    env.policy[:] = [target]
    status, _h, reader, writer = await connect(env, target)
    assert status == 200
    assert (await tls_get(env, reader, writer, "other.test", "/x")).endswith(b"hello from /x")
    env.policy[:] = ["!other.test", target]
    status, *_ = await connect(env, target)
    assert status == 403


async def test_the_stub_resolver_answers_allowed_names_only_and_asks_no_one(env: Env) -> None:
    env.policy[:] = ["allowed.test", "*.pkgs.test"]
    reader, writer = await relay(env, "dns")

    async def ask(name: str, qtype: int = dns.TYPE_A) -> tuple[int, bytes]:
        q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0)
        for label in name.split("."):
            q += bytes([len(label)]) + label.encode()
        q += b"\x00" + struct.pack(">HH", qtype, 1)
        writer.write(len(q).to_bytes(2, "big") + q)
        n = int.from_bytes(await reader.readexactly(2), "big")
        resp = await reader.readexactly(n)
        return struct.unpack_from(">H", resp, 2)[0] & 0xF, resp

    rcode, resp = await ask("allowed.test")
    assert rcode == 0 and resp.endswith(dns.synthetic_address("allowed.test").packed)
    rcode, resp = await ask("a.pkgs.test")
    assert rcode == 0 and resp.endswith(dns.synthetic_address("a.pkgs.test").packed)
    rcode, resp = await ask("allowed.test", dns.TYPE_AAAA)
    assert rcode == 0 and struct.unpack_from(">H", resp, 6)[0] == 0  # no IPv6 answer: fall back to A
    assert (await ask("exfil-data-in-a-label.evil.test"))[0] == dns.RCODE_NXDOMAIN
    assert (await ask("rebind.test"))[0] == dns.RCODE_NXDOMAIN  # resolvable here, but not listed
    writer.close()
    assert last(env, kind="dns", host="exfil-data-in-a-label.evil.test")["verdict"] == "denied"


async def test_a_program_dialling_a_stub_address_is_checked_by_its_server_name(env: Env) -> None:
    env.policy[:] = [f"allowed.test:{env.tls_port}"]
    good = dns.synthetic_address("allowed.test")
    reader, writer = await relay(env, f"tcp {good} {env.tls_port}")
    assert (await tls_get(env, reader, writer, "allowed.test", "/t")).endswith(b"hello from /t")
    writer.close()
    # The same name at another name's address: refused (the address says what was looked up).
    reader, writer = await relay(env, f"tcp {dns.synthetic_address('other.test')} {env.tls_port}")
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        await tls_get(env, reader, writer, "allowed.test", "/")
    writer.close()
    await asyncio.sleep(0.05)
    assert "is not the address" in str(last(env, kind="transparent", verdict="denied")["reason"])


async def test_limits_cut_a_flood_and_refuse_too_many_connections(env: Env) -> None:
    env.policy[:] = [f"allowed.test:{env.tls_port}"]
    env.gw.limits.max_connections = 1
    env.gw._states[env.root].served.max_connections = 1  # type: ignore[union-attr]
    held = [await connect(env, f"allowed.test:{env.tls_port}") for _ in range(2)]
    statuses = [h[0] for h in held]
    third = await connect(env, f"allowed.test:{env.tls_port}")
    assert third[0] == 429 and "limited" in third[1]["x-loom-egress"]
    for _s, _h, _r, w in [*held, third]:
        w.close()
    assert statuses == [200, 200]  # "at most 1" counts the ones already open before this one
    await asyncio.sleep(0.1)
    env.gw._states[env.root].served.max_connections = 8  # type: ignore[union-attr]
    env.gw._states[env.root].served.budget.per_minute = 200_000  # type: ignore[union-attr]
    env.gw._states[env.root].served.budget._tokens = 200_000  # type: ignore[union-attr]
    status, _h, reader, writer = await connect(env, f"allowed.test:{env.tls_port}")
    assert status == 200
    with contextlib.suppress(ssl.SSLError, ConnectionError):
        body = await tls_get(env, reader, writer, "allowed.test", "/big")
        assert len(body) < BIG
    writer.close()
    await asyncio.sleep(0.1)
    rec = last(env, kind="connect", verdict="limited")
    assert "bytes per minute" in str(rec["reason"])
    status, headers, *_ = await connect(env, f"allowed.test:{env.tls_port}")
    assert status == 429 and "limited" in headers["x-loom-egress"]


async def test_one_process_serves_a_socket_others_take_over(env: Env, tmp_path: Path) -> None:
    d = env.gw.socket_dir(env.root)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(d / SOCKET).st_mode) == 0o666 and stat.S_ISSOCK(os.stat(d / SOCKET).st_mode)
    assert (d / "resolv.conf").read_text().count("nameserver 127.0.0.1") == 1
    other = EgressGateway(env.gw.egress_dir, env.log, lambda r: None, env.gw.upstream)
    await other.serve(env.root)  # the first one holds the lock: this one leaves it be
    assert not other.serving(env.root) and env.gw.serving(env.root)
    await env.gw.release(env.root)
    other._states[env.root].checked = 0  # its next call looks again
    await other.serve(env.root)
    assert other.serving(env.root)
    status, *_ = await connect(env, "allowed.test:443")
    assert status == 403  # the new server's policy (none)
    await other.aclose()


async def test_a_request_arriving_after_the_header_line_is_served(env: Env) -> None:
    """The agent's relay sends its header line first and the client's bytes as they come
    (the bug this pins: the gateway took an empty buffer for the end of the stream)."""
    env.policy[:] = [f"allowed.test:{env.tls_port}"]
    reader, writer = await asyncio.open_unix_connection(env.socket)
    writer.write(b"LOOM-EGRESS/1 proxy\n")
    await writer.drain()
    await asyncio.sleep(0.1)
    target = f"allowed.test:{env.tls_port}"
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"  # no "Connection: close" in it
    assert (await tls_get(env, reader, writer, "allowed.test", "/late")).endswith(b"hello from /late")
    writer.close()


async def test_an_agents_http_hook_reaches_its_turn_socket_and_nothing_else(env: Env) -> None:
    """``POST /.loom/turn/<process id>`` to the proxy's own address is an agent's turn
    report (Claude Code's HTTP hook): relayed to that process's turn socket in the
    workspace's socket directory, answered 200 {} once recorded, no host dialled, nothing
    logged as egress; no such process is 200 {} too (a hook never fails the agent)."""
    from worker.agents.turns import TurnChannel

    class Recorded:
        def __init__(self) -> None:
            self.turns: list[dict[str, str]] = []

        async def settle_background(self, *, prefer: str, turn: dict[str, str]) -> list[str]:
            self.turns.append(turn)
            return ["a.py"]

    ws = Recorded()
    before = len(env.records())
    hook = {
        "hook_event_name": "PostToolUse",
        "tool_name": "Edit",
        "tool_input": {"file_path": "src/a.py", "new_string": "x" * 9000},
    }
    body = json.dumps(hook).encode()
    async with TurnChannel.open(ws, "agent-0123456789ab", env.gw.socket_dir(env.root)):
        for pid in ("agent-0123456789ab", "agent-gone"):
            reader, writer = await relay(env, "proxy")
            writer.write(
                f"POST /.loom/turn/{pid} HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n{}"), answer
    assert ws.turns == [{"call_id": "agent-0123456789ab.t1", "tool": "Edit", "command": "src/a.py"}]
    assert len(env.records()) == before  # not egress: nothing dialled, nothing logged
