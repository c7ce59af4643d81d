"""Checks that fail closed: the engine has the OCI runtime a spec asks for (gVisor, with
what egress needs), a sandbox that asked for gVisor really runs on its kernel, and the
sandbox's seccomp profile (:mod:`.seccomp`) is what the engine kept and what the agent runs
under."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ..client import agent_info
from ..connection import AgentConnection
from ..errors import RuntimeUnavailableError
from ..spec import SandboxSpec
from . import gvisor, seccomp
from .engine import Engine


class RuntimeCheck:
    """Whether the engine can run a spec's runtime, and on which of its registered
    runtimes (under gVisor, the one for the spec's platform: :mod:`.gvisor`). Asks the
    engine once per gVisor platform (again when a later spec needs egress)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock: asyncio.Lock | None = None  # one `docker info` for many starts at once
        #: The engine's runtimes as last asked (``docker info``'s ``Runtimes``).
        self.runtimes: dict[str, Any] = {}
        self._resolved: dict[str, str] = {}  # gVisor platform -> engine runtime
        self._uds: dict[str, bool] = {}
        #: Whether the engine's runsc applies the OCI seccomp profile inside the sandbox
        #: (registered with ``--oci-seccomp``); known once a runsc spec was checked.
        self.runsc_oci_seccomp = False

    def engine_runtime(self, spec: SandboxSpec) -> str:
        """The engine runtime ``spec``'s containers are made with (``runc``, or gVisor's
        for its platform once :meth:`check` resolved it; ``runsc`` before)."""
        if spec.runtime != "runsc":
            return spec.runtime
        return self._resolved.get(spec.gvisor_platform, gvisor.FAMILY)

    async def check(self, spec: SandboxSpec) -> None:
        """Raises RuntimeUnavailableError when ``spec`` asks for gVisor and the engine has
        no runtime for its platform, or not one that lets the sandbox reach the egress
        gateway's socket when ``spec`` needs it; DaemonUnavailableError."""
        if self._done(spec):
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._done(spec):
                await self._check(spec)

    def _done(self, spec: SandboxSpec) -> bool:
        if spec.runtime != "runsc":
            return True
        name = self._resolved.get(spec.gvisor_platform)
        return name is not None and (self._uds[name] or not spec.egress_dir)

    async def _check(self, spec: SandboxSpec) -> None:
        info = await self._engine.info()
        self.runtimes = dict(info.get("Runtimes") or {})
        name = gvisor.engine_runtime(self.runtimes, spec.gvisor_platform)
        args = gvisor.runtime_args(self.runtimes[name])
        uds = "--host-uds=open" in args or "--host-uds=all" in args
        if spec.egress_dir and not uds:
            raise RuntimeUnavailableError(
                f"this workspace may reach the network, but the engine's {name} runtime is not registered with "
                "--host-uds=open, so its sandbox could not reach the egress gateway's socket. Run scripts/setup "
                "(it registers gVisor's runtimes with that flag in /etc/docker/daemon.json), or use LOOM_RUNTIME=runc."
            )
        self.runsc_oci_seccomp = runsc_applies_seccomp(self.runtimes[name])
        self._uds[name] = uds
        self._resolved[spec.gvisor_platform] = name


async def verify_gvisor(
    engine: Engine, conn: AgentConnection, container: Any, runtimes: RuntimeCheck, spec: SandboxSpec
) -> None:
    """Fail closed unless the agent really runs on gVisor's kernel, on the platform
    ``spec`` asks for (:func:`.gvisor.check_platform`): else the connection is closed,
    the container removed, and RuntimeUnavailableError raised."""
    # (part of the sandbox's start: the start's own deadline, not a liveness check's 10 s;
    # 100 gVisor sandboxes starting at once on two cores took longer than 10 s to answer)
    hello = agent_info(await conn.request("hello", {}, timeout=spec.agent_start_timeout))
    await engine.call("inspect sandbox", container.reload)
    runtime = container.attrs.get("HostConfig", {}).get("Runtime")
    try:
        if not isinstance(runtime, str) or not runtime.startswith(gvisor.FAMILY) or hello.kernel == os.uname().release:
            raise RuntimeUnavailableError(
                f"gVisor was requested but is not in effect (runtime={runtime!r}, kernel={hello.kernel!r}); "
                "refusing to run"
            )
        gvisor.check_platform(container, runtimes.runtimes, spec.gvisor_platform)
    except RuntimeUnavailableError:
        await conn.close("gVisor not in effect")
        await engine.remove(container)
        raise


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
