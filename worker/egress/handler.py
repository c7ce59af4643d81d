# long module: one connection's state machine (proxy request, CONNECT, transparent port, DNS), whose
# steps share the connection's buffered reads and its log; split by step, each piece would reach back into it.
"""One connection from a sandbox to its gateway socket, from first byte to log line.

The agent in the sandbox relays, unread, what a program there sends to its loopback
listeners, starting each relayed connection with one header line (any sandbox program may
also connect to the socket itself and send one; nothing is trusted from it):

``LOOM-EGRESS/1 proxy``          an HTTP proxy client (``HTTP_PROXY`` at 127.0.0.1:3128):
                                 ``CONNECT host:port`` or a plain request ``GET http://...``
``LOOM-EGRESS/1 tcp ADDR PORT``  a program that dialled ADDR:PORT itself (an address the
                                 stub resolver gave): the name comes from TLS SNI or HTTP Host
``LOOM-EGRESS/1 dns``            length-prefixed DNS queries (:mod:`worker.egress.dns`)

Whatever the way in, the checks are the same and all of them happen here, on the host:
the allowlist (name and port), then the TLS server name (or HTTP Host) against that name,
then every address the gateway itself resolves the name to. A refusal before the tunnel
is up is an HTTP 403 (429 for a limit, 502 for a destination that failed) with an
``X-Loom-Egress`` header and a body saying why, so the model can tell "not allowed" from
"network down"; one after (a wrong SNI) is a TLS access_denied alert.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

import h11

from . import dns, tls
from .addresses import IPAddress
from .log import EgressRecord
from .policy import EgressPolicy, normalize_host, parse_ip
from .pump import Pump, RateBudget
from .rewrite import BodyScan, placeholders_in, stray_uses
from .upstream import Refused, Unreachable, Upstream

HEADER = b"LOOM-EGRESS/1 "
MAX_HEADER = 256
MAX_HEAD = 32 << 10  # an HTTP request head
FIRST_BYTES_TIMEOUT = 10.0  # how long a tunnel's client may take to start TLS / HTTP
SERVER_FIRST_WAIT = 1.0  # on other ports, a protocol whose server speaks first
_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"trailer", b"upgrade"}
_HOST_HEADER = re.compile(rb"\r\nhost:[ \t]*([^\r\n]*)", re.IGNORECASE)
_METHOD = re.compile(rb"^[A-Z]{3,10} ")


@dataclass
class Served:
    """What the gateway knows of one workspace while it serves it."""

    root: Path
    label: str  # the workspace as logs name it
    policy: Callable[[], EgressPolicy | None]
    budget: RateBudget
    max_connections: int
    record: Callable[[EgressRecord], None]
    active: int = 0
    #: The TLS interceptor for the hosts of the workspace's secrets
    #: (:class:`worker.egress.intercept.Interceptor`); None: every tunnel is spliced.
    interceptor: Any = None


class _Denied(Exception):
    def __init__(self, status: int, verdict: str, reason: str, rule: str | None = None, address: str | None = None):
        super().__init__(reason)
        self.status, self.verdict, self.reason, self.rule, self.address = status, verdict, reason, rule, address


class Connection:
    """Serves one accepted socket (non-blocking) until it closes."""

    def __init__(self, served: Served, sock: socket.socket, upstream: Upstream) -> None:
        self.served = served
        self.sock = sock
        self.upstream = upstream
        self.loop = asyncio.get_running_loop()
        self.buf = bytearray()

    # -- reading ---------------------------------------------------------------------

    async def _more(self, timeout: float | None = None) -> bool:
        data = await asyncio.wait_for(self.loop.sock_recv(self.sock, 65536), timeout)
        if not data:
            return False
        self.buf += data
        return True

    async def _line(self) -> bytes:
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_HEADER or not await self._more(FIRST_BYTES_TIMEOUT):
                raise ValueError("no header line")
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return line

    async def _exact(self, n: int, timeout: float | None = None) -> bytes:
        while len(self.buf) < n:
            if not await self._more(timeout):
                raise EOFError
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    # -- entry -----------------------------------------------------------------------

    async def run(self) -> None:
        try:
            line = await self._line()
            if not line.startswith(HEADER):
                return
            words = line[len(HEADER) :].decode("ascii", "replace").split()
            if words == ["proxy"]:
                await self._proxy()
            elif len(words) == 3 and words[0] == "tcp" and words[2].isdigit():
                await self._transparent(words[1], int(words[2]))
            elif words == ["dns"]:
                await self._dns()
        except (OSError, EOFError, ValueError, TimeoutError, h11.ProtocolError):
            pass
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()

    def _policy(self) -> EgressPolicy:
        return self.served.policy() or EgressPolicy()

    def _log(self, kind: str, host: str, port: int, started: float, **kw: object) -> None:
        rec = EgressRecord(workspace=self.served.label, kind=kind, host=host, port=port, **kw)  # type: ignore[arg-type]
        rec.duration_ms = round((time.perf_counter() - started) * 1000, 3)
        self.served.record(rec)

    def _log_denied(self, kind: str, host: str, port: int, started: float, d: _Denied, rule: str | None) -> None:
        """Log a refusal: the rule is the denial's, else the allow rule it passed first."""
        self._log(kind, host, port, started, verdict=d.verdict, reason=d.reason, rule=d.rule or rule, address=d.address)

    # -- refusals --------------------------------------------------------------------

    async def _refuse_http(self, conn: h11.Connection, host: str, port: int, d: _Denied) -> None:
        policy = ", ".join(self._policy().entries) or "(none: no egress)"
        what = {"denied": "refused", "limited": "refused (limit)", "error": "failed"}.get(d.verdict, d.verdict)
        body = (
            f"loom-worker egress gateway: the connection to {host}:{port} was {what}: {d.reason}.\n"
            f"This workspace's egress allowlist: {policy}.\n"
            + (
                "Only the operator can change it (loom-worker workspace set --egress ...).\n"
                if d.verdict == "denied"
                else ""
            )
        ).encode()
        reason = d.reason.replace('"', "'")[:300]
        headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            ("X-Loom-Egress", f'{d.verdict}; host="{host}:{port}"; policy="workspace allowlist"; reason="{reason}"'),
        ]
        with contextlib.suppress(h11.LocalProtocolError, OSError):
            out = conn.send(h11.Response(status_code=d.status, headers=headers, reason=_REASONS.get(d.status, b"")))
            out = (out or b"") + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            await self.loop.sock_sendall(self.sock, out)

    def _admit(self, host: str, port: int) -> str | None:
        """Policy and limits for a new connection to ``host:port``; returns the rule.
        Raises _Denied."""
        verdict = self._policy().check(host, port)
        if not verdict.allowed:
            raise _Denied(403, "denied", verdict.reason, verdict.rule)
        if self.served.active > self.served.max_connections:
            raise _Denied(
                429, "limited", f"too many connections at once (at most {self.served.max_connections} per workspace)"
            )
        if not self.served.budget.available():
            raise _Denied(429, "limited", f"over {self.served.budget.per_minute} bytes per minute for this workspace")
        return verdict.rule

    async def _dial(self, host: str, port: int) -> tuple[socket.socket, IPAddress]:
        """Raises _Denied (403 address refused, 502 unreachable)."""
        try:
            addrs = await self.upstream.resolve(host, port)
            return await self.upstream.connect(addrs, port)
        except Refused as e:
            raise _Denied(403, "denied", e.reason, address=e.address) from None
        except Unreachable as e:
            raise _Denied(502, "error", e.reason, address=e.address) from None

    # -- proxy: CONNECT and plain HTTP -----------------------------------------------------

    async def _next_event(self, conn: h11.Connection) -> object:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if len(self.buf) > MAX_HEAD:
                    raise ValueError("request head too large")
                data = await asyncio.wait_for(self.loop.sock_recv(self.sock, 65536), FIRST_BYTES_TIMEOUT)
                conn.receive_data(data)
                continue
            return event

    async def _proxy(self) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        if self.buf:  # (h11 takes b"" for the end of the stream)
            conn.receive_data(bytes(self.buf))
        self.buf.clear()
        event = await self._next_event(conn)
        if not isinstance(event, h11.Request):
            return
        started = time.perf_counter()
        target = event.target.decode("ascii", "replace")
        if event.method == b"CONNECT":
            host, port = _authority(target, None)
            if host is None or port is None:
                await self._refuse_http(conn, target, 0, _Denied(400, "denied", "CONNECT needs host:port"))
                return self._log("connect", target, 0, started, reason="CONNECT needs host:port")
            await self._connect(conn, host, port, started)
            return
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            reason = (
                "use CONNECT for https:// (set HTTPS_PROXY)"
                if parts.scheme == "https"
                else "this is an HTTP proxy: send an absolute http:// URI or CONNECT"
            )
            host = parts.hostname or ""
            try:
                port = parts.port or (443 if parts.scheme == "https" else 0)
            except ValueError:
                port = 0
            await self._refuse_http(conn, host or target, port, _Denied(400, "denied", reason))
            return self._log("http", host or target[:200], port, started, reason=reason)
        try:
            port = parts.port or 80
        except ValueError:
            port = 0
        host = normalize_host(parts.hostname)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        await self._forward_http(conn, event, host, port, path.encode(), started, kind="http")

    async def _connect(self, conn: h11.Connection, host: str, port: int, started: float) -> None:
        rule: str | None = None
        try:
            rule = self._admit(host, port)
            upstream, addr = await self._dial(host, port)
        except _Denied as d:
            await self._refuse_http(conn, host, port, d)
            return self._log_denied("connect", host, port, started, d, rule)
        self.served.active += 1
        try:
            # Written by hand: h11 would add "Connection: close" when the client sent it
            # (npm does), and some proxy clients then give up on the tunnel.
            await self.loop.sock_sendall(self.sock, b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.buf = bytearray(conn.trailing_data[0])
            try:
                first = await self._first_bytes(host, port)
            except _Denied as d:
                with contextlib.suppress(OSError):
                    if self.buf[:1] == bytes([tls.HANDSHAKE]):
                        await self.loop.sock_sendall(self.sock, tls.ACCESS_DENIED_ALERT)
                upstream.close()
                return self._log(
                    "connect", host, port, started, verdict="denied", reason=d.reason, rule=rule, address=str(addr)
                )
            except (OSError, EOFError) as e:
                upstream.close()
                return self._log(
                    "connect",
                    host,
                    port,
                    started,
                    verdict="error",
                    reason=f"the client failed: {e}",
                    rule=rule,
                    address=str(addr),
                )
            await self._carry(upstream, first, host, port, started, "connect", rule, addr)
        finally:
            self.served.active -= 1

    async def _first_bytes(self, host: str, port: int) -> bytes:
        """What the client sends first in a tunnel, checked against ``host``: a TLS
        ClientHello naming it, or an HTTP request for it; on another port than 80/443
        (which the operator listed for it) any protocol. Raises _Denied."""
        web = port in (80, 443)
        try:
            while not self.buf:
                if not await self._more(FIRST_BYTES_TIMEOUT if web else SERVER_FIRST_WAIT):
                    raise _Denied(403, "denied", "the client closed the tunnel before sending anything")
        except TimeoutError:
            if web:
                raise _Denied(403, "denied", "no TLS or HTTP from the client") from None
            return b""  # a protocol whose server speaks first (SSH, SMTP): allowed port
        if self.buf[0] == tls.HANDSHAKE:
            hello = await self._client_hello()
            if hello.ech:
                raise _Denied(403, "denied", "TLS encrypted_client_hello hides the server name; refused")
            if hello.server_name is None:
                if parse_ip(host) is None:
                    raise _Denied(403, "denied", "the TLS ClientHello names no server (SNI)")
            elif normalize_host(hello.server_name) != host:
                raise _Denied(403, "denied", f"TLS server name {hello.server_name} differs from {host}")
        elif _METHOD.match(bytes(self.buf[:11])):
            named = await self._http_host()
            if named != host:
                raise _Denied(403, "denied", f"HTTP Host {named or '(none)'} differs from {host}")
        elif web:
            raise _Denied(403, "denied", f"neither TLS nor HTTP on port {port}")
        out = bytes(self.buf)
        self.buf.clear()
        return out

    async def _client_hello(self) -> tls.ClientHello:
        try:
            while (total := tls.record_length(bytes(self.buf[:5]))) is None or len(self.buf) < total:
                if not await self._more(FIRST_BYTES_TIMEOUT):
                    raise _Denied(403, "denied", "the TLS ClientHello was cut short")
            return tls.parse_client_hello(bytes(self.buf[:total]))
        except tls.NotClientHello as e:
            raise _Denied(403, "denied", f"not a TLS ClientHello ({e})") from None
        except TimeoutError:
            raise _Denied(403, "denied", "the TLS ClientHello was not sent in time") from None

    async def _http_host(self) -> str | None:
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD or not await self._more(FIRST_BYTES_TIMEOUT):
                raise _Denied(403, "denied", "an HTTP request head that never ends")
        head = bytes(self.buf[: self.buf.index(b"\r\n\r\n") + 2])
        m = _HOST_HEADER.search(head)
        if m is None:
            return None
        host, _port = _authority(m.group(1).decode("ascii", "replace").strip(), 80)
        return host

    async def _carry(
        self,
        upstream: socket.socket,
        first: bytes,
        host: str,
        port: int,
        started: float,
        kind: str,
        rule: str | None,
        addr: IPAddress,
    ) -> None:
        """A checked tunnel: TLS to a host of the workspace's secrets is intercepted
        (:mod:`worker.egress.intercept`), anything else spliced as it is."""
        ix = self.served.interceptor
        if ix is not None and first[:1] == bytes([tls.HANDSHAKE]) and ix.wants(self.served.root, host, port):
            await ix.serve(self.served, self.sock, upstream, first, host, port, started, kind, rule, str(addr))
            return
        await self._tunnel(upstream, first, host, port, started, kind, rule, addr)

    async def _tunnel(
        self,
        upstream: socket.socket,
        first: bytes,
        host: str,
        port: int,
        started: float,
        kind: str,
        rule: str | None,
        addr: IPAddress,
    ) -> None:
        pump = Pump(self.sock, upstream, self.served.budget)
        try:
            if first:
                await self.loop.sock_sendall(upstream, first)
                pump.up += len(first)
                self.served.budget.take(len(first))
            self.sock.setblocking(True)
            upstream.setblocking(True)
            await pump.run()
        finally:
            upstream.close()
            verdict = "limited" if pump.limited else "allowed"
            reason = (
                f"cut: over {self.served.budget.per_minute} bytes per minute for this workspace"
                if pump.limited
                else "allowed"
            )
            self._log(
                kind,
                host,
                port,
                started,
                verdict=verdict,
                reason=reason,
                rule=rule,
                address=str(addr),
                bytes_up=pump.up,
                bytes_down=pump.down,
            )

    async def _forward_http(
        self, conn: h11.Connection, req: h11.Request, host: str, port: int, path: bytes, started: float, kind: str
    ) -> None:
        """One plain-HTTP request to ``host:port`` and its response, then close."""
        rule: str | None = None
        try:
            rule = self._admit(host, port)
            upstream, addr = await self._dial(host, port)
        except _Denied as d:
            await self._refuse_http(conn, host, port, d)
            return self._log_denied(kind, host, port, started, d, rule)
        self.served.active += 1
        counts = [0, 0]  # up, down
        verdict, reason = "allowed", "allowed"
        strays: dict[str, set[bytes]] = {}
        try:
            await self._send_request(conn, req, upstream, host, port, path, counts, strays)
            # The destination was asked to close after its answer (Connection: close), and
            # so is the sandbox's connection: the answer goes back as it comes, unparsed.
            pump = Pump(self.sock, upstream, self.served.budget)
            self.sock.setblocking(True)
            upstream.setblocking(True)
            await pump.run(down_only=True)
            counts[1] = pump.down
            if pump.limited:
                verdict = "limited"
                reason = f"cut: over {self.served.budget.per_minute} bytes per minute for this workspace"
        except _Denied as d:
            verdict, reason = d.verdict, d.reason
            await self._refuse_http(conn, host, port, d)
        except (OSError, h11.ProtocolError, ValueError, TimeoutError) as e:
            verdict, reason = "error", f"{type(e).__name__}: {e}"[:300]
        finally:
            upstream.close()
            self.served.active -= 1
            self._log_strays(strays, host, port, req, path)
        self._log(
            kind,
            host,
            port,
            started,
            verdict=verdict,
            reason=reason,
            rule=rule,
            address=str(addr),
            bytes_up=counts[0],
            bytes_down=counts[1],
        )

    async def _send_request(
        self,
        conn: h11.Connection,
        req: h11.Request,
        upstream: socket.socket,
        host: str,
        port: int,
        path: bytes,
        counts: list[int],
        strays: dict[str, set[bytes]],
    ) -> None:
        """The request, in origin form, with its body, hop-by-hop headers dropped.
        Placeholders of secrets in it are gathered in ``strays`` (by where): a plain-HTTP
        request never gets a secret."""
        client = h11.Connection(h11.CLIENT)
        authority = host if port == 80 else f"{host}:{port}"
        headers = [(k, v) for k, v in req.headers.raw_items() if k.lower() not in _HOP and k.lower() != b"host"]
        scan = self.served.interceptor is not None
        if scan:
            strays["the URL"] = placeholders_in(unquote_to_bytes(path))
            strays["a header"] = placeholders_in(b"\n".join(v for _k, v in headers))
        headers = [(b"Host", authority.encode()), *headers, (b"Connection", b"close")]
        out = client.send(h11.Request(method=req.method, target=path, headers=headers)) or b""
        body = BodyScan()
        while True:
            event = await self._next_event(conn)
            if isinstance(event, h11.Data):
                out += client.send(h11.Data(data=event.data)) or b""
                counts[0] += len(event.data)
                if scan:
                    body.feed(event.data)
                if not self.served.budget.take(len(event.data)):
                    raise _Denied(429, "limited", f"over {self.served.budget.per_minute} bytes per minute")
            elif isinstance(event, h11.EndOfMessage):
                out += client.send(h11.EndOfMessage()) or b""
                strays["the body"] = body.found
                break
            else:
                raise ValueError("unexpected request event")
            if len(out) > 1 << 20:
                await self.loop.sock_sendall(upstream, out)
                out = b""
        await self.loop.sock_sendall(upstream, out)

    def _log_strays(self, strays: dict[str, set[bytes]], host: str, port: int, req: h11.Request, path: bytes) -> None:
        """Log the placeholders a plain-HTTP request carried (sent unchanged)."""
        if not any(strays.values()):
            return
        secrets = self.served.interceptor.secrets.store.effective(self.served.root)
        for where, found in strays.items():
            for use in stray_uses(found, where, host, port, secrets, plain=True):
                rec = EgressRecord(
                    workspace=self.served.label,
                    kind="secret",
                    host=host,
                    port=port,
                    verdict=use.verdict,  # type: ignore[arg-type]
                    reason=use.reason,
                    secret=use.secret,
                    method=req.method.decode("latin-1"),
                    path=path.decode("latin-1")[:300],
                )
                self.served.record(rec)

    # -- a program that dialled a stub address itself ----------------------------------

    async def _transparent(self, address: str, port: int) -> None:
        started = time.perf_counter()
        try:
            dst = ipaddress.ip_address(address)
        except ValueError:
            return
        if dst not in dns.SYNTHETIC_NET:
            return self._log("transparent", address, port, started, reason="not an address the resolver gave")
        if self.buf[:1] != bytes([tls.HANDSHAKE]) and not await self._more(FIRST_BYTES_TIMEOUT):
            return
        try:
            if self.buf[0] == tls.HANDSHAKE:
                hello = await self._client_hello()
                name = hello.server_name
                if name is None or hello.ech:
                    raise _Denied(403, "denied", "a TLS connection to a resolved name must name it (SNI, no ECH)")
            elif _METHOD.match(bytes(self.buf[:11])):
                name = await self._http_host()
                if name is None:
                    raise _Denied(403, "denied", "an HTTP request without a Host")
            else:
                raise _Denied(403, "denied", "neither TLS nor HTTP")
            name = normalize_host(name)
            if dns.synthetic_address(name) != dst:
                raise _Denied(403, "denied", f"{address} is not the address the resolver gave for {name}")
        except _Denied as d:
            with contextlib.suppress(OSError):
                if self.buf[:1] == bytes([tls.HANDSHAKE]):
                    await self.loop.sock_sendall(self.sock, tls.ACCESS_DENIED_ALERT)
            return self._log("transparent", address, port, started, reason=d.reason)
        if self.buf[0] != tls.HANDSHAKE:
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            conn.receive_data(bytes(self.buf))
            self.buf.clear()
            event = await self._next_event(conn)
            if isinstance(event, h11.Request):
                await self._forward_http(conn, event, name, port, event.target, started, kind="transparent")
            return
        rule: str | None = None
        try:
            rule = self._admit(name, port)
            upstream, addr = await self._dial(name, port)
        except _Denied as d:
            with contextlib.suppress(OSError):
                await self.loop.sock_sendall(self.sock, tls.ACCESS_DENIED_ALERT)
            return self._log_denied("transparent", name, port, started, d, rule)
        self.served.active += 1
        try:
            first = bytes(self.buf)
            self.buf.clear()
            await self._carry(upstream, first, name, port, started, "transparent", rule, addr)
        finally:
            self.served.active -= 1

    # -- the stub resolver ---------------------------------------------------------------

    async def _dns(self) -> None:
        while True:
            try:
                n = int.from_bytes(await self._exact(2), "big")
            except EOFError:
                return
            msg = await self._exact(n, 5.0)
            await self.loop.sock_sendall(self.sock, _framed(self._answer(msg)))

    def _answer(self, msg: bytes) -> bytes:
        started = time.perf_counter()
        try:
            q = dns.parse_query(msg)
        except dns.BadQuery:
            return dns.error_answer(msg, dns.RCODE_FORMERR) or b""
        policy = self._policy()
        if q.qclass != 1 or not policy.knows_name(q.name):
            self._log("dns", q.name, 0, started, reason="not on the allowlist: no such name here")
            return dns.answer(q, dns.RCODE_NXDOMAIN)
        if q.qtype == dns.TYPE_A:
            addr = dns.synthetic_address(q.name)
            self._log("dns", q.name, 0, started, verdict="allowed", reason="allowed", address=str(addr))
            return dns.answer(q, dns.RCODE_OK, addr)
        return dns.answer(q, dns.RCODE_OK)


def _framed(msg: bytes) -> bytes:
    return len(msg).to_bytes(2, "big") + msg


_REASONS = {400: b"Bad Request", 403: b"Forbidden", 429: b"Too Many Requests", 502: b"Bad Gateway"}


def _authority(text: str, default_port: int | None) -> tuple[str | None, int | None]:
    """``host:port`` (``[v6]:port``) -> (normalized host, port)."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None, None
        host, rest = text[1:end], text[end + 1 :]
    else:
        host, sep, rest = text.rpartition(":")
        if not sep:
            host, rest = text, ""
        else:
            rest = ":" + rest
    port: int | None = default_port
    if rest:
        if not rest.startswith(":") or not rest[1:].isdigit():
            return None, None
        port = int(rest[1:])
        if not 0 < port < 65536:
            return None, None
    try:
        host = normalize_host(host)
    except ValueError:
        return None, None
    if not host:
        return None, None
    return host, port
