"""The authority parser (``host[:port]``, ``[v6]:port``) every part of the gateway uses: a
CONNECT target, a Host header, an absolute URI's netloc, an allowlist entry."""

from __future__ import annotations

import pytest

from worker.auth import is_loopback_host, same_origin
from worker.egress.authority import Authority, AuthorityError, Split, of_netloc, parse, port_number, split
from worker.egress.rewrite import authority

A = Authority


@pytest.mark.parametrize(
    ("text", "default", "want"),
    [
        # names
        ("pypi.org:443", None, A("pypi.org", 443)),
        ("pypi.org", 80, A("pypi.org", 80)),
        ("pypi.org", None, A("pypi.org", None)),
        ("PyPI.Org.:443", None, A("pypi.org", 443)),
        ("  pypi.org:443 \r\n", None, A("pypi.org", 443)),
        ("files_host.example:8080", None, A("files_host.example", 8080)),
        # IDNA
        ("bücher.example:443", None, A("xn--bcher-kva.example", 443)),
        ("xn--bcher-kva.example:443", None, A("xn--bcher-kva.example", 443)),
        ("BÜCHER.example", 443, A("xn--bcher-kva.example", 443)),
        ("a" * 64 + "é.example:443", None, None),  # IDNA cannot encode a label that long
        # ports
        ("pypi.org:1", None, A("pypi.org", 1)),
        ("pypi.org:65535", None, A("pypi.org", 65535)),
        ("pypi.org:0", None, None),
        ("pypi.org:65536", None, None),
        ("pypi.org:", None, None),
        ("pypi.org:-1", None, None),
        ("pypi.org:+443", None, None),
        ("pypi.org:٤٤٣", None, None),  # digits, but not ASCII ones
        ("pypi.org:44 3", None, None),
        ("pypi.org:http", None, None),
        # IP literals
        ("203.0.113.7:443", None, A("203.0.113.7", 443)),
        ("[2001:db8::1]:443", None, A("2001:db8::1", 443)),
        ("[2001:DB8:0:0::1]:443", None, A("2001:db8::1", 443)),  # one spelling per address
        ("[::1]", 443, A("::1", 443)),
        ("[::ffff:127.0.0.1]:80", None, A("::ffff:7f00:1", 80)),
        ("2001:db8::1", 443, None),  # an IPv6 literal needs its brackets
        ("2001:db8::1:443", None, None),
        ("[2001:db8::1", None, None),
        ("[2001:db8::1]443", None, None),
        ("[2001:db8::1]:", None, None),
        ("[pypi.org]:443", None, None),  # brackets hold an IPv6 literal only
        ("[203.0.113.7]:443", None, None),
        ("[fe80::1%eth0]:443", None, None),  # a zone is not the gateway's to follow
        # what is not an authority
        ("", 80, None),
        (":443", None, None),
        ("[]:443", None, None),
        ("user@pypi.org:443", None, None),
        ("user:pw@pypi.org:443", None, None),
        ("evil.example@pypi.org", 80, None),
        ("pypi.org/simple", 80, None),
        ("pypi.org:443/simple", None, None),
        ("pypi org:443", None, None),
        ("pypi.org\r\nX-Evil: 1", 80, None),
        ("*.pypi.org:443", None, None),
    ],
)
def test_parse(text: str, default: int | None, want: Authority | None) -> None:
    assert parse(text, default) == want


@pytest.mark.parametrize(
    ("netloc", "scheme", "want"),
    [
        ("pypi.org", "http", A("pypi.org", 80)),
        ("pypi.org", "HTTPS", A("pypi.org", 443)),
        ("pypi.org", "wss", A("pypi.org", 443)),
        ("pypi.org:8080", "http", A("pypi.org", 8080)),
        ("user:pw@pypi.org", "http", A("pypi.org", 80)),  # the user part is dropped
        ("a@b@pypi.org:81", "http", A("pypi.org", 81)),
        ("[2001:db8::1]:8080", "http", A("2001:db8::1", 8080)),
        ("pypi.org", "ftp", A("pypi.org", None)),
        ("pypi.org:0", "http", None),
        ("", "http", None),
    ],
)
def test_of_netloc(netloc: str, scheme: str, want: Authority | None) -> None:
    assert of_netloc(netloc, scheme) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("pypi.org", Split("pypi.org", None, False)),
        ("pypi.org:8443", Split("pypi.org", "8443", False)),
        ("[2001:db8::1]:443", Split("2001:db8::1", "443", True)),
        ("[2001:db8::1]", Split("2001:db8::1", None, True)),
        ("2001:db8::1", Split("2001:db8::1", None, False)),  # all host: the caller refuses it its way
        ("*.example.com:8443", Split("*.example.com", "8443", False)),
    ],
)
def test_split(text: str, want: Split) -> None:
    assert split(text) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [("[2001:db8::1", "closing ]"), ("[2001:db8::1]x", "only :PORT"), ("[::1]:x", None)],
)
def test_split_says_what_is_wrong(text: str, message: str | None) -> None:
    if message is None:
        s = split(text)
        assert s.port is not None
        with pytest.raises(AuthorityError, match="is not a port"):
            port_number(s.port)
        return
    with pytest.raises(AuthorityError, match=message.replace("[", r"\[")):
        split(text)


def test_authority_str_puts_brackets_back() -> None:
    assert str(A("2001:db8::1", 443)) == "[2001:db8::1]:443"
    assert str(A("pypi.org", None)) == "pypi.org"
    assert parse(str(A("2001:db8::1", 443))) == A("2001:db8::1", 443)


def test_the_intercepting_sessions_reading_is_the_same_parser() -> None:
    assert authority("API.example.com.:8443", 443) == ("api.example.com", 8443)
    assert authority("bücher.example", 443) == ("xn--bcher-kva.example", 443)
    assert authority("user@api.example.com", 443) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("LOCALHOST:8000", True),
        ("localhost", True),
        (None, True),  # an HTTP/1.0 client on the socket itself
        ("::1", False),  # not an authority (brackets missing)
        ("evil.example", False),
        ("localhost@evil.example", False),
        ("localhost.evil.example:8000", False),
    ],
)
def test_the_services_host_check_reads_hosts_the_same_way(host: str | None, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_two_unreadable_authorities_are_not_one_origin() -> None:
    assert same_origin("http://127.0.0.1:8000", None, "127.0.0.1:8000", "http")
    assert same_origin("https://[::1]", None, "[::1]:443", "http")
    assert not same_origin("http://a@b@", None, "x y", "http")
    assert not same_origin("http://evil.example:8000", None, "127.0.0.1:8000", "http")
