"""LOOM_EGRESS_HOSTS: names the egress gateway dials at a fixed address (worker/egress/overrides.py)."""

from __future__ import annotations

import asyncio
import ipaddress
import re

import pytest
from pydantic import ValidationError

from worker.egress.addresses import HostAddresses, parse_networks
from worker.egress.overrides import OverrideError, Target, lookup, parse_overrides
from worker.egress.upstream import Refused, Upstream
from worker.settings import Settings


def test_parse_entries() -> None:
    got = parse_overrides(" API.Anthropic.com=127.0.0.1:8443, api.openai.com:443=[::1]:9443 ,mirror.test=10.1.2.3")
    assert got == {
        ("api.anthropic.com", None): Target(ipaddress.ip_address("127.0.0.1"), 8443),
        ("api.openai.com", 443): Target(ipaddress.ip_address("::1"), 9443),
        ("mirror.test", None): Target(ipaddress.ip_address("10.1.2.3"), None),
    }
    assert parse_overrides(None) == {} and parse_overrides("") == {}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("api.anthropic.com", "expected host[:port]=address[:port]"),
        ("a=b=c", "expected host[:port]=address[:port]"),
        ("api.anthropic.com=mock.local:8443", "'mock.local' is not an IP address"),
        ("api.anthropic.com=127.0.0.1:99999", "port '99999' is not 1-65535"),
        ("api.anthropic.com:x=127.0.0.1", "port 'x' is not 1-65535"),
        ("127.0.0.2=127.0.0.1", "is not a host name"),
        ("*.example.com=127.0.0.1", "is not a host name"),
        ("a.test=127.0.0.1,A.test=127.0.0.2", "given twice"),
        ("a.test=[::1", "unclosed"),
    ],
)
def test_bad_entries_are_named(value: str, says: str) -> None:
    with pytest.raises(OverrideError, match=re.escape(says)) as e:
        parse_overrides(value)
    assert "LOOM_EGRESS_HOSTS entry" in str(e.value)


def test_lookup_prefers_the_exact_port() -> None:
    o = parse_overrides("a.test=127.0.0.1:1000,a.test:443=127.0.0.2")
    assert lookup(o, "A.TEST.", 443) == Target(ipaddress.ip_address("127.0.0.2"), None)
    assert lookup(o, "a.test", 80) == Target(ipaddress.ip_address("127.0.0.1"), 1000)
    assert lookup(o, "b.test", 443) is None


def test_settings_refuse_a_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_EGRESS_HOSTS", "api.anthropic.com=nowhere")
    with pytest.raises(ValidationError, match="not an IP address"):
        Settings()
    monkeypatch.setenv("LOOM_EGRESS_HOSTS", "api.anthropic.com=127.0.0.1:8443")
    assert Settings().egress_hosts == "api.anthropic.com=127.0.0.1:8443"


async def _never(host: str, port: int) -> list:  # the resolver must not be asked for an overridden name
    raise AssertionError(f"resolved {host}")


def test_upstream_dials_the_override_still_checked() -> None:
    overrides = parse_overrides("api.anthropic.com=127.0.0.1:8443")
    trusted = Upstream(HostAddresses(), trusted=parse_networks("127.0.0.0/8"), resolver=_never, overrides=overrides)
    assert asyncio.run(trusted.resolve("api.anthropic.com", 443)) == [ipaddress.ip_address("127.0.0.1")]
    assert trusted.dial_port("api.anthropic.com", 443) == 8443
    assert trusted.dial_port("pypi.org", 443) == 443
    # loopback is refused unless it is a trusted network: an override is no way around the address checks
    untrusted = Upstream(HostAddresses(), resolver=_never, overrides=overrides)
    with pytest.raises(Refused, match=re.escape("127.0.0.1")):
        asyncio.run(untrusted.resolve("api.anthropic.com", 443))
