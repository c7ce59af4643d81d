"""Secrets at the egress gateway on real sockets, without Docker: what a sandbox's relay
sends to its gateway socket, TLS with the workspace's CA, and what arrives at an HTTPS
origin of the test's own on loopback (its CA trusted by the gateway only, as
``LOOM_EGRESS_UPSTREAM_CA`` does), names mapped to it by a test resolver."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import h11
import pytest
import trustme

from tests.origins import Origin
from worker.egress.addresses import HostAddresses, IPAddress, parse_networks
from worker.egress.ca import upstream_context
from worker.egress.gateway import SOCKET, EgressGateway, Limits
from worker.egress.intercept import Interceptor
from worker.egress.log import EgressLog
from worker.egress.policy import EgressPolicy
from worker.egress.provision import SecretsHost
from worker.egress.upstream import Upstream

VALUE = "s3cr3t-VALUE-0123456789abcdef"
NAMES = ("api.test", "other.test", "third.test")


async def resolver(host: str, port: int) -> list[IPAddress]:
    if host not in NAMES:
        raise OSError(-2, "Name or service not known")
    return [ipaddress.ip_address("127.0.0.1")]


@dataclass
class Env:
    gw: EgressGateway
    root: Path
    secrets: SecretsHost
    origin: Origin
    ca: trustme.CA
    log: EgressLog
    policy: list[str]

    @property
    def port(self) -> int:
        return self.origin.port

    def records(self, **match: object) -> list[dict[str, object]]:
        return [r for r in self.log.read(self.root, limit=1000) if all(r.get(k) == v for k, v in match.items())]

    def set(self, name: str, value: str = VALUE, **kw: object) -> str:
        kw.setdefault("hosts", [f"api.test:{self.port}"])
        if "query" not in kw:
            kw.setdefault("header", "Authorization: Bearer {value}")
        return self.secrets.store.set(self.root, name, value=value, **kw).placeholder  # type: ignore[arg-type]

    def workspace_ctx(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.secrets.ca(self.root).pem.decode())
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        return ctx


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    ca = trustme.CA()
    origin = Origin(ca, NAMES).start()
    ca_file = tmp_path / "origin-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    root = tmp_path / "ws"
    root.mkdir()
    log = EgressLog(tmp_path / "data")
    secrets = SecretsHost(tmp_path / "data")
    policy = [f"{n}:{origin.port}" for n in NAMES]
    upstream = Upstream(HostAddresses(), trusted=parse_networks("127.0.0.1/32"), resolver=resolver)
    ix = Interceptor(secrets, upstream_context(str(ca_file)))
    limits = Limits(16, 1 << 30)
    gw = EgressGateway(tmp_path / "egress", log, lambda r: EgressPolicy.parse(policy), upstream, limits, ix)
    await gw.serve(root)
    try:
        yield Env(gw, root, secrets, origin, ca, log, policy)
    finally:
        await gw.aclose()
        origin.stop()


class Client:
    """A sandbox program through the proxy door: CONNECT, TLS, HTTP/1.1 requests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, env: Env, host: str, ctx: ssl.SSLContext | None = None) -> Client:
        reader, writer = await asyncio.open_unix_connection(str(env.gw.socket_dir(env.root) / SOCKET))
        target = f"{host}:{env.port}"
        writer.write(f"LOOM-EGRESS/1 proxy\nCONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        await writer.start_tls(ctx or env.workspace_ctx(), server_hostname=host)
        return cls(reader, writer)

    async def request(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes | list[bytes] = b""
    ) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(self.conn.send(h11.Request(method=method, target=target, headers=headers)) or b"")
        for part in body if isinstance(body, list) else [body]:
            if part:
                self.writer.write(self.conn.send(h11.Data(data=part)) or b"")
        self.writer.write(self.conn.send(h11.EndOfMessage()) or b"")
        status, hdrs, data = 0, {}, b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                hdrs = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                data += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                break
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return status, hdrs, data

    def close(self) -> None:
        self.writer.close()


def host(name: str, env: Env) -> tuple[str, str]:
    return ("Host", f"{name}:{env.port}")


async def test_the_header_is_added_and_the_placeholder_replaced_on_a_kept_alive_connection(env: Env) -> None:
    ph = env.set("TOKEN")
    basic = "Authorization: Basic {git:value}"
    ph_b = env.set("BASIC", "pa55-word-for-git", header=basic, hosts=[f"other.test:{env.port}"])
    c = await Client.open(env, "api.test")
    assert c.writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"  # h2 was offered
    # the sandbox trusts only the workspace CA here: the certificate is the gateway's
    assert "loom-worker secrets CA" in str(c.writer.get_extra_info("peercert")["issuer"])
    status, _h, body = await c.request("GET", "/a", [host("api.test", env)])
    assert status == 200 and body.startswith(b"ok /a")
    status, _h, _b = await c.request("GET", "/b", [host("api.test", env), ("X-Api-Token", f"token {ph}")])
    status, _h, _b = await c.request("GET", "/c", [host("api.test", env), ("Authorization", f"Bearer {ph}")])
    status, _h, _b = await c.request("GET", "/d", [host("api.test", env), ("Authorization", "Bearer mine")])
    c.close()
    a, b, cc, d = env.origin.seen[-4:]
    assert a.connection == b.connection == cc.connection == d.connection  # one connection, four requests
    assert a.header("authorization") == [f"Bearer {VALUE}"]
    assert b.header("x-api-token") == [f"token {VALUE}"] and b.header("authorization") == [f"Bearer {VALUE}"]
    assert cc.header("authorization") == [f"Bearer {VALUE}"]
    assert d.header("authorization") == ["Bearer mine"]  # the request's own header is kept
    # Basic credentials made by a client from a user and the placeholder (git's way)
    c = await Client.open(env, "other.test")
    creds = base64.b64encode(f"me:{ph_b}".encode()).decode()
    await c.request("GET", "/e", [host("other.test", env), ("Authorization", f"Basic {creds}")])
    await c.request("GET", "/f", [host("other.test", env)])
    c.close()
    e, f = env.origin.seen[-2:]
    assert base64.b64decode(e.header("authorization")[0][6:]) == b"me:pa55-word-for-git"
    assert base64.b64decode(f.header("authorization")[0][6:]) == b"git:pa55-word-for-git"
    await asyncio.sleep(0.05)
    uses = env.records(kind="secret", verdict="allowed")
    assert {u["secret"] for u in uses} == {"TOKEN", "BASIC"}
    assert {(u["method"], u["path"], u["status"]) for u in uses} >= {("GET", "/a", 200), ("GET", "/e", 200)}
    conn = env.records(kind="connect", host="api.test")[-1]
    assert conn["verdict"] == "allowed" and "intercepted" in str(conn["reason"]) and "4 requests" in str(conn["reason"])
    assert VALUE not in json.dumps(env.log.read(env.root, limit=1000)) and "pa55-word" not in json.dumps(env.records())


async def test_placeholders_elsewhere_are_not_substituted_and_are_logged(env: Env) -> None:
    ph = env.set("TOKEN")
    other = env.set("OTHER", "other-value-123456789", hosts=[f"third.test:{env.port}"])
    c = await Client.open(env, "api.test")
    await c.request("POST", f"/u?x={ph}", [host("api.test", env), ("Content-Length", str(len(ph)))], ph.encode())
    gone = "loom-secret:GONE:" + "0" * 32
    await c.request("GET", "/h", [host("api.test", env), ("X-Other", other), ("X-Unknown", gone)])
    c.close()
    url, hdr = env.origin.seen[-2:]
    assert url.target == f"/u?x={ph}" and url.body == ph.encode()  # URL and body unchanged
    assert hdr.header("x-other") == [other]  # another secret's placeholder: not for this host
    assert hdr.header("authorization") == [f"Bearer {VALUE}"]
    # to an allowed host that carries no secret, over TLS: spliced, untouched (the origin's
    # own certificate, which only the origin's CA verifies)
    ctx = ssl.create_default_context()
    env.ca.configure_trust(ctx)
    c = await Client.open(env, "other.test", ctx)
    await c.request("GET", "/spliced", [host("other.test", env), ("Authorization", f"Bearer {ph}")])
    c.close()
    assert env.origin.seen[-1].header("authorization") == [f"Bearer {ph}"]
    await asyncio.sleep(0.05)
    denied = {str(r["reason"]) for r in env.records(kind="secret", verdict="denied")}
    assert any("the URL" in r for r in denied) and any("the body" in r for r in denied), denied
    assert any("not one of its hosts" in r for r in denied) and any("GONE" in r for r in denied), denied
    rec = env.records(kind="connect", host="other.test")[-1]
    assert rec["reason"] == "allowed" and rec["rule"] == f"other.test:{env.port}"  # no interception


async def test_plain_http_never_gets_a_secret_and_the_attempt_is_logged(env: Env, tmp_path: Path) -> None:
    plain = await asyncio.start_server(_plain_echo, "127.0.0.1", 0)
    port = plain.sockets[0].getsockname()[1]
    env.policy.append(f"api.test:{port}")
    ph = env.set("TOKEN", hosts=["api.test", f"api.test:{port}"])
    reader, writer = await asyncio.open_unix_connection(str(env.gw.socket_dir(env.root) / SOCKET))
    head = f"GET http://api.test:{port}/p HTTP/1.1\r\nHost: api.test\r\nAuthorization: {ph}\r\n\r\n"
    writer.write(f"LOOM-EGRESS/1 proxy\n{head}".encode())
    data = await reader.read(-1)
    writer.close()
    plain.close()
    assert ph.encode() in data and VALUE.encode() not in data
    await asyncio.sleep(0.05)
    rec = env.records(kind="secret", verdict="denied")[-1]
    assert rec["secret"] == "TOKEN" and "plain-HTTP" in str(rec["reason"])


async def _plain_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(head) + head)
    await writer.drain()
    writer.close()


async def test_expect_continue_chunked_bodies_and_an_early_refusal(env: Env) -> None:
    env.set("TOKEN")
    c = await Client.open(env, "api.test")
    hdrs = [host("api.test", env), ("Expect", "100-continue"), ("Transfer-Encoding", "chunked")]
    status, _h, body = await c.request("PUT", "/upload", hdrs, [b"a" * 70_000, b"b" * 5, b"c" * 300_000])
    assert status == 200 and body.startswith(b"ok /upload 370005")
    seen = env.origin.seen[-1]
    assert seen.chunked and seen.body == b"a" * 70_000 + b"b" * 5 + b"c" * 300_000
    assert seen.header("authorization") == [f"Bearer {VALUE}"]
    status, _h, _b = await c.request("GET", "/after", [host("api.test", env)])  # the same connection goes on
    assert status == 200 and env.origin.seen[-1].connection == seen.connection
    # an answer before the body (401 to Expect): relayed, and that connection ends
    hdrs = [host("api.test", env), ("Expect", "100-continue"), ("Content-Length", "5")]
    c.writer.write(c.conn.send(h11.Request(method="POST", target="/reject", headers=hdrs)) or b"")
    head = await c.reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401")
    c.close()


async def test_another_host_on_the_connection_rotation_deletion_and_reflection(env: Env) -> None:
    env.set("TOKEN")
    c = await Client.open(env, "api.test")
    status, hdrs, body = await c.request("GET", "/reflect", [host("api.test", env)])
    assert status == 200 and VALUE.encode() not in body and VALUE not in json.dumps(hdrs)
    assert env.origin.seen[-1].header("authorization") == [f"Bearer {VALUE}"]  # it was sent...
    assert b"*" * len(VALUE) in body and "loom-secret:TOKEN:" in hdrs["x-seen-authorization"]  # ...and masked back
    env.set("TOKEN", "rotated-value-abcdefgh")
    await c.request("GET", "/r2", [host("api.test", env)])
    assert env.origin.seen[-1].header("authorization") == ["Bearer rotated-value-abcdefgh"]
    env.secrets.store.delete(env.root, "TOKEN")
    await c.request("GET", "/r3", [host("api.test", env)])
    assert env.origin.seen[-1].header("authorization") == []
    n = len(env.origin.seen)
    status, hdrs, body = await c.request("GET", "/misdirected", [host("other.test", env)])
    assert status == 421 and "another Host" in body.decode() and len(env.origin.seen) == n
    c.close()
    # an absolute URI naming another host (a server routes by it, whatever the Host says)
    env.set("TOKEN")  # (api.test is intercepted again: it carries a secret)
    c = await Client.open(env, "api.test")
    status, _h, _b = await c.request("GET", f"https://other.test:{env.port}/x", [host("api.test", env)])
    assert status == 421 and len(env.origin.seen) == n
    c.close()
    c = await Client.open(env, "api.test")
    status, _h, _b = await c.request("GET", f"https://api.test:{env.port}/same", [host("api.test", env)])
    assert status == 200 and env.origin.seen[-1].target == f"https://api.test:{env.port}/same"
    c.close()


async def test_a_sandbox_without_the_workspace_ca_gets_no_secret(env: Env) -> None:
    env.set("TOKEN")
    n = len(env.origin.seen)
    ctx = ssl.create_default_context()  # the host's public roots, not the workspace CA
    with pytest.raises(ssl.SSLCertVerificationError):
        await Client.open(env, "api.test", ctx)
    await asyncio.sleep(0.1)
    assert len(env.origin.seen) == n
    rec = env.records(kind="connect", host="api.test")[-1]
    assert rec["verdict"] == "error" and "trust store" in str(rec["reason"])
    assert "nothing was sent" in str(rec["reason"])


async def test_an_untrusted_destination_is_a_502_that_says_why(env: Env, tmp_path: Path) -> None:
    env.set("TOKEN")
    env.gw.interceptor.upstream_ctx = upstream_context(None)  # the host's store only: the origin is unknown
    c = await Client.open(env, "api.test")
    status, hdrs, body = await c.request("GET", "/x", [host("api.test", env)])
    c.close()
    assert status == 502 and "certificate verify failed" in body.decode() and "error" in hdrs["x-loom-egress"]
    assert not any(s.target == "/x" for s in env.origin.seen)


async def test_query_parameter_secrets(env: Env) -> None:
    ph = env.set("KEY", "query-value-with/slash", query="api_key")
    c = await Client.open(env, "api.test")
    await c.request("GET", "/q?a=1", [host("api.test", env)])
    await c.request("GET", f"/q?api_key={ph}&b=2", [host("api.test", env)])
    await c.request("GET", "/q?api_key=own", [host("api.test", env)])
    c.close()
    one, two, three = (s.target for s in env.origin.seen[-3:])
    assert one == "/q?a=1&api_key=query-value-with%2Fslash" and two == "/q?api_key=query-value-with%2Fslash&b=2"
    assert three == "/q?api_key=own"
    await asyncio.sleep(0.05)
    assert all("query-value" not in str(r) for r in env.records())


async def test_a_large_body_is_relayed_whole_masked_and_the_connection_goes_on(env: Env) -> None:
    env.set("TOKEN")
    c = await Client.open(env, "api.test")
    n = 3 * (1 << 20) + 12345
    status, _h, body = await c.request("GET", f"/big/{n}", [host("api.test", env)])
    assert status == 200 and len(body) == n and body == b"x" * n
    status, _h, body = await c.request("GET", f"/big/{n}?reflect", [host("api.test", env)])
    assert status == 200 and len(body) == n and VALUE.encode() not in body
    assert body.count(b"Bearer " + b"*" * len(VALUE)) >= 40  # every copy masked, across reads
    status, _h, body = await c.request("HEAD", f"/big/{n}", [host("api.test", env)])
    assert status == 200 and body == b""
    status, _h, body = await c.request("GET", "/after", [host("api.test", env)])
    assert status == 200 and body.startswith(b"ok /after")
    c.close()
    assert len({s.connection for s in env.origin.seen[-4:]}) == 1  # all on one connection
