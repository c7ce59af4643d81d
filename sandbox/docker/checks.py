"""Checks that fail closed: the engine has the OCI runtime a spec asks for (gVisor, with
what egress needs), and a sandbox that asked for gVisor really runs on its kernel."""

from __future__ import annotations

import os
from typing import Any

from ..client import agent_info
from ..connection import AgentConnection
from ..errors import RuntimeUnavailableError
from ..spec import SandboxSpec
from .engine import Engine


class RuntimeCheck:
    """Whether the engine can run a spec's runtime; asks the engine once (twice when a
    later spec needs egress and the first did not)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._runsc_checked = False
        self._runsc_uds = False

    async def check(self, spec: SandboxSpec) -> None:
        """Raises RuntimeUnavailableError when ``spec`` asks for gVisor and the engine has
        no ``runsc`` runtime, or not one that lets the sandbox reach the egress gateway's
        socket when ``spec`` needs it; DaemonUnavailableError."""
        if spec.runtime != "runsc" or (self._runsc_checked and (self._runsc_uds or not spec.egress_dir)):
            return
        info = await self._engine.info()
        runsc = (info.get("Runtimes") or {}).get("runsc") or {}
        args = " ".join(runsc.get("runtimeArgs") or []) if isinstance(runsc, dict) else ""
        self._runsc_uds = "--host-uds=open" in args or "--host-uds=all" in args
        if spec.egress_dir and runsc and not self._runsc_uds:
            raise RuntimeUnavailableError(
                "this workspace may reach the network, but the engine's runsc runtime is not registered with "
                "--host-uds=open, so its sandbox could not reach the egress gateway's socket. Run scripts/setup "
                "(it registers runsc with that flag in /etc/docker/daemon.json), or use LOOM_RUNTIME=runc."
            )
        if "runsc" not in (info.get("Runtimes") or {}):
            raise RuntimeUnavailableError(
                "gVisor (runsc) was requested but the Docker engine has no 'runsc' runtime registered; "
                "refusing to run without it. Run scripts/setup (it installs the runsc this "
                "project needs, not bookworm's, whose statx breaks `ls -l`, and registers it in "
                "/etc/docker/daemon.json), or set LOOM_RUNTIME=runc."
            )
        self._runsc_checked = True


async def verify_gvisor(engine: Engine, conn: AgentConnection, container: Any) -> None:
    """Fail closed unless the agent really runs on gVisor's kernel: else the connection is
    closed, the container removed, and RuntimeUnavailableError raised."""
    hello = agent_info(await conn.request("hello", {}, timeout=10))
    await engine.call("inspect sandbox", container.reload)
    runtime = container.attrs.get("HostConfig", {}).get("Runtime")
    if runtime != "runsc" or hello.kernel == os.uname().release:
        await conn.close("gVisor not in effect")
        await engine.remove(container)
        raise RuntimeUnavailableError(
            f"gVisor was requested but is not in effect (runtime={runtime!r}, kernel={hello.kernel!r}); refusing to run"
        )
