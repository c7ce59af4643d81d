"""What the backend does when a sandbox's agent is lost: wait for a dying container to
be gone before reconnecting, and remove a container a command may have escaped from."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..errors import SandboxUnavailableError
from ..logs import get_logger
from .engine import Engine

log = get_logger("sandbox.docker")


async def settle(engine: Engine, name: str) -> None:
    """After a lost connection: if the container ``name`` is dying (OOM, keeper killed),
    wait until the engine says so, so the reconnect replaces it instead of exec-ing into
    a container that is about to vanish. Raises DaemonUnavailableError."""
    for _ in range(10):
        container = await engine.find(name)
        if container is None or container.status != "running":
            return
        await asyncio.sleep(0.1)


async def reset_after_lost_exec(
    engine: Engine, remove: Callable[[Any], Awaitable[None]], name: str, ws: Path
) -> str | None:
    """The agent died or froze while running a command (``kill -9 $PPID``, ``kill
    -STOP -1``, ...), or the whole sandbox was killed. Processes the command started may
    have escaped the agent's tree-kill, and a frozen keeper would keep the container past
    its idle TTL: remove the container (``remove``), so every one of its processes is
    gone; the next call starts a fresh one. Other processes using it reconnect to the new
    one.

    Returns "oom" when the engine killed the container for memory (under gVisor the
    host's cgroup sees the sandbox as one process, so a command's allocation past the
    limit takes the sandbox: still the command's out-of-memory, not an infrastructure
    failure), "reset" when it removed it otherwise, None when it could not. Never raises
    SandboxUnavailableError (logged)."""
    try:
        container = await engine.find(name)
        for _ in range(25):  # an OOM kill ends the container within moments: let it settle
            if container is None or container.status not in ("running", "restarting"):
                break
            await asyncio.sleep(0.1)
            await engine.call("inspect sandbox", container.reload)
        if container is None:
            return "reset"  # already gone (TTL, removed): nothing of the command is left
        oom = _oom_killed(container)
        for _ in range(10):
            # The engine hears of a container's exit and of its OOM kill as two events, in
            # either order (on a busy host the exit can come a moment first): a container
            # that ended without the flag yet is looked at again, briefly.
            if oom or container.status in ("running", "restarting") or _exit_code(container) == 0:
                break
            await asyncio.sleep(0.1)
            await engine.call("inspect sandbox", container.reload)
            oom = _oom_killed(container)
        await remove(container)
    except SandboxUnavailableError as e:
        log.warning("sandbox.reset_failed", workspace=str(ws), error=str(e))
        return None
    log.warning(
        "sandbox.reset_after_lost_exec",
        workspace=str(ws),
        container=container.name,
        oom=oom,
        status=container.status,
        exit_code=_exit_code(container),
    )
    return "oom" if oom else "reset"


def _oom_killed(container: Any) -> bool:
    return bool((container.attrs.get("State") or {}).get("OOMKilled"))


def _exit_code(container: Any) -> int | None:
    code = (container.attrs.get("State") or {}).get("ExitCode")
    return code if isinstance(code, int) else None
