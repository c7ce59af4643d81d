"""Resolve an allowed name, check every address, connect to one that was checked.

The sandbox never resolves a real name: the gateway does it here, once per connection,
and refuses the whole name if any address it resolves to is one the gateway never
connects to (:mod:`worker.egress.addresses`). The connection then goes to exactly one of
the addresses checked (in the resolver's order, IPv4 and IPv6 as they come), so a second
lookup can never swap in another address (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from . import decide
from .addresses import HostAddresses, IPAddress, IPNetwork
from .authority import parse_ip
from .overrides import Target, lookup

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


class Refused(Exception):
    """The destination may not be dialled; ``reason`` says why."""

    def __init__(self, reason: str, address: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.address = address


class Unreachable(Exception):
    """Allowed, but it could not be resolved or connected to."""

    def __init__(self, reason: str, address: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.address = address


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The host's resolver (getaddrinfo, in a thread). Raises OSError."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        addr = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if addr not in out:
            out.append(addr)
    return out


@dataclass
class Upstream:
    """How the gateway reaches destinations."""

    own: HostAddresses
    trusted: tuple[IPNetwork, ...] = ()
    resolver: Resolver = system_resolver
    connect_timeout: float = 10.0
    #: LOOM_EGRESS_HOSTS: names dialled at a fixed address instead of resolved
    overrides: dict[tuple[str, int | None], Target] | None = None

    def dial_port(self, host: str, port: int) -> int:
        """The port the gateway dials for ``host:port`` (an override's, else ``port``)."""
        target = lookup(self.overrides, host, port) if self.overrides else None
        return target.port if target is not None and target.port is not None else port

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """The checked addresses of ``host`` (an IP literal is itself). Raises Refused
        (one of them may not be dialled) or Unreachable (no address)."""
        literal = parse_ip(host)
        target = lookup(self.overrides, host, port) if self.overrides and literal is None else None
        if literal is not None:
            addrs: list[IPAddress] = [literal]
        elif target is not None:  # still checked below: a loopback one must be a trusted network
            addrs = [target.address]
        else:
            try:
                addrs = await asyncio.wait_for(self.resolver(host, port), self.connect_timeout)
            except (OSError, TimeoutError, UnicodeError) as e:
                raise Unreachable(f"cannot resolve {host}: {getattr(e, 'strerror', None) or e}") from None
        checked = decide.addresses(host, addrs, self.own.get(), self.trusted)
        if isinstance(checked, decide.Refuse):
            if checked.verdict == "error":
                raise Unreachable(checked.reason)
            raise Refused(checked.reason, checked.address)
        return checked

    async def connect(self, addrs: list[IPAddress], port: int) -> tuple[socket.socket, IPAddress]:
        """A connected, non-blocking socket to the first of ``addrs`` that answers.
        Raises Unreachable."""
        loop = asyncio.get_running_loop()
        last = "no address"
        for addr in addrs:
            family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, (str(addr), port)), self.connect_timeout)
            except (OSError, TimeoutError) as e:
                sock.close()
                last = f"{addr}:{port}: {getattr(e, 'strerror', None) or 'timed out'}"
                continue
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, addr
        raise Unreachable(f"cannot connect to {last}", str(addrs[0]) if addrs else None)
