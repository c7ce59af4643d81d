"""Checks that fail closed: the engine has the OCI runtime a spec asks for (gVisor, with
what egress needs), a sandbox that asked for gVisor really runs on its kernel, and the
sandbox's seccomp profile (:mod:`.seccomp`) is what the engine kept and what the agent runs
under."""

from __future__ import annotations

import os
from typing import Any

from ..client import agent_info
from ..connection import AgentConnection
from ..errors import RuntimeUnavailableError
from ..spec import SandboxSpec
from . import seccomp
from .engine import Engine


class RuntimeCheck:
    """Whether the engine can run a spec's runtime; asks the engine once (twice when a
    later spec needs egress and the first did not)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._runsc_checked = False
        self._runsc_uds = False
        #: Whether the engine's runsc applies the OCI seccomp profile inside the sandbox
        #: (registered with ``--oci-seccomp``); known once a runsc spec was checked.
        self.runsc_oci_seccomp = False

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
        self.runsc_oci_seccomp = runsc_applies_seccomp(runsc)
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


def runsc_applies_seccomp(runsc: object) -> bool:
    """Whether an engine's ``runsc`` runtime entry (``docker info``'s ``Runtimes.runsc``)
    is registered with ``--oci-seccomp``: without it runsc ignores the container's seccomp
    profile (its own kernel decides what the sandbox may call)."""
    args = runsc.get("runtimeArgs") if isinstance(runsc, dict) else None
    return any(a in ("--oci-seccomp", "--oci-seccomp=true") for a in (args or []))


def seccomp_kept(container: Any, runtime: str) -> bool:
    """Whether the engine kept the sandbox's seccomp profile (``runtime``'s) for
    ``container`` (its inspected ``HostConfig.SecurityOpt``)."""
    host = (container.attrs or {}).get("HostConfig") or {}
    return seccomp.in_security_opt(host.get("SecurityOpt"), runtime)


def check_seccomp_mode(hello: dict[str, Any], *, runtime: str, runsc_oci_seccomp: bool) -> None:
    """The agent's hello says which seccomp mode it runs under: a filter (2) under runc,
    and under gVisor when runsc applies the OCI profile. Raises RuntimeUnavailableError
    otherwise (the caller removes the container)."""
    mode = hello.get("seccomp")
    if runtime == "runc" or runsc_oci_seccomp:
        if mode != 2:
            raise RuntimeUnavailableError(
                f"the sandbox's seccomp profile is not in effect (the agent reports Seccomp: {mode!r}, "
                "expected 2, a filter); refusing to run. The Docker engine must run containers with seccomp "
                "(`docker info` lists it under Security Options)."
            )
