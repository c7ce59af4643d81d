"""The egress gateway's decisions, driven by tables: bytes and a policy in, a decision out,
no socket (:mod:`worker.egress.decide`). The handler's loop performs them; the gateway
tests (test_egress_gateway.py, test_secrets_gateway.py) check that it does."""

from __future__ import annotations

import functools
import ipaddress
import ssl
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.egress import decide, dns
from worker.egress.addresses import IPAddress
from worker.egress.decide import (
    Admit,
    BadRequest,
    Checked,
    Connect,
    DnsMessage,
    Drop,
    Forward,
    Header,
    Limits,
    Named,
    NeedMore,
    Refuse,
)
from worker.egress.policy import EgressPolicy

POLICY = EgressPolicy.parse(
    ["pypi.org", "*.example.com", "files.test:8443", "203.0.113.7", "[2001:db8::1]:443", "!upload.example.com"]
)
ROOMY = Limits(active=1, max_connections=64, budget_left=True, per_minute=1 << 30)


@functools.cache
def hello(server_name: str | None) -> bytes:
    """The ClientHello Python's (OpenSSL's) TLS client sends for ``server_name``."""
    ctx = ssl.create_default_context()
    if server_name is None:
        ctx.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def with_ech(record: bytes) -> bytes:
    """``record`` with an encrypted_client_hello extension appended (lengths fixed up)."""
    rec = bytearray(record)
    ext = struct.pack(">HH", 0xFE0D, 4) + b"\x00\x00\x00\x00"
    struct.pack_into(">H", rec, 3, struct.unpack_from(">H", rec, 3)[0] + len(ext))
    rec[6:9] = (int.from_bytes(rec[6:9], "big") + len(ext)).to_bytes(3, "big")
    p = 5 + 4 + 2 + 32
    p += 1 + rec[p]
    p += 2 + struct.unpack_from(">H", rec, p)[0]
    p += 1 + rec[p]
    struct.pack_into(">H", rec, p, struct.unpack_from(">H", rec, p)[0] + len(ext))
    return bytes(rec) + ext


def get(host: str | None, *extra: str) -> bytes:
    lines = ["GET / HTTP/1.1", *([f"Host: {host}"] if host is not None else []), *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def refused(decision: object, words: str, status: int = 403) -> bool:
    return isinstance(decision, Refuse) and decision.status == status and words in decision.reason


# -- the relay's header line ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("buf", "ended", "want"),
    [
        (b"LOOM-EGRESS/1 proxy\nCONNECT", None, Header(decide.Proxy(), 20)),
        (b"LOOM-EGRESS/1 dns\n", None, Header(decide.Dns(), 18)),
        (b"LOOM-EGRESS/1 tcp 127.77.0.9 443\n\x16", None, Header(decide.Transparent("127.77.0.9", 443), 33)),
        (b"LOOM-EGRESS/1 tcp [::1] 80\n", None, Header(decide.Transparent("[::1]", 80), 27)),
        (b"LOOM-EGRESS/1 pro", None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),
        (b"LOOM-EGRESS/1 pro", "eof", Drop()),
        (b"LOOM-EGRESS/1 pro", "timeout", Drop()),
        (b"", None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),
        (b"L" * 300, None, Drop()),  # a header line is short
        (b"GET / HTTP/1.1\r\n", None, Drop()),  # not the relay's
        (b"LOOM-EGRESS/2 proxy\n", None, Drop()),
        (b"LOOM-EGRESS/1 tcp 127.77.0.9\n", None, Drop()),
        (b"LOOM-EGRESS/1 tcp 127.77.0.9 https\n", None, Drop()),
        ("LOOM-EGRESS/1 tcp 127.77.0.9 \uff14\uff14\uff13\n".encode(), None, Drop()),  # fullwidth digits
        (b"LOOM-EGRESS/1 udp 127.77.0.9 53\n", None, Drop()),
        (b"LOOM-EGRESS/1 proxy please\n", None, Drop()),
    ],
)
def test_header(buf: bytes, ended: decide.Ended, want: object) -> None:
    assert decide.header(buf, ended) == want


# -- a proxy client's request line -----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "want"),
    [
        # CONNECT: authority form
        (b"CONNECT", b"pypi.org:443", Connect("pypi.org", 443)),
        (b"CONNECT", b"PyPI.Org.:443", Connect("pypi.org", 443)),
        (b"CONNECT", b"files.test:8443", Connect("files.test", 8443)),
        (b"CONNECT", b"[2001:db8::1]:443", Connect("2001:db8::1", 443)),
        (b"CONNECT", b"[2001:0db8:0::1]:443", Connect("2001:db8::1", 443)),
        (b"CONNECT", b"203.0.113.7:443", Connect("203.0.113.7", 443)),
        (b"CONNECT", b"xn--bcher-kva.example:443", Connect("xn--bcher-kva.example", 443)),
        (b"CONNECT", "bücher.example:443".encode(), "CONNECT needs host:port"),  # not ASCII on the wire
        (b"CONNECT", b"pypi.org", "CONNECT needs host:port"),
        (b"CONNECT", b"pypi.org:0", "CONNECT needs host:port"),
        (b"CONNECT", b"pypi.org:65536", "CONNECT needs host:port"),
        (b"CONNECT", b"2001:db8::1:443", "CONNECT needs host:port"),
        (b"CONNECT", b"[2001:db8::1]", "CONNECT needs host:port"),
        (b"CONNECT", b"user@pypi.org:443", "CONNECT needs host:port"),
        (b"CONNECT", b"user:pw@pypi.org:443", "CONNECT needs host:port"),
        (b"CONNECT", b"https://pypi.org:443", "CONNECT needs host:port"),
        (b"CONNECT", b"/", "CONNECT needs host:port"),
        # absolute form: the URI names the server, whatever Host says
        (b"GET", b"http://pypi.org/simple/", Forward("pypi.org", 80, b"/simple/")),
        (b"GET", b"http://pypi.org", Forward("pypi.org", 80, b"/")),
        (b"POST", b"http://PyPI.org:8080/a?b=c#frag", Forward("pypi.org", 8080, b"/a?b=c")),
        (b"GET", b"http://user:pw@pypi.org/x", Forward("pypi.org", 80, b"/x")),
        (b"GET", b"http://evil.example@pypi.org/", Forward("pypi.org", 80, b"/")),
        (b"GET", b"http://[2001:db8::1]:8080/", Forward("2001:db8::1", 8080, b"/")),
        (b"GET", b"http://203.0.113.7/", Forward("203.0.113.7", 80, b"/")),
        (b"GET", b"https://pypi.org/", "use CONNECT for https://"),
        (b"GET", b"/simple/", "this is an HTTP proxy"),
        (b"GET", b"ftp://pypi.org/", "this is an HTTP proxy"),
        (b"GET", b"http:///path", "this is an HTTP proxy"),
        (b"GET", b"http://pypi.org:0/", "is not a host[:port]"),
        (b"GET", b"http://pypi.org:99999/", "is not a host[:port]"),
        (b"GET", b"http://2001:db8::1/", "is not a host[:port]"),
        (b"GET", b"http://[2001:db8::1/", "not a URI"),
    ],
)
def test_proxy_request(method: bytes, target: bytes, want: object) -> None:
    got = decide.proxy_request(method, target)
    if isinstance(want, str):
        assert isinstance(got, BadRequest) and got.refuse.status == 400 and want in got.refuse.reason, got
        assert got.kind == ("connect" if method == b"CONNECT" else "http")
    else:
        assert got == want


# -- admission ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "port", "limits", "want"),
    [
        ("pypi.org", 443, ROOMY, Admit("pypi.org")),
        ("pypi.org", 80, ROOMY, Admit("pypi.org")),
        ("PYPI.ORG.", 443, ROOMY, Admit("pypi.org")),
        ("pypi.org", 8443, ROOMY, (403, "port 8443 is not allowed for pypi.org")),
        ("files.test", 8443, ROOMY, Admit("files.test:8443")),
        ("files.test", 443, ROOMY, (403, "port 443 is not allowed")),
        ("api.example.com", 443, ROOMY, Admit("*.example.com")),
        ("example.com", 443, ROOMY, (403, "not on the allowlist")),
        ("upload.example.com", 443, ROOMY, (403, "denied by !upload.example.com")),
        ("evil.example", 443, ROOMY, (403, "not on the allowlist")),
        ("pypi.org.evil.example", 443, ROOMY, (403, "not on the allowlist")),
        ("203.0.113.7", 443, ROOMY, Admit("203.0.113.7")),
        ("203.0.113.8", 443, ROOMY, (403, "an IP address is refused")),
        ("2001:db8::1", 443, ROOMY, Admit("[2001:db8::1]:443")),
        ("2001:db8::2", 443, ROOMY, (403, "an IP address is refused")),
        ("127.0.0.1", 443, ROOMY, (403, "an IP address is refused")),
        ("pypi.org", 443, Limits(65, 64, True, 100), (429, "too many connections at once (at most 64")),
        ("pypi.org", 443, Limits(64, 64, True, 100), Admit("pypi.org")),
        ("pypi.org", 443, Limits(1, 64, False, 100), (429, "over 100 bytes per minute")),
        ("evil.example", 443, Limits(65, 64, False, 100), (403, "not on the allowlist")),  # policy first
    ],
)
def test_admit(host: str, port: int, limits: Limits, want: object) -> None:
    got = decide.admit(POLICY, host, port, limits)
    if isinstance(want, tuple):
        status, words = want
        assert refused(got, words, status), got
        assert isinstance(got, Refuse) and got.verdict == ("denied" if status == 403 else "limited")
    else:
        assert got == want


def test_an_empty_policy_admits_nothing() -> None:
    assert refused(decide.admit(EgressPolicy(), "pypi.org", 443, ROOMY), "not on the allowlist")


def ips(*texts: str) -> list[IPAddress]:
    return [ipaddress.ip_address(t) for t in texts]


OWN = frozenset(ips("198.51.100.9", "2001:db8:ffff::9"))
TRUSTED = (ipaddress.ip_network("10.1.0.0/16"),)


@pytest.mark.parametrize(
    ("addrs", "want"),
    [
        (["203.0.113.7"], None),
        (["203.0.113.7", "2001:db8::1"], None),
        (["192.0.2.1"], None),  # documentation ranges are no one's network
        (["127.0.0.1"], "resolves to 127.0.0.1: loopback"),
        (["127.77.0.9"], "loopback"),  # the stub resolver's own answers too
        (["10.0.0.1"], "10.0.0.1: private (RFC 1918)"),
        (["172.16.5.5"], "private"),
        (["192.168.1.1"], "private"),
        (["100.64.0.1"], "shared address space (CGNAT)"),
        (["169.254.169.254"], "link-local (cloud metadata)"),
        (["0.0.0.0"], "this network"),
        (["224.0.0.1"], "multicast"),
        (["255.255.255.255"], "reserved"),
        (["::1"], "::1: loopback"),
        (["::"], "unspecified"),
        (["fe80::1"], "link-local"),
        (["fd00::1"], "unique local"),
        (["::ffff:127.0.0.1"], "loopback, inside an IPv6 address"),  # IPv4-mapped
        (["64:ff9b::a9fe:a9fe"], "cloud metadata), inside an IPv6 address"),  # NAT64
        (["2002:0a00:0001::1"], "private (RFC 1918), inside an IPv6 address"),  # 6to4
        (["198.51.100.9"], "an address of the worker's own host"),
        (["2001:db8:ffff::9"], "own host"),
        (["203.0.113.7", "10.0.0.1"], "resolves to 10.0.0.1"),  # one bad address: refused whole
        (["10.1.2.3"], None),  # a trusted network (an operator's mirror)
        (["10.2.0.1"], "private"),
        ([], "has no address"),
    ],
)
def test_addresses(addrs: list[str], want: str | None) -> None:
    got = decide.addresses("name.test", ips(*addrs), OWN, TRUSTED)
    if want is None:
        assert got == ips(*addrs)
    else:
        status = 502 if not addrs else 403
        assert refused(got, want, status), got


# -- a tunnel's first bytes ------------------------------------------------------------------

HEAD = get("pypi.org")
CUT = hello("pypi.org")[:40]


def _stable_id(value: object) -> str | None:
    """A ClientHello's id by what it is, not its bytes (random in every hello): pytest-xdist's
    workers must collect the same test names."""
    if isinstance(value, bytes) and value.startswith(b"\x16\x03"):
        return f"tls-hello-{len(value)}B"
    return None


@pytest.mark.parametrize(
    ("host", "port", "buf", "ended", "want"),
    [
        # TLS: the server name must be the CONNECT name
        ("pypi.org", 443, hello("pypi.org"), None, "pass"),
        ("pypi.org", 443, hello("PyPI.org"), None, "pass"),
        ("pypi.org", 443, hello("evil.example"), None, "TLS server name evil.example differs from pypi.org"),
        ("pypi.org", 443, hello("pypi.org.evil.example"), None, "differs from pypi.org"),
        ("pypi.org", 443, hello(None), None, "names no server (SNI)"),
        ("203.0.113.7", 443, hello(None), None, "pass"),  # an address has no name to send
        ("2001:db8::1", 443, hello(None), None, "pass"),
        ("203.0.113.7", 443, hello("pypi.org"), None, "differs from 203.0.113.7"),
        ("pypi.org", 443, with_ech(hello("pypi.org")), None, "encrypted_client_hello"),
        ("pypi.org", 443, CUT, None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),
        ("pypi.org", 443, CUT, "eof", "the TLS ClientHello was cut short"),
        ("pypi.org", 443, CUT, "timeout", "the TLS ClientHello was not sent in time"),
        ("pypi.org", 443, b"\x16", None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),
        ("pypi.org", 443, b"\x16\x03\x01\xff\xff", None, "not a TLS ClientHello"),  # longer than a record
        ("pypi.org", 443, b"\x16\x02\x01\x00\x10", None, "not a TLS ClientHello"),
        ("files.test", 8443, hello("files.test"), None, "pass"),
        ("files.test", 8443, hello("evil.example"), None, "differs from files.test"),
        # HTTP in a tunnel: the Host must be the CONNECT name
        ("pypi.org", 80, HEAD, None, "pass"),
        ("pypi.org", 443, HEAD, None, "pass"),
        ("pypi.org", 80, get("PyPI.org."), None, "pass"),
        ("pypi.org", 80, get("pypi.org:8080"), None, "pass"),  # the name is what is checked
        ("pypi.org", 80, get("evil.example"), None, "HTTP Host evil.example differs from pypi.org"),
        ("pypi.org", 80, get(None), None, "HTTP Host (none) differs"),
        ("pypi.org", 80, get("evil.example@pypi.org"), None, "HTTP Host (none) differs"),
        ("pypi.org", 80, get("pypi.org", "Host: evil.example"), None, "more than one Host header"),
        ("pypi.org", 80, get("pypi.org", "X-Host: evil.example"), None, "pass"),
        ("pypi.org", 80, b"GET / HTTP/1.1\r\nhOsT:\tpypi.org\r\n\r\n", None, "pass"),
        ("2001:db8::1", 80, get("[2001:db8::1]"), None, "pass"),
        ("2001:db8::1", 80, get("2001:db8::1"), None, "HTTP Host (none) differs"),
        ("pypi.org", 80, HEAD[:20], None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),
        ("pypi.org", 80, HEAD[:20], "eof", "an HTTP request head that never ends"),
        ("pypi.org", 80, HEAD[:20], "timeout", "an HTTP request head that never ends"),
        ("pypi.org", 80, b"GET / HTTP/1.1\r\nX: " + b"a" * (decide.MAX_HEAD + 1), None, "never ends"),
        ("pypi.org", 80, b"GE", None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),  # a method, cut
        ("pypi.org", 80, b"GE", "eof", "neither TLS nor HTTP on port 80"),
        ("pypi.org", 80, b"GE\n", None, "neither TLS nor HTTP on port 80"),  # not a method any more
        # nothing yet, or something else
        ("pypi.org", 443, b"", None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),
        ("pypi.org", 443, b"", "eof", "the client closed the tunnel before sending anything"),
        ("pypi.org", 443, b"", "timeout", "no TLS or HTTP from the client"),
        ("pypi.org", 443, b"SSH-2.0-OpenSSH_9.6\r\n", None, "neither TLS nor HTTP on port 443"),
        ("pypi.org", 443, b"get / HTTP/1.1\r\n\r\n", None, "neither TLS nor HTTP on port 443"),
        ("git.test", 22, b"", None, NeedMore(decide.SERVER_FIRST_WAIT)),
        ("git.test", 22, b"", "timeout", "pass"),  # the server speaks first (SSH, SMTP)
        ("git.test", 22, b"", "eof", "closed the tunnel before sending anything"),
        ("git.test", 22, b"SSH-2.0-OpenSSH_9.6\r\n", None, "pass"),  # any protocol on a listed port
        ("git.test", 22, b"PING", None, NeedMore(decide.SERVER_FIRST_WAIT)),
        ("git.test", 22, b"PING", "timeout", "pass"),
        ("git.test", 22, get("evil.example"), None, "HTTP Host evil.example differs"),  # HTTP is checked anywhere
        ("git.test", 22, hello("evil.example"), None, "TLS server name evil.example differs"),  # TLS too
    ],
    ids=_stable_id,
)
def test_first_bytes(host: str, port: int, buf: bytes, ended: decide.Ended, want: object) -> None:
    got = decide.first_bytes(buf, host, port, ended)
    if want == "pass":
        assert got == Checked(buf)
    elif isinstance(want, str):
        assert refused(got, want), got
    else:
        assert got == want


# -- a program that dialled a stub address ----------------------------------------------------

PYPI = dns.synthetic_address("pypi.org")


@pytest.mark.parametrize(
    ("address", "want"),
    [
        (str(PYPI), PYPI),
        ("127.77.0.1", dns.SYNTHETIC_NET[1]),
        ("10.0.0.1", "not an address the resolver gave"),
        ("127.0.0.1", "not an address the resolver gave"),
        ("pypi.org", Drop()),
        ("[::1]", Drop()),
    ],
)
def test_synthetic(address: str, want: object) -> None:
    got = decide.synthetic(address)
    assert refused(got, want) if isinstance(want, str) else got == want


@pytest.mark.parametrize(
    ("buf", "ended", "want"),
    [
        (hello("pypi.org"), None, Named("pypi.org", True)),
        (hello("PYPI.org"), None, Named("pypi.org", True)),
        (get("pypi.org"), None, Named("pypi.org", False)),
        (get("pypi.org:8080"), None, Named("pypi.org", False)),
        (hello("files.test"), None, f"{PYPI} is not the address the resolver gave for files.test"),
        (get("evil.example"), None, "is not the address the resolver gave for evil.example"),
        (get("[2001:db8::1]"), None, "is not the address the resolver gave for 2001:db8::1"),
        (hello(None), None, "must name it (SNI, no ECH)"),
        (with_ech(hello("pypi.org")), None, "must name it (SNI, no ECH)"),
        (get(None), None, "an HTTP request without a Host"),
        (get("pypi.org", "Host: evil.example"), None, "more than one Host header"),
        (b"SSH-2.0-x\r\n", None, "neither TLS nor HTTP"),
        (CUT, "eof", "cut short"),
        (CUT, None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),
        (b"", None, NeedMore(decide.FIRST_BYTES_TIMEOUT)),
        (b"", "eof", Drop()),
        (b"", "timeout", Drop()),
    ],
    ids=_stable_id,
)
def test_transparent(buf: bytes, ended: decide.Ended, want: object) -> None:
    got = decide.transparent(buf, PYPI, ended)
    assert refused(got, want) if isinstance(want, str) else got == want


@pytest.mark.parametrize(
    ("target", "hosts", "want"),
    [
        (b"/v1/x", [b"api.test"], True),
        (b"/v1/x", [b"API.test.:443"], True),
        (b"/v1/x", [b"api.test:8443"], False),  # another port of the same name
        (b"/v1/x", [b"other.test"], False),
        (b"/v1/x", [b"api.test", b"other.test"], False),  # two Host headers
        (b"/v1/x", [b"api.test", b"api.test"], False),
        (b"/v1/x", [b"user@api.test"], False),
        (b"/v1/x", [], True),  # HTTP/1.0: the connection's host
        (b"*", [b"api.test"], True),
        (b"https://api.test/v1/x", [b"api.test"], True),
        (b"https://api.test/v1/x", [b"other.test"], False),
        (b"https://user:pw@api.test/v1/x", [b"api.test"], True),
        (b"https://other.test/v1/x", [b"api.test"], False),  # a server routes by the URI
        (b"http://api.test/v1/x", [b"api.test"], False),  # http:// is port 80
        (b"http://api.test:443/v1/x", [b"api.test"], True),
        (b"https://[::1/x", [b"api.test"], False),
        (b"api.test:443", [b"other.test"], True),  # CONNECT's form names the host itself
        (b"other.test:443", [b"api.test"], False),
    ],
)
def test_same_host_on_an_intercepted_connection(target: bytes, hosts: list[bytes], want: bool) -> None:
    assert decide.same_host(target, hosts, "api.test", 443) is want


@pytest.mark.parametrize(
    ("first", "secret_host", "want"),
    [
        (hello("pypi.org"), True, "intercept"),
        (hello("pypi.org"), False, "splice"),
        (HEAD, True, "splice"),  # plain HTTP never carries a secret
        (b"", True, "splice"),
    ],
)
def test_carry(first: bytes, secret_host: bool, want: str) -> None:
    assert decide.carry(first, secret_host) == want


# -- the stub resolver -----------------------------------------------------------------------


def query(name: str, qtype: int = dns.TYPE_A, qclass: int = 1) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    return struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + labels + struct.pack(">HH", qtype, qclass)


@pytest.mark.parametrize(
    ("buf", "ended", "want"),
    [
        (b"\x00\x03abcdef", None, DnsMessage(b"abc", 5)),
        (b"\x00\x00", None, DnsMessage(b"", 2)),
        (b"\x00\x05abc", None, NeedMore(decide.DNS_QUERY_TIMEOUT)),
        (b"\x00", None, NeedMore(decide.DNS_QUERY_TIMEOUT)),
        (b"", None, NeedMore(None)),  # between queries: idle as long as it likes
        (b"\x00\x05abc", "eof", Drop()),
        (b"\x00\x05abc", "timeout", Drop()),
        (b"", "eof", Drop()),
    ],
)
def test_dns_message(buf: bytes, ended: decide.Ended, want: object) -> None:
    assert decide.dns_message(buf, ended) == want


@pytest.mark.parametrize(
    ("msg", "rcode", "logged"),
    [
        (query("pypi.org"), dns.RCODE_OK, ("pypi.org", "allowed", str(PYPI))),
        (query("PyPI.org"), dns.RCODE_OK, ("pypi.org", "allowed", str(PYPI))),
        (query("pypi.org", dns.TYPE_AAAA), dns.RCODE_OK, None),  # empty: IPv4 at once
        (query("api.example.com"), dns.RCODE_OK, ("api.example.com", "allowed", None)),
        (query("evil.example"), dns.RCODE_NXDOMAIN, ("evil.example", "denied", None)),
        (query("upload.example.com"), dns.RCODE_NXDOMAIN, ("upload.example.com", "denied", None)),
        (query("203.0.113.7"), dns.RCODE_NXDOMAIN, ("203.0.113.7", "denied", None)),  # not a name
        (query("pypi.org", qclass=3), dns.RCODE_NXDOMAIN, ("pypi.org", "denied", None)),
        (query("pypi.org")[:-3], dns.RCODE_FORMERR, None),
        (struct.pack(">HHHHHH", 0x1234, 0x8100, 1, 0, 0, 0) + b"\x00" * 5, dns.RCODE_FORMERR, None),  # an answer
        (b"\x12\x34" + b"\x00" * 4, None, None),  # no header to echo: an empty message
    ],
)
def test_dns_answer(msg: bytes, rcode: int | None, logged: tuple[str, str, str | None] | None) -> None:
    a = decide.dns_answer(POLICY, msg)
    if rcode is None:
        assert a.answer == b""
    else:
        assert a.answer[:2] == msg[:2] and a.answer[3] & 0x0F == rcode
    if logged is None:
        assert a.name is None
    else:
        name, verdict, address = logged
        assert (a.name, a.verdict) == (name, verdict)
        if address is not None:
            assert a.address == address


# -- the answer to a refusal -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("refuse", "policy", "status_line", "says"),
    [
        (Refuse(403, "denied", "not on the allowlist"), POLICY, b"Forbidden", ["refused", "Only the operator"]),
        (Refuse(429, "limited", "too many"), POLICY, b"Too Many Requests", ["refused (limit)"]),
        (Refuse(502, "error", "cannot connect"), POLICY, b"Bad Gateway", ["failed: cannot connect"]),
        (Refuse(400, "denied", "CONNECT needs host:port"), EgressPolicy(), b"Bad Request", ["(none: no egress)"]),
    ],
)
def test_refusal_response(refuse: Refuse, policy: EgressPolicy, status_line: bytes, says: list[str]) -> None:
    r = decide.refusal_response(refuse, "pypi.org", 443, policy)
    body = r.body.decode()
    headers = dict(r.headers)
    assert r.status == refuse.status and r.reason == status_line
    assert all(words in body for words in says), body
    assert ("Only the operator" in body) == (refuse.verdict == "denied")
    assert headers["Content-Length"] == str(len(r.body)) and headers["Connection"] == "close"
    assert headers["X-Loom-Egress"].startswith(f'{refuse.verdict}; host="pypi.org:443"')
    assert refuse.reason in body and ", ".join(policy.entries) in body


def test_a_reason_cannot_break_out_of_its_header() -> None:
    r = decide.refusal_response(Refuse(403, "denied", 'a "quoted" ' + "x" * 400), "h", 1, POLICY)
    value = dict(r.headers)["X-Loom-Egress"]
    assert value.count('"') == 6 and len(value) < 400


# -- every decision decides once the reading ended -----------------------------------------


STEPS = [
    decide.header,
    decide.dns_message,
    decide.client_hello,
    decide.http_host,
    lambda buf, ended: decide.first_bytes(buf, "pypi.org", 443, ended),
    lambda buf, ended: decide.first_bytes(buf, "git.test", 22, ended),
    lambda buf, ended: decide.transparent(buf, PYPI, ended),
]
PREFIXES = [b"", b"\x16\x03\x01", b"GET / HTTP/1.1\r\nHost: pypi.org", b"LOOM-EGRESS/1 ", hello("pypi.org")[:30]]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(PREFIXES),
    st.binary(max_size=300),
    st.sampled_from(["eof", "timeout"]),
    st.integers(0, len(STEPS) - 1),
)
def test_no_decision_asks_for_more_once_the_reading_ended(prefix: bytes, data: bytes, ended: str, i: int) -> None:
    got = STEPS[i](prefix + data, ended)  # type: ignore[operator]
    assert not isinstance(got, NeedMore)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PREFIXES), st.binary(max_size=300), st.integers(0, len(STEPS) - 1))
def test_no_decision_raises_on_any_bytes(prefix: bytes, data: bytes, i: int) -> None:
    STEPS[i](prefix + data, None)  # type: ignore[operator]


def test_an_agents_turn_report_is_told_apart_from_proxy_requests() -> None:
    from worker.egress.decide import BadRequest, Forward, Turn, proxy_request

    assert proxy_request(b"POST", b"/.loom/turn/agent-0a1b") == Turn("agent-0a1b")
    assert proxy_request(b"POST", b"http://127.0.0.1:3128/.loom/turn/agent-0a1b") == Turn("agent-0a1b")
    # not a turn: another method, a path that is not one, a process id that is not one, another host
    assert isinstance(proxy_request(b"GET", b"/.loom/turn/agent-0a1b"), BadRequest)
    assert isinstance(proxy_request(b"POST", b"/.loom/turn/../../etc"), BadRequest)
    assert isinstance(proxy_request(b"POST", b"/.loom/turn/a/b"), BadRequest)
    assert isinstance(proxy_request(b"POST", b"http://example.com/.loom/turn/agent-0a1b"), Forward)
