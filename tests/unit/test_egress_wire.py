"""The two wire formats the gateway reads from a sandbox without a library: the server name
of a TLS ClientHello (made by real TLS clients here) and the stub resolver's DNS."""

from __future__ import annotations

import functools
import ssl
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.egress import dns, tls


@functools.cache
def client_hello(server_name: str | None) -> bytes:
    """The first bytes Python's (OpenSSL's) TLS client sends for ``server_name``."""
    ctx = ssl.create_default_context()
    if server_name is None:
        ctx.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_the_server_name_of_a_real_client_hello() -> None:
    hello = client_hello("pypi.org")
    assert tls.record_length(hello[:5]) == len(hello)
    parsed = tls.parse_client_hello(hello)
    assert parsed.server_name == "pypi.org" and not parsed.ech
    assert tls.parse_client_hello(client_hello("Files.PythonHosted.org")).server_name == "files.pythonhosted.org"
    assert tls.parse_client_hello(client_hello(None)).server_name is None


def test_not_a_client_hello() -> None:
    with pytest.raises(tls.NotClientHello):
        tls.record_length(b"GET / HTTP/1.1\r\n")
    with pytest.raises(tls.NotClientHello):
        tls.parse_client_hello(client_hello("pypi.org")[:-10])  # cut short
    assert tls.record_length(b"\x16\x03") is None  # not enough to tell yet
    hello = bytearray(client_hello("pypi.org"))
    hello[5] = 2  # a ServerHello, not a ClientHello
    with pytest.raises(tls.NotClientHello):
        tls.parse_client_hello(bytes(hello))


def _with_extension(hello: bytes, ext_type: int, body: bytes) -> bytes:
    """``hello`` with one more extension appended (lengths fixed up)."""
    rec = bytearray(hello)
    ext = struct.pack(">HH", ext_type, len(body)) + body
    # record length, handshake length, extensions length: all grow by len(ext)
    struct.pack_into(">H", rec, 3, struct.unpack_from(">H", rec, 3)[0] + len(ext))
    hlen = int.from_bytes(rec[6:9], "big") + len(ext)
    rec[6:9] = hlen.to_bytes(3, "big")
    p = 5 + 4 + 2 + 32
    p += 1 + rec[p]
    p += 2 + struct.unpack_from(">H", rec, p)[0]
    p += 1 + rec[p]
    struct.pack_into(">H", rec, p, struct.unpack_from(">H", rec, p)[0] + len(ext))
    return bytes(rec) + ext


def test_encrypted_client_hello_and_repeated_names_are_seen() -> None:
    hello = client_hello("pypi.org")
    assert tls.parse_client_hello(_with_extension(hello, 0xFE0D, b"\x00" * 8)).ech
    with pytest.raises(tls.NotClientHello, match="repeated"):
        name = b"evil.example"
        sni = struct.pack(">HBH", len(name) + 3, 0, len(name)) + name
        tls.parse_client_hello(_with_extension(hello, 0, sni))


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=600), st.integers(min_value=0, max_value=400))
def test_the_parser_never_fails_other_than_by_refusing(noise: bytes, cut: int) -> None:
    hello = client_hello("pypi.org")
    data = bytearray(hello)
    for i, b in enumerate(noise[: len(data)]):
        if b % 7 == 0:
            data[(i * 31 + cut) % len(data)] = b
    try:
        tls.parse_client_hello(bytes(data[: max(0, len(data) - cut % 3)]))
    except tls.NotClientHello:
        pass


def _query(name: str, qtype: int = dns.TYPE_A, ident: int = 0x1234) -> bytes:
    q = struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack(">HH", qtype, 1)


def test_dns_answers_a_synthetic_loopback_address_or_nxdomain() -> None:
    q = dns.parse_query(_query("PyPI.org"))
    assert q.name == "pypi.org" and q.qtype == dns.TYPE_A and q.ident == 0x1234
    addr = dns.synthetic_address("pypi.org")
    assert addr in dns.SYNTHETIC_NET and addr == dns.synthetic_address("pypi.org")
    assert addr != dns.synthetic_address("files.pythonhosted.org")
    resp = dns.answer(q, dns.RCODE_OK, addr)
    ident, flags, qd, an, _ns, _ar = struct.unpack_from(">HHHHHH", resp)
    assert ident == 0x1234 and flags & 0x8000 and flags & 0xF == 0 and (qd, an) == (1, 1)
    assert resp.endswith(addr.packed)
    nx = dns.answer(q, dns.RCODE_NXDOMAIN)
    assert struct.unpack_from(">HH", nx)[1] & 0xF == dns.RCODE_NXDOMAIN
    assert struct.unpack_from(">HHHH", nx)[3] == 0


@pytest.mark.parametrize(
    "msg",
    [b"", b"\x00" * 11, _query("a.b")[:-3], struct.pack(">HHHHHH", 1, 0x8000, 1, 0, 0, 0) + b"\x00\x00\x01\x00\x01"],
)
def test_dns_refuses_malformed_queries(msg: bytes) -> None:
    with pytest.raises(dns.BadQuery):
        dns.parse_query(msg)
