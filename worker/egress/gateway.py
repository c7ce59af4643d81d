"""The egress gateway: the only way out of a sandbox, served on the host.

A sandbox with an egress policy still has no network interface but loopback. Its only
door is a unix socket the worker listens on, in a directory of the host
(``<egress dir>/<workspace key>/s``) bind-mounted read-only into that sandbox alone at
:data:`sandbox.spec.EGRESS_MOUNT`; the agent relays the sandbox's loopback listeners to it
(see :mod:`worker.egress.handler` for what is checked there). Which socket a connection
came in on says which workspace it is, so a sandbox cannot pass for another.

Any worker process that has the workspace open serves its socket, one at a time: the
first takes an exclusive ``flock`` on ``<key>.lock`` (next to the directory, not in it)
and binds the socket; the others leave it be, and look again at most once a second, so
when the serving process exits another one takes over at its next call. Each connection
reads the workspace's policy as it is then (one ``stat`` of its settings file), so a
changed allowlist applies to new connections at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.identity import workspace_key
from sandbox.logs import get_logger

from ..storage.atomic import write_atomic
from ..unixsockets import bind_for_any_uid
from .handler import Connection, Served
from .log import EgressLog, EgressRecord
from .policy import EgressPolicy
from .pump import RateBudget
from .upstream import Upstream

log = get_logger("worker.egress")

SOCKET = "s"
RESOLV_CONF = "resolv.conf"
#: The sandbox's resolver is the agent's stub on its loopback (answered by the gateway).
RESOLV_TEXT = (
    "# loom-worker: names are answered by the egress gateway, for allowed hosts only\n"
    "nameserver 127.0.0.1\noptions timeout:2 attempts:1\n"
)
RECHECK = 1.0


@dataclass
class Limits:
    max_connections: int = 64
    bytes_per_minute: int = 4 << 30


@dataclass
class _State:
    served: Served | None = None
    listener: socket.socket | None = None
    lock_fd: int | None = None
    task: asyncio.Task[None] | None = None
    checked: float = 0.0
    conns: set[asyncio.Task[None]] = field(default_factory=set)


class EgressGateway:
    """Serves the egress sockets of the workspaces this process has open."""

    def __init__(
        self,
        egress_dir: Path,
        log_store: EgressLog,
        policy_of: Callable[[Path], EgressPolicy | None],
        upstream: Upstream,
        limits: Limits | None = None,
        interceptor: Any = None,
    ) -> None:
        self.egress_dir = Path(egress_dir)
        #: Intercepts TLS to the hosts of the workspaces' secrets (None: no secrets here).
        self.interceptor = interceptor
        self.log = log_store
        self.policy_of = policy_of
        self.upstream = upstream
        self.limits = limits or Limits()
        self.observers: list[Callable[[EgressRecord], None]] = []
        self._states: dict[Path, _State] = {}

    def socket_dir(self, root: Path) -> Path:
        """The host directory mounted into ``root``'s sandbox (it holds the socket)."""
        return self.egress_dir / workspace_key(root)

    def prepare(self, root: Path) -> Path:
        """Make the socket's directory (and the sandbox's resolv.conf in it) so a
        container can mount it. Returns it. Raises OSError."""
        d = self.socket_dir(root)
        self.egress_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        d.mkdir(exist_ok=True)
        # The sandbox user (any uid) must reach the socket through this one directory;
        # the sandbox sees nothing of the directories above it.
        os.chmod(d, 0o755)
        conf = d / RESOLV_CONF
        if not conf.exists() or conf.read_text() != RESOLV_TEXT:
            write_atomic(conf, RESOLV_TEXT, mode=0o644, fsync=False)
        return d

    def serving(self, root: Path) -> bool:
        st = self._states.get(root)
        return st is not None and st.listener is not None

    async def serve(self, root: Path) -> None:
        """Make sure some process serves ``root``'s socket: this one, unless another
        already does. Cheap when nothing changed. Raises OSError when the directory
        cannot be made or the socket bound."""
        st = self._states.get(root)
        if st is not None and (st.listener is not None or time.monotonic() - st.checked < RECHECK):
            return
        if st is None:
            st = self._states[root] = _State()
        st.checked = time.monotonic()
        d = self.prepare(root)
        if st.lock_fd is None:
            st.lock_fd = os.open(str(d) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(st.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another worker process serves it
        st.listener = bind_for_any_uid(d, SOCKET, 256)
        st.served = Served(
            root=root,
            label=str(root),
            policy=lambda: self.policy_of(root),
            budget=RateBudget(self.limits.bytes_per_minute),
            max_connections=self.limits.max_connections,
            record=self._record,
            interceptor=self.interceptor,
            socket_dir=d,
        )
        st.task = asyncio.get_running_loop().create_task(self._accept(st))
        log.info("egress.serving", workspace=str(root), socket=str(d / SOCKET))

    async def _accept(self, st: _State) -> None:
        loop = asyncio.get_running_loop()
        assert st.listener is not None and st.served is not None
        while True:
            try:
                sock, _ = await loop.sock_accept(st.listener)
            except OSError as e:
                log.warning("egress.accept_failed", workspace=st.served.label, error=repr(e))
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            task = loop.create_task(Connection(st.served, sock, self.upstream).run())
            st.conns.add(task)
            task.add_done_callback(st.conns.discard)

    def _record(self, rec: EgressRecord) -> None:
        if rec.kind == "secret":
            log.info(  # (the secret's name as "name": keys like "secret" are redacted from logs)
                "egress.secret",
                workspace=rec.workspace,
                name=rec.secret,
                host=rec.host,
                port=rec.port,
                method=rec.method,
                path=rec.path,
                status=rec.status,
                verdict=rec.verdict,
                reason=rec.reason,
            )
        else:
            self._log_line(rec)
        for observer in self.observers:
            with contextlib.suppress(Exception):
                observer(rec)
        self.log.append(Path(rec.workspace), rec)

    @staticmethod
    def _log_line(rec: EgressRecord) -> None:
        log.info(
            "egress.connection",
            workspace=rec.workspace,
            kind=rec.kind,
            host=rec.host,
            port=rec.port,
            address=rec.address,
            verdict=rec.verdict,
            reason=rec.reason,
            bytes_up=rec.bytes_up,
            bytes_down=rec.bytes_down,
            duration_ms=rec.duration_ms,
        )

    async def release(self, root: Path) -> None:
        """Stop serving ``root`` (its sandbox was stopped): close the socket, end its
        connections, let another process take it."""
        st = self._states.pop(root, None)
        if st is None:
            return
        tasks = [t for t in (st.task, *st.conns) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if st.listener is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.socket_dir(root) / SOCKET)
            st.listener.close()
        if st.lock_fd is not None:
            os.close(st.lock_fd)  # releases the flock

    async def aclose(self) -> None:
        for root in list(self._states):
            await self.release(root)
        self.log.close()
