"""What the gateway does with a connection, decided from bytes and policy alone.

Every decision of :mod:`worker.egress.handler` is a function here that takes what has
been read (and whether the reading ended: the client closed, or took too long) plus the
policy, and returns what to do: :class:`NeedMore` bytes (and how long to wait for them),
:class:`Refuse` (the status, the verdict and the reason the log, the ``X-Loom-Egress``
header and the body say), or the step's own answer (a :class:`Connect` target, the
checked first bytes of a tunnel, a DNS answer...). Nothing here touches a socket, a clock
or the event loop (h11's and mitmproxy's sans-I/O style): the handler is the loop that
reads, asks, and performs the answer, and the tests drive these functions by tables.

The decisions, in the order a connection meets them: :func:`header` (the relay's line: a
proxy client, a program that dialled a stub address, DNS); :func:`proxy_request` (CONNECT
or an absolute ``http://`` URI, else a 400); :func:`admit` (the allowlist, then the
workspace's limits); :func:`addresses` (every address the name resolves to); then
:func:`first_bytes` (a tunnel's TLS server name or HTTP Host against its name) or
:func:`synthetic` and :func:`transparent` (which name a stub address stands for);
:func:`carry` (intercept for secrets, or splice); :func:`same_host` (each request on an
intercepted connection); :func:`dns_message` and :func:`dns_answer`; and
:func:`refusal_response`, what a refused client is sent.

A decision never asks for more bytes once the reading ended (``ended`` set): it decides
on what it has.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from . import dns, tls
from .addresses import IPAddress, IPNetwork, refusal
from .authority import Authority, of_netloc, parse, parse_ip
from .policy import EgressPolicy

HEADER = b"LOOM-EGRESS/1 "
MAX_HEADER = 256  # the relay's header line
MAX_HEAD = 32 << 10  # an HTTP request head
FIRST_BYTES_TIMEOUT = 10.0  # how long a tunnel's client may take to start TLS / HTTP
SERVER_FIRST_WAIT = 1.0  # on other ports, a protocol whose server speaks first
DNS_QUERY_TIMEOUT = 5.0  # the rest of a DNS query once its length came
WEB_PORTS = (80, 443)

#: How the reading of more bytes ended: the client closed, or did not send in time.
Ended = Literal["eof", "timeout"] | None

_METHOD = re.compile(rb"^[A-Z]{3,10} ")
_METHOD_PREFIX = re.compile(rb"[A-Z]{0,10}\Z")  # what may still become one
_HOST_HEADER = re.compile(rb"\r\nhost:[ \t]*([^\r\n]*)", re.IGNORECASE)
_REASONS = {400: b"Bad Request", 403: b"Forbidden", 429: b"Too Many Requests", 502: b"Bad Gateway"}


# -- the decisions ------------------------------------------------------------------------


@dataclass(frozen=True)
class NeedMore:
    """Read more bytes, waiting at most ``timeout`` seconds (None: as long as it takes),
    then ask again."""

    timeout: float | None


@dataclass(frozen=True)
class Drop:
    """Close without a word or a log line (not a client of the gateway's protocol)."""


@dataclass(frozen=True)
class Refuse:
    """Refuse: before a tunnel is up, an HTTP ``status`` (see :func:`refusal_response`);
    after, a TLS alert or a close. Logged with ``verdict``, ``reason``, ``rule``, ``address``."""

    status: int
    verdict: str  # denied | limited | error
    reason: str
    rule: str | None = None
    address: str | None = None


class Denied(Exception):
    """A :class:`Refuse` raised through the handler's steps."""

    def __init__(self, refuse: Refuse) -> None:
        super().__init__(refuse.reason)
        self.refuse = refuse


def denied(reason: str, status: int = 403) -> Refuse:
    return Refuse(status, "denied", reason)


# -- the relay's header line --------------------------------------------------------------


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy client: ``CONNECT`` or an absolute-form request follows."""


@dataclass(frozen=True)
class Transparent:
    """A program that dialled ``address:port`` itself."""

    address: str
    port: int


@dataclass(frozen=True)
class Dns:
    """Length-prefixed DNS queries follow."""


@dataclass(frozen=True)
class Header:
    """The header line was read: ``way`` in, and ``size`` bytes of it to drop."""

    way: Proxy | Transparent | Dns
    size: int


def header(buf: bytes, ended: Ended = None) -> Header | NeedMore | Drop:
    """The relay's header line (``LOOM-EGRESS/1 proxy|tcp ADDR PORT|dns``)."""
    line, nl, _rest = buf.partition(b"\n")
    if not nl:
        return Drop() if len(buf) > MAX_HEADER or ended else NeedMore(FIRST_BYTES_TIMEOUT)
    if not line.startswith(HEADER):
        return Drop()
    words = line[len(HEADER) :].decode("ascii", "replace").split()
    size = len(line) + 1
    if words == ["proxy"]:
        return Header(Proxy(), size)
    if len(words) == 3 and words[0] == "tcp" and words[2].isascii() and words[2].isdigit():
        return Header(Transparent(words[1], int(words[2])), size)
    if words == ["dns"]:
        return Header(Dns(), size)
    return Drop()


# -- a proxy client's request -------------------------------------------------------------


@dataclass(frozen=True)
class Connect:
    """``CONNECT host:port``: a tunnel."""

    host: str
    port: int


@dataclass(frozen=True)
class Forward:
    """An absolute-form ``http://`` request: forwarded to ``host:port`` as ``path``."""

    host: str
    port: int
    path: bytes


@dataclass(frozen=True)
class Turn:
    """``POST /.loom/turn/<process id>`` sent to the proxy's own address (not a proxy
    request): an agent's HTTP hook reporting a tool call, relayed to that process's turn
    socket (:mod:`worker.agents.turns`) in the workspace's own socket directory, which
    the sandbox can reach anyway: no host is dialled, nothing leaves the machine."""

    process_id: str


#: The proxy's own address in the sandbox (sandbox.spec.EGRESS_PROXY_PORT), as a client
#: that proxies everything names it in an absolute-form :class:`Turn` request.
_PROXY_ITSELF = {("127.0.0.1", 3128), ("localhost", 3128)}
#: The origin-form path of :class:`Turn` requests, and what a process id may be.
TURN_PATH = re.compile(r"/\.loom/turn/([A-Za-z0-9][A-Za-z0-9._-]{0,63})")


@dataclass(frozen=True)
class BadRequest:
    """A request the proxy cannot serve, answered ``refuse``; ``host:port`` as far as
    it could be read, for the response and the log (``kind`` connect or http)."""

    refuse: Refuse
    host: str
    port: int
    kind: str


def proxy_request(method: bytes, target: bytes) -> Connect | Forward | Turn | BadRequest:
    """A proxy client's request line: CONNECT's authority form, or an absolute http:// URI
    (its user part dropped, its Host header not consulted: the URI names the server); or
    an agent's turn report, ``POST /.loom/turn/<process id>`` (:class:`Turn`)."""
    text = target.decode("ascii", "replace")
    turn = TURN_PATH.fullmatch(text)
    if turn is not None and method == b"POST":
        return Turn(turn.group(1))
    if method == b"CONNECT":
        a = parse(text)
        if a is None or a.port is None:
            return BadRequest(denied("CONNECT needs host:port", 400), text[:200], 0, "connect")
        return Connect(a.host, a.port)
    try:
        parts = urlsplit(text)
    except ValueError:
        return BadRequest(denied("not a URI", 400), text[:200], 0, "http")
    a = of_netloc(parts.netloc, parts.scheme) if parts.netloc else None
    if parts.scheme != "http" or a is None or a.port is None:
        if parts.scheme == "https":
            reason = "use CONNECT for https:// (set HTTPS_PROXY)"
        elif parts.scheme == "http" and parts.netloc:
            reason = f"{parts.netloc[:200]!r} is not a host[:port]"
        else:
            reason = "this is an HTTP proxy: send an absolute http:// URI or CONNECT"
        return BadRequest(denied(reason, 400), a.host if a else text[:200], (a.port or 0) if a else 0, "http")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    turn = TURN_PATH.fullmatch(parts.path or "")
    if turn is not None and method == b"POST" and (a.host, a.port) in _PROXY_ITSELF:
        return Turn(turn.group(1))  # the same report from a client that proxied it anyway
    return Forward(a.host, a.port, path.encode())


# -- admission ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """A workspace's limits as they stand when a connection asks to be admitted."""

    active: int  # connections open now, this one counted
    max_connections: int
    budget_left: bool  # the bytes-per-minute budget is not spent
    per_minute: int


@dataclass(frozen=True)
class Admit:
    """Dial: the allowlist ``rule`` that let it through."""

    rule: str | None


def admit(policy: EgressPolicy, host: str, port: int, limits: Limits) -> Admit | Refuse:
    """The allowlist (name and port), then the workspace's limits, for ``host:port``."""
    verdict = policy.check(host, port)
    if not verdict.allowed:
        return Refuse(403, "denied", verdict.reason, verdict.rule)
    if limits.active > limits.max_connections:
        return Refuse(429, "limited", f"too many connections at once (at most {limits.max_connections} per workspace)")
    if not limits.budget_left:
        return Refuse(429, "limited", f"over {limits.per_minute} bytes per minute for this workspace")
    return Admit(verdict.rule)


def addresses(
    host: str, addrs: list[IPAddress], own: Iterable[IPAddress] = (), trusted: Iterable[IPNetwork] = ()
) -> list[IPAddress] | Refuse:
    """The addresses ``host`` resolved to, when the gateway may dial every one of them;
    else refused naming the first it may not (:func:`~worker.egress.addresses.refusal`): a
    name with one bad address is refused whole (DNS rebinding, split horizon)."""
    if not addrs:
        return Refuse(502, "error", f"{host} has no address")
    own = frozenset(own)
    trusted = tuple(trusted)
    for addr in addrs:
        why = refusal(addr, own, trusted)
        if why is not None:
            return Refuse(403, "denied", f"{host} resolves to {addr}: {why}", address=str(addr))
    return addrs


# -- what the client sends first, in a tunnel or to a stub address -------------------------


def client_hello(buf: bytes, ended: Ended = None) -> tls.ClientHello | NeedMore | Refuse:
    """The TLS ClientHello ``buf`` starts with."""
    try:
        total = tls.record_length(buf[:5])
        if total is not None and len(buf) >= total:
            return tls.parse_client_hello(buf[:total])
    except tls.NotClientHello as e:
        return denied(f"not a TLS ClientHello ({e})")
    if ended == "eof":
        return denied("the TLS ClientHello was cut short")
    if ended == "timeout":
        return denied("the TLS ClientHello was not sent in time")
    return NeedMore(FIRST_BYTES_TIMEOUT)


@dataclass(frozen=True)
class HttpHost:
    """An HTTP request head was read: the host its Host header names (None: no Host, or
    not an authority)."""

    host: str | None


def http_host(buf: bytes, ended: Ended = None) -> HttpHost | NeedMore | Refuse:
    """The Host of the HTTP request head ``buf`` starts with (its only Host header)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD or ended:
            return denied("an HTTP request head that never ends")
        return NeedMore(FIRST_BYTES_TIMEOUT)
    found = _HOST_HEADER.findall(buf[: end + 2])
    if len(found) > 1:  # servers differ in which one they take (RFC 9112 3.2: a 400)
        return denied("an HTTP request with more than one Host header")
    a = parse(found[0].decode("ascii", "replace"), 80) if found else None
    return HttpHost(a.host if a else None)


def _looks_http(buf: bytes, ended: Ended) -> bool | None:
    """Whether ``buf`` starts an HTTP request (None: too few bytes yet to tell)."""
    if _METHOD.match(buf[:11]):
        return True
    if not ended and _METHOD_PREFIX.match(buf):
        return None
    return False


@dataclass(frozen=True)
class Checked:
    """The tunnel's first bytes passed: send them on, then carry the rest."""

    first: bytes


def first_bytes(buf: bytes, host: str, port: int, ended: Ended = None) -> Checked | NeedMore | Refuse:
    """What the client sends first in a tunnel to ``host:port``, checked against
    ``host``: a TLS ClientHello naming it (none: only for an IP literal), or an HTTP
    request for it; on another port than 80/443 (which the operator listed for it) any
    protocol, or nothing at all for a while (a protocol whose server speaks first)."""
    web = port in WEB_PORTS
    if not buf:
        if ended == "eof":
            return denied("the client closed the tunnel before sending anything")
        if ended == "timeout":
            return denied("no TLS or HTTP from the client") if web else Checked(b"")
        return NeedMore(FIRST_BYTES_TIMEOUT if web else SERVER_FIRST_WAIT)
    if buf[0] == tls.HANDSHAKE:
        hello = client_hello(buf, ended)
        if not isinstance(hello, tls.ClientHello):
            return hello
        if hello.ech:
            return denied("TLS encrypted_client_hello hides the server name; refused")
        if hello.server_name is None:
            if parse_ip(host) is None:
                return denied("the TLS ClientHello names no server (SNI)")
        elif (named := parse(hello.server_name)) is None or named.host != host:
            return denied(f"TLS server name {hello.server_name} differs from {host}")
        return Checked(buf)
    looks = _looks_http(buf, ended)
    if looks is None:
        return NeedMore(FIRST_BYTES_TIMEOUT if web else SERVER_FIRST_WAIT)
    if looks:
        head = http_host(buf, ended)
        if not isinstance(head, HttpHost):
            return head
        if head.host != host:
            return denied(f"HTTP Host {head.host or '(none)'} differs from {host}")
    elif web:
        return denied(f"neither TLS nor HTTP on port {port}")
    return Checked(buf)


@dataclass(frozen=True)
class Named:
    """A connection to a stub address names ``host``, the name the address was given for;
    ``tls``: it starts TLS (else an HTTP request)."""

    host: str
    tls: bool


def synthetic(address: str) -> IPAddress | Drop | Refuse:
    """The address a program dialled, when it is one the stub resolver gives."""
    try:
        dst = ipaddress.ip_address(address)
    except ValueError:
        return Drop()
    if dst not in dns.SYNTHETIC_NET:
        return denied("not an address the resolver gave")
    return dst


def transparent(buf: bytes, dst: IPAddress, ended: Ended = None) -> Named | NeedMore | Drop | Refuse:
    """Which name a connection to the stub address ``dst`` is for: its TLS server
    name, or its HTTP Host, which must be the name the resolver gave ``address`` for."""
    if not buf:
        return Drop() if ended else NeedMore(FIRST_BYTES_TIMEOUT)
    if buf[0] == tls.HANDSHAKE:
        hello = client_hello(buf, ended)
        if not isinstance(hello, tls.ClientHello):
            return hello
        if hello.server_name is None or hello.ech:
            return denied("a TLS connection to a resolved name must name it (SNI, no ECH)")
        a = parse(hello.server_name)
    else:
        looks = _looks_http(buf, ended)
        if looks is None:
            return NeedMore(FIRST_BYTES_TIMEOUT)
        if not looks:
            return denied("neither TLS nor HTTP")
        head = http_host(buf, ended)
        if not isinstance(head, HttpHost):
            return head
        if head.host is None:
            return denied("an HTTP request without a Host")
        a = Authority(head.host, None)
    if a is None or dns.synthetic_address(a.host) != dst:
        name = a.host if a else "a name that is not one"
        return denied(f"{dst} is not the address the resolver gave for {name}")
    return Named(a.host, buf[0] == tls.HANDSHAKE)


def same_host(target: bytes, hosts: list[bytes], host: str, port: int) -> bool:
    """Whether a request on an intercepted connection to ``host:port`` is for that host:
    its target when that names one (a server routes by an absolute URI, whatever Host
    says), and its only Host header (none: HTTP/1.0, the connection's host). A Host
    without a port is port 443: the connection is TLS."""
    here = Authority(host, port)
    if target.lower().startswith((b"http://", b"https://")):
        try:
            parts = urlsplit(target.decode("latin-1"))
        except ValueError:  # (an unclosed "[")
            return False
        if of_netloc(parts.netloc, parts.scheme) != here:
            return False
    elif not target.startswith(b"/") and target != b"*":
        return parse(target.decode("latin-1"), 443) == here  # (CONNECT's form)
    if len(hosts) > 1:
        return False  # servers differ in which one they take (RFC 9112 3.2: a 400)
    return parse(hosts[0].decode("latin-1"), 443) == here if hosts else True


def carry(first: bytes, secret_host: bool) -> Literal["intercept", "splice"]:
    """A checked tunnel is intercepted when it starts TLS to a host of the workspace's
    secrets (:mod:`worker.egress.intercept`), spliced as it is otherwise."""
    return "intercept" if secret_host and first[:1] == bytes([tls.HANDSHAKE]) else "splice"


# -- the stub resolver --------------------------------------------------------------------


@dataclass(frozen=True)
class DnsMessage:
    """One length-prefixed query, ``size`` bytes with its prefix."""

    query: bytes
    size: int


def dns_message(buf: bytes, ended: Ended = None) -> DnsMessage | NeedMore | Drop:
    """The next length-prefixed query in ``buf``."""
    if len(buf) >= 2:
        n = int.from_bytes(buf[:2], "big")
        if len(buf) >= 2 + n:
            return DnsMessage(buf[2 : 2 + n], 2 + n)
    if ended:
        return Drop()
    return NeedMore(DNS_QUERY_TIMEOUT if buf else None)  # (between queries, idle for as long as it likes)


@dataclass(frozen=True)
class DnsAnswer:
    """The answer to send, and what to log of it (None: nothing)."""

    answer: bytes
    name: str | None = None
    verdict: str = "denied"
    reason: str | None = None
    address: str | None = None


def dns_answer(policy: EgressPolicy, msg: bytes) -> DnsAnswer:
    """The stub resolver's answer to ``msg`` (see :mod:`worker.egress.dns`)."""
    try:
        q = dns.parse_query(msg)
    except dns.BadQuery:
        return DnsAnswer(dns.error_answer(msg, dns.RCODE_FORMERR) or b"")
    if q.qclass != 1 or not policy.knows_name(q.name):
        return DnsAnswer(dns.answer(q, dns.RCODE_NXDOMAIN), q.name, reason="not on the allowlist: no such name here")
    if q.qtype == dns.TYPE_A:
        addr = dns.synthetic_address(q.name)
        return DnsAnswer(dns.answer(q, dns.RCODE_OK, addr), q.name, "allowed", "allowed", str(addr))
    return DnsAnswer(dns.answer(q, dns.RCODE_OK))


def framed(msg: bytes) -> bytes:
    return len(msg).to_bytes(2, "big") + msg


# -- the response to a refusal -------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    status: int
    reason: bytes
    headers: list[tuple[str, str]]
    body: bytes


def refusal_response(refuse: Refuse, host: str, port: int, policy: EgressPolicy) -> Response:
    """The HTTP answer to a refused request: the status, an ``X-Loom-Egress`` header a
    program can read, and a body that says why and what the allowlist is."""
    allowlist = ", ".join(policy.entries) or "(none: no egress)"
    what = {"denied": "refused", "limited": "refused (limit)", "error": "failed"}.get(refuse.verdict, refuse.verdict)
    body = (
        f"loom-worker egress gateway: the connection to {host}:{port} was {what}: {refuse.reason}.\n"
        f"This workspace's egress allowlist: {allowlist}.\n"
        + (
            "Only the operator can change it (loom-worker workspace set --egress ...).\n"
            if refuse.verdict == "denied"
            else ""
        )
    ).encode()
    reason = refuse.reason.replace('"', "'")[:300]
    headers = [
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        ("X-Loom-Egress", f'{refuse.verdict}; host="{host}:{port}"; policy="workspace allowlist"; reason="{reason}"'),
    ]
    return Response(refuse.status, _REASONS.get(refuse.status, b""), headers, body)
