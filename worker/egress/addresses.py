"""Which addresses the egress gateway never connects to, whatever name led there.

The gateway resolves every allowed name itself and checks **every** address the name
resolves to before it connects (a name with one bad address is refused whole: that is
what DNS-rebinding and split-horizon tricks look like), then connects to an address it
checked, never resolving again.

Refused: loopback, "this network", private (RFC 1918), shared/CGNAT (100.64.0.0/10),
link-local (169.254.0.0/16, where cloud metadata lives), IETF protocol assignments,
multicast, reserved and broadcast; in IPv6 the same kinds (loopback, unspecified,
link-local, site-local, unique-local fc00::/7, multicast) and the IPv4 address inside
IPv4-mapped, NAT64, 6to4 and Teredo forms; and the addresses of this host's own
interfaces. The documentation ranges (192.0.2.0/24, ...) are not refused: they are not
anyone's network, and some test networks (this project's CI among them) use them.

``trusted`` networks (``LOOM_EGRESS_TRUSTED_NETWORKS``, an operator's setting for an
internal mirror or a local test server) skip these checks; the allowlist still applies.
"""

from __future__ import annotations

import ipaddress
import itertools
import socket
import time
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4_REFUSED: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking network"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
)
_V6_REFUSED: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("fc00::/7", "unique local (private)"),
    ("ff00::/8", "multicast"),
    ("100::/64", "discard-only"),
)
_REFUSED = [(ipaddress.ip_network(n), why) for n, why in _V4_REFUSED + _V6_REFUSED]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def _embedded_v4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]  # the client's address: where the packets end up
    if addr in _NAT64 or addr in _NAT64_LOCAL:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if int(addr) >> 32 == 0 and int(addr) > 1:  # deprecated IPv4-compatible ::a.b.c.d
        return ipaddress.IPv4Address(int(addr))
    return None


def refusal(addr: IPAddress, own: Iterable[IPAddress] = (), trusted: Iterable[IPNetwork] = ()) -> str | None:
    """Why the gateway must not connect to ``addr`` (None: it may)."""
    if any(addr in net for net in trusted):
        return None
    for net, why in _REFUSED:
        if addr.version == net.version and addr in net:
            return why
    if addr in set(own):
        return "an address of the worker's own host"
    if isinstance(addr, ipaddress.IPv6Address):
        inner = _embedded_v4(addr)
        if inner is not None:
            inner_why = refusal(inner, own, trusted)
            if inner_why is not None:
                return f"{inner_why}, inside an IPv6 address"
    return None


def _own_v4() -> set[IPAddress]:
    # /proc/net/fib_trie lists every local address as "/32 host LOCAL" after its address.
    out: set[IPAddress] = set()
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for prev, line in itertools.pairwise(lines):
        if "/32 host LOCAL" in line:
            parts = prev.split()
            if parts:
                try:
                    out.add(ipaddress.IPv4Address(parts[-1]))
                except ValueError:
                    pass
    return out


def _own_v6() -> set[IPAddress]:
    out: set[IPAddress] = set()
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                hexaddr = line.split()[0]
                out.add(ipaddress.IPv6Address(int(hexaddr, 16)))
    except (OSError, ValueError, IndexError):
        pass
    return out


class HostAddresses:
    """The addresses of this host's interfaces, re-read at most every ``ttl`` seconds
    (interfaces come and go: Docker networks, VPNs)."""

    def __init__(self, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._at = -1e9
        self._addrs: frozenset[IPAddress] = frozenset()

    def get(self) -> frozenset[IPAddress]:
        now = time.monotonic()
        if now - self._at > self.ttl:
            addrs = _own_v4() | _own_v6()
            try:
                for info in socket.getaddrinfo(socket.gethostname(), None):
                    addrs.add(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
            except (OSError, ValueError):
                pass
            self._addrs = frozenset(addrs)
            self._at = now
        return self._addrs


def parse_networks(value: str | Iterable[str] | None) -> tuple[IPNetwork, ...]:
    """``"127.0.0.1/32, 10.1.0.0/16"`` -> networks. Raises ValueError naming the entry."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[IPNetwork] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError as e:
            raise ValueError(f"{item!r} is not an address or network: {e}") from None
    return tuple(out)
