"""The egress allowlist and the address policy, on names and addresses alone (no sockets)."""

from __future__ import annotations

import ipaddress

import pytest

from worker.egress.addresses import parse_networks, refusal
from worker.egress.policy import PRESETS, EgressPatternError, EgressPolicy, parse_allow_env


@pytest.mark.parametrize(
    "entry",
    [
        "*",
        "*.com",
        "*.co.uk",
        "*.github.io",
        "*.s3.amazonaws.com",
        "https://pypi.org",
        "http:pypi.org",
        "pypi.org/simple",
        "user@pypi.org",
        "a..b",
        ".pypi.org",
        "pypi.org.:x",
        "pypi.org:0",
        "pypi.org:70000",
        "pypi.org:*",
        "foo.*.com",
        "*foo.com",
        "",
        "   ",
        "!",
        "two words",
        "-bad.example.com",
        "2001:db8::1",  # an IPv6 literal needs brackets (a port would be ambiguous)
        "[2001:db8::1",
        "x" * 64 + ".com",
    ],
)
def test_patterns_that_would_open_too_much_or_are_not_hosts_are_refused_naming_the_entry(entry: str) -> None:
    with pytest.raises(EgressPatternError) as e:
        EgressPolicy.parse(["pypi.org", entry])
    assert e.value.entry == entry
    assert repr(entry) in str(e.value)


def test_exact_names_wildcards_ports_and_literals() -> None:
    p = EgressPolicy.parse(
        ["pypi.org", "*.example.com", "mirror.example.net:8443", "203.0.113.7", "[2001:db8::1]:443", "Bücher.de"]
    )
    assert p.check("pypi.org", 443).allowed and p.check("PyPI.org.", 80).allowed
    assert not p.check("pypi.org", 8443).allowed
    assert "port 8443" in p.check("pypi.org", 8443).reason
    assert not p.check("evil-pypi.org", 443).allowed and not p.check("pypi.org.evil.com", 443).allowed
    assert p.check("a.example.com", 443).allowed and p.check("a.b.example.com", 80).allowed
    assert not p.check("example.com", 443).allowed  # *.x is subdomains only
    assert not p.check("badexample.com", 443).allowed
    assert p.check("mirror.example.net", 8443).allowed and not p.check("mirror.example.net", 443).allowed
    assert p.check("203.0.113.7", 443).allowed and not p.check("203.0.113.8", 443).allowed
    assert p.check("2001:db8::1", 443).allowed and not p.check("2001:db8::1", 80).allowed
    assert p.check("xn--bcher-kva.de", 443).allowed  # IDNA
    unlisted_ip = p.check("198.51.100.1", 443)
    assert not unlisted_ip.allowed and "IP address" in unlisted_ip.reason
    assert p.check("nope.org", 443).reason == "not on the allowlist"


def test_denials_win_over_allows_and_presets_expand() -> None:
    p = EgressPolicy.parse(["pypi", "*.example.com", "!bad.example.com", "!files.pythonhosted.org"])
    assert p.check("pypi.org", 443).allowed
    assert not p.check("files.pythonhosted.org", 443).allowed
    assert "denied by" in p.check("files.pythonhosted.org", 443).reason
    assert not p.check("bad.example.com", 443).allowed and p.check("good.example.com", 443).allowed
    assert not p.knows_name("bad.example.com") and p.knows_name("good.example.com")
    for name, hosts in PRESETS.items():
        q = EgressPolicy.parse([name])
        assert all(q.check(h.removeprefix("*."), 443).allowed or h.startswith("*.") for h in hosts)
    assert EgressPolicy.parse(["npm"]).check("registry.npmjs.org", 443).allowed


def test_an_empty_or_deny_only_policy_allows_nothing() -> None:
    assert not EgressPolicy.parse([])
    assert not EgressPolicy.parse(["!pypi.org"])
    assert not EgressPolicy.parse([]).check("pypi.org", 443).allowed
    assert parse_allow_env(" pypi , npm,,") == ["pypi", "npm"] and parse_allow_env(None) == []


def test_stub_resolver_knows_only_allowed_names_not_literals() -> None:
    p = EgressPolicy.parse(["pypi.org:443", "*.npmjs.org", "203.0.113.7"])
    assert p.knows_name("pypi.org") and p.knows_name("registry.npmjs.org")
    assert not p.knows_name("npmjs.org") and not p.knows_name("example.com")
    assert not p.knows_name("203.0.113.7")


@pytest.mark.parametrize(
    ("addr", "words"),
    [
        ("127.0.0.1", "loopback"),
        ("127.77.1.2", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "CGNAT"),
        ("100.100.100.200", "CGNAT"),  # Alibaba's metadata service
        ("169.254.169.254", "metadata"),
        ("169.254.0.1", "link-local"),
        ("0.0.0.0", "this network"),
        ("224.0.0.251", "multicast"),
        ("239.255.255.250", "multicast"),
        ("255.255.255.255", "reserved"),
        ("240.0.0.1", "reserved"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "unique local"),  # AWS's IPv6 metadata address
        ("fc00::1", "unique local"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback, inside an IPv6"),
        ("::ffff:169.254.169.254", "metadata"),
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
        ("::127.0.0.1", "loopback"),  # IPv4-compatible
    ],
)
def test_addresses_never_dialled(addr: str, words: str) -> None:
    why = refusal(ipaddress.ip_address(addr))
    assert why is not None and words in why, why


@pytest.mark.parametrize("addr", ["203.0.113.80", "93.184.215.14", "151.101.0.223", "2606:4700::6810:84e5", "8.8.8.8"])
def test_public_and_documentation_addresses_may_be_dialled(addr: str) -> None:
    assert refusal(ipaddress.ip_address(addr)) is None


def test_the_hosts_own_addresses_and_the_trusted_override() -> None:
    own = {ipaddress.ip_address("198.51.100.9")}
    assert "own host" in (refusal(ipaddress.ip_address("198.51.100.9"), own) or "")
    trusted = parse_networks("127.0.0.1/32, 10.0.0.0/8")
    assert refusal(ipaddress.ip_address("127.0.0.1"), (), trusted) is None
    assert refusal(ipaddress.ip_address("10.9.9.9"), (), trusted) is None
    assert refusal(ipaddress.ip_address("127.0.0.2"), (), trusted) is not None
    with pytest.raises(ValueError, match="nope"):
        parse_networks("nope")


@pytest.mark.parametrize("entry", ["*", "*:443", "!*"])
def test_a_lone_wildcard_is_refused_as_allowing_every_host(entry: str) -> None:
    with pytest.raises(EgressPatternError, match="every host"):
        EgressPolicy.parse([entry])
