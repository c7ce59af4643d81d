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

This module is the loop that performs them: it reads, asks :mod:`worker.egress.decide`
(every decision, as a function of the bytes read and the policy), and does what it answers
(dial, send the refusal, splice or intercept, log).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote_to_bytes

import h11

from . import decide, tls
from .addresses import IPAddress
from .decide import MAX_HEAD, Denied, NeedMore, Refuse
from .log import EgressRecord
from .policy import EgressPolicy
from .pump import Pump, RateBudget
from .rewrite import BodyScan, placeholders_in, stray_uses
from .upstream import Refused, Unreachable, Upstream

#: The most of a turn report's body read (a hook's JSON holds the tool's input and output;
#: what a turn needs is at its start: the rest is not read).
MAX_TURN_BODY = 256 << 10

_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"trailer", b"upgrade"}
_T = TypeVar("_T")


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
    #: The workspace's socket directory on the host (agents' turn sockets are there).
    socket_dir: Path | None = None


class Connection:
    """Serves one accepted socket (non-blocking) until it closes: reads, asks
    :mod:`worker.egress.decide` what to do, does it."""

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

    async def _until(self, step: Callable[[bytes, decide.Ended], _T | NeedMore]) -> _T:
        """Read until ``step`` (a decision of :mod:`worker.egress.decide`, given the bytes
        read so far and how the reading ended) decides something else than to read more."""
        ended: decide.Ended = None
        while True:
            d = step(bytes(self.buf), ended)
            if not isinstance(d, NeedMore):
                return d
            if ended:
                raise ValueError("a decision asked for more bytes after the reading ended")
            try:
                if not await self._more(d.timeout):
                    ended = "eof"
            except TimeoutError:
                ended = "timeout"

    # -- entry -----------------------------------------------------------------------

    async def run(self) -> None:
        try:
            head: decide.Header | decide.Drop = await self._until(decide.header)
            if isinstance(head, decide.Drop):
                return
            del self.buf[: head.size]
            way = head.way
            if isinstance(way, decide.Proxy):
                await self._proxy()
            elif isinstance(way, decide.Transparent):
                await self._transparent(way.address, way.port)
            else:
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

    def _log_denied(self, kind: str, host: str, port: int, started: float, d: Refuse, rule: str | None) -> None:
        """Log a refusal: the rule is the refusal's, else the allow rule it passed first."""
        self._log(kind, host, port, started, verdict=d.verdict, reason=d.reason, rule=d.rule or rule, address=d.address)

    # -- refusals --------------------------------------------------------------------

    async def _refuse_http(self, conn: h11.Connection, host: str, port: int, d: Refuse) -> None:
        r = decide.refusal_response(d, host, port, self._policy())
        with contextlib.suppress(h11.LocalProtocolError, OSError):
            out = conn.send(h11.Response(status_code=r.status, headers=r.headers, reason=r.reason))
            out = (out or b"") + (conn.send(h11.Data(data=r.body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            await self.loop.sock_sendall(self.sock, out)

    async def _alert(self) -> None:
        """A refused TLS handshake ends with an access_denied alert."""
        with contextlib.suppress(OSError):
            if self.buf[:1] == bytes([tls.HANDSHAKE]):
                await self.loop.sock_sendall(self.sock, tls.ACCESS_DENIED_ALERT)

    def _admit(self, host: str, port: int) -> str | None:
        """Policy and limits for a new connection to ``host:port``; returns the rule.
        Raises Denied."""
        budget = self.served.budget
        limits = decide.Limits(self.served.active, self.served.max_connections, budget.available(), budget.per_minute)
        d = decide.admit(self._policy(), host, port, limits)
        if isinstance(d, Refuse):
            raise Denied(d)
        return d.rule

    async def _dial(self, host: str, port: int) -> tuple[socket.socket, IPAddress]:
        """Raises Denied (403 address refused, 502 unreachable)."""
        try:
            addrs = await self.upstream.resolve(host, port)
            return await self.upstream.connect(addrs, self.upstream.dial_port(host, port))
        except Refused as e:
            raise Denied(Refuse(403, "denied", e.reason, address=e.address)) from None
        except Unreachable as e:
            raise Denied(Refuse(502, "error", e.reason, address=e.address)) from None

    # -- proxy: CONNECT and plain HTTP -----------------------------------------------------

    async def _next_event(self, conn: h11.Connection) -> object:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if len(self.buf) > MAX_HEAD:
                    raise ValueError("request head too large")
                data = await asyncio.wait_for(self.loop.sock_recv(self.sock, 65536), decide.FIRST_BYTES_TIMEOUT)
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
        d = decide.proxy_request(event.method, event.target)
        if isinstance(d, decide.BadRequest):
            await self._refuse_http(conn, d.host, d.port, d.refuse)
            return self._log(d.kind, d.host, d.port, started, reason=d.refuse.reason)
        if isinstance(d, decide.Connect):
            await self._connect(conn, d.host, d.port, started)
            return
        if isinstance(d, decide.Turn):
            await self._turn(conn, d.process_id)
            return
        await self._forward_http(conn, event, d.host, d.port, d.path, started, kind="http")

    async def _turn(self, conn: h11.Connection, process_id: str) -> None:
        """An agent's HTTP hook after a tool call (``decide.Turn``): its JSON body, cut to
        what a turn needs, goes to the process's turn socket, and the answer comes back
        once the worker recorded the turn. Always 200 ``{}``: a hook must never fail the
        agent (no such process, a body that is not JSON: nothing is recorded)."""
        from ..agents.turns import relay_hook  # (only here: the gateway knows no agent otherwise)

        body = bytearray()
        while True:
            event = await self._next_event(conn)
            if isinstance(event, h11.Data):
                if len(body) + len(event.data) > MAX_TURN_BODY:
                    break
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)) or event is h11.PAUSED:
                break
        if self.served.socket_dir is not None:
            await relay_hook(self.served.socket_dir, process_id, bytes(body))
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2"), (b"connection", b"close")]
        with contextlib.suppress(h11.LocalProtocolError, OSError):
            out = conn.send(h11.Response(status_code=200, headers=headers)) or b""
            out += (conn.send(h11.Data(data=b"{}")) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            await self.loop.sock_sendall(self.sock, out)

    async def _connect(self, conn: h11.Connection, host: str, port: int, started: float) -> None:
        rule: str | None = None
        try:
            rule = self._admit(host, port)
            upstream, addr = await self._dial(host, port)
        except Denied as e:
            await self._refuse_http(conn, host, port, e.refuse)
            return self._log_denied("connect", host, port, started, e.refuse, rule)
        self.served.active += 1
        try:
            self.buf = bytearray(conn.trailing_data[0])
            try:
                # Written by hand: h11 would add "Connection: close" when the client sent it
                # (npm does), and some proxy clients then give up on the tunnel.
                await self.loop.sock_sendall(self.sock, b"HTTP/1.1 200 Connection established\r\n\r\n")
                d: decide.Checked | Refuse = await self._until(
                    lambda buf, ended: decide.first_bytes(buf, host, port, ended)
                )
            except BaseException as e:
                upstream.close()
                if not isinstance(e, OSError):
                    raise
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
            if isinstance(d, Refuse):
                await self._alert()
                upstream.close()
                return self._log(
                    "connect", host, port, started, verdict="denied", reason=d.reason, rule=rule, address=str(addr)
                )
            self.buf.clear()
            await self._carry(upstream, d.first, host, port, started, "connect", rule, addr)
        finally:
            self.served.active -= 1

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
        if decide.carry(first, ix is not None and ix.wants(self.served.root, host, port)) == "intercept":
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
        except Denied as e:
            await self._refuse_http(conn, host, port, e.refuse)
            return self._log_denied(kind, host, port, started, e.refuse, rule)
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
        except Denied as e:
            verdict, reason = e.refuse.verdict, e.refuse.reason
            await self._refuse_http(conn, host, port, e.refuse)
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
                    raise Denied(Refuse(429, "limited", f"over {self.served.budget.per_minute} bytes per minute"))
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
        dst = decide.synthetic(address)
        if isinstance(dst, decide.Drop):
            return
        if isinstance(dst, Refuse):
            return self._log("transparent", address, port, started, reason=dst.reason)
        d: decide.Named | decide.Drop | Refuse = await self._until(
            lambda buf, ended: decide.transparent(buf, dst, ended)
        )
        if isinstance(d, decide.Drop):
            return
        if isinstance(d, Refuse):
            await self._alert()
            return self._log("transparent", address, port, started, reason=d.reason)
        name = d.host
        if not d.tls:
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
        except Denied as e:
            await self._alert()
            return self._log_denied("transparent", name, port, started, e.refuse, rule)
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
            m: decide.DnsMessage | decide.Drop = await self._until(decide.dns_message)
            if isinstance(m, decide.Drop):
                return
            del self.buf[: m.size]
            started = time.perf_counter()
            a = decide.dns_answer(self._policy(), m.query)
            if a.name is not None:
                self._log("dns", a.name, 0, started, verdict=a.verdict, reason=a.reason, address=a.address)
            await self.loop.sock_sendall(self.sock, decide.framed(a.answer))
