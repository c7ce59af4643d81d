"""The sandbox's stub resolver, answered on the host.

A sandbox has no resolver of its own: its ``/etc/resolv.conf`` names 127.0.0.1, where the
agent relays each query, unread, to the gateway, which answers it here, **without asking
any real DNS server** (so nothing can leak out through lookups):

* a name the workspace's allowlist names (:meth:`EgressPolicy.knows_name`): ``A`` is a
  synthetic loopback address (:func:`synthetic_address`, 127.77.x.y, the same for the
  same name everywhere), ``AAAA`` and every other type an empty NOERROR answer (so a
  client falls back to IPv4 at once);
* any other name: NXDOMAIN, at once.

A tool that resolves before it uses the proxy (Node, Go, some WebSocket clients) so gets
an address and goes on through the proxy with the name; one that ignores the proxy and
connects to the address reaches the agent's listener there, whose connection the gateway
checks like any other (the name comes from TLS SNI or the HTTP Host, and must map to the
address the client dialled).

Written here: a query is one question in a small fixed layout (RFC 1035 4.1), and the
answers are made up rather than resolved, so a DNS library would add nothing.
"""

from __future__ import annotations

import hashlib
import ipaddress
import struct
from dataclasses import dataclass

#: The synthetic answers' network (inside 127.0.0.0/8, which is all loopback on Linux).
SYNTHETIC_NET = ipaddress.IPv4Network("127.77.0.0/16")
TTL = 60
TYPE_A = 1
TYPE_AAAA = 28
RCODE_OK = 0
RCODE_FORMERR = 1
RCODE_NXDOMAIN = 3
RCODE_NOTIMP = 4
#: The largest query accepted (a name is at most 255 bytes).
MAX_QUERY = 512


class BadQuery(ValueError):
    """Not a DNS query this stub can answer (malformed, or not one question)."""


def synthetic_address(name: str) -> ipaddress.IPv4Address:
    """The loopback address a sandbox gets for ``name``: a hash, so every gateway process
    gives the same answer without sharing state (x.y never 0 or 255)."""
    h = hashlib.sha256(name.encode()).digest()
    return ipaddress.IPv4Address(int(SYNTHETIC_NET.network_address) | ((h[0] % 254 + 1) << 8) | (h[1] % 254 + 1))


@dataclass(frozen=True)
class Query:
    ident: int
    flags: int
    name: str  # lower case, no trailing dot
    qtype: int
    qclass: int
    question: bytes  # the question section as sent, echoed in the answer


def parse_query(msg: bytes) -> Query:
    """Raises BadQuery."""
    if len(msg) < 12 or len(msg) > MAX_QUERY:
        raise BadQuery("bad length")
    ident, flags, qd, an, ns, _ar = struct.unpack_from(">HHHHHH", msg, 0)
    if flags & 0x8000 or qd != 1 or an or ns:
        raise BadQuery("not a query with one question")
    p = 12
    labels: list[str] = []
    while True:
        if p >= len(msg):
            raise BadQuery("truncated name")
        n = msg[p]
        p += 1
        if n == 0:
            break
        if n & 0xC0:
            raise BadQuery("compressed name in a question")
        label = msg[p : p + n]
        if len(label) != n:
            raise BadQuery("truncated label")
        try:
            labels.append(label.decode("ascii").lower())
        except UnicodeDecodeError:
            raise BadQuery("a name that is not ASCII") from None
        p += n
    if p + 4 > len(msg):
        raise BadQuery("truncated question")
    qtype, qclass = struct.unpack_from(">HH", msg, p)
    return Query(ident, flags, ".".join(labels), qtype, qclass, msg[12 : p + 4])


def answer(q: Query, rcode: int, address: ipaddress.IPv4Address | None = None) -> bytes:
    """The response to ``q``: ``rcode``, and one A record of ``address`` if given."""
    rd = q.flags & 0x0100
    flags = 0x8000 | 0x0400 | rd | 0x0080 | rcode  # response, authoritative, RD echoed, RA
    ancount = 1 if address is not None else 0
    out = struct.pack(">HHHHHH", q.ident, flags, 1, ancount, 0, 0) + q.question
    if address is not None:
        out += struct.pack(">HHHIH", 0xC00C, TYPE_A, 1, TTL, 4) + address.packed
    return out


def error_answer(msg: bytes, rcode: int) -> bytes | None:
    """A bare response with ``rcode`` echoing the id of whatever ``msg`` was (None when
    it has no header to echo)."""
    if len(msg) < 12:
        return None
    ident, flags = struct.unpack_from(">HH", msg, 0)
    return struct.pack(">HHHHHH", ident, 0x8000 | (flags & 0x0100) | 0x0080 | rcode, 0, 0, 0, 0)
