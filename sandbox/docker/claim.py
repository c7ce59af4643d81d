"""A claimed warm sandbox, handed by the pool (:meth:`.pool.WarmPool.claim`) to the
backend, which makes it its workspace's (:meth:`Claim.settle`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..connection import AgentConnection
from ..errors import SandboxError, SandboxLostError, SandboxUnavailableError
from ..logs import get_logger
from .channel import DockerExecTransport

log = get_logger("sandbox.docker")


@dataclass
class Claim:
    """A claimed warm sandbox (:meth:`WarmPool.claim`)."""

    container: Any
    transport: DockerExecTransport
    #: Whether the engine renamed it to its workspace's name (never raises).
    named: asyncio.Task[bool]
    #: Its agent, booted and checked in the pool, or None: the caller boots it over
    #: :attr:`transport`.
    conn: AgentConnection | None = None
    #: runc: the workspace's ``(st_dev, st_ino)``, bound over the slot's directory that
    #: :attr:`conn`'s agent opened as its root in the pool; it opens its root again at
    #: the claim's ``keeper`` request and checks it is this directory. None: the agent's
    #: root already is the workspace (gVisor: the directory itself moved into place).
    root: tuple[int, int] | None = None

    async def settle(self, conn: AgentConnection, ttl: float, timeout: float) -> None:
        """Wait for the rename, and meanwhile make ``conn``'s agent (booted in the pool:
        :attr:`conn`) the container's keeper for ``ttl`` idle seconds, rooted at
        :attr:`root` where that is given. Raises SandboxUnavailableError when the engine
        refused the name (a peer made the workspace's container first), SandboxLostError
        when the agent is gone or refused its root; the caller then removes the sandbox."""
        keeper: asyncio.Future[Any] | None = None
        if self.conn is not None:
            args: dict[str, Any] = {"ttl": ttl}
            if self.root is not None:
                args["root"] = list(self.root)
            keeper = asyncio.ensure_future(conn.request("keeper", args, timeout=timeout))
        named = await self.named
        failed: BaseException | None = None
        if keeper is not None:
            try:
                await keeper
            except (SandboxError, TimeoutError) as e:
                failed = e
        if not named:
            raise SandboxUnavailableError(f"another process started {self.container.name} first") from failed
        if failed is not None:
            log.warning("sandbox.pool_claim_failed", container=self.container.name, error=repr(failed))
            raise SandboxLostError(f"the claimed sandbox's agent did not take its workspace: {failed}") from failed
