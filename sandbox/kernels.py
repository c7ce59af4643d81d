"""Code kernels on an agent sandbox: the host's side of :mod:`sandbox.kernel_bridge`.

A kernel is a background process of the sandbox (its supervisor owns it; it counts
against the workspace's background processes and the sandbox's limits, and ends with the
sandbox) named by its context's id: ``python3 -c`` with the bridge's source on its stdin,
run by the image's own ``python3``. The bridge's first line of output (kept by its
supervisor, so every worker process of the workspace finds it) says the loopback port it
listens on and its token; :class:`KernelSession` is one connection to it through
``open_tunnel(port)`` (the socket handed over under runc, relayed under gVisor),
speaking the bridge's newline-delimited JSON. Sessions are kept per sandbox and context,
so an execution costs one round trip to the bridge.

What comes back is untrusted: lines are capped, the ready line's fields checked; the
events of an execution are checked by their reader (``worker.kernels``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import time
import weakref
from importlib import resources
from typing import Protocol

from .capabilities import BackgroundProcesses, Tunnels
from .errors import AgentError, KernelUnavailableError, ProtocolError
from .kernel_bridge import BOOT
from .kernel_session import KERNELS, KernelInfo, KernelSession, missing_message, ready_line

#: Seconds a kernel has to start (a cold sandbox under gVisor imports slowly).
START_TIMEOUT = 90.0
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

__all__ = ["KERNELS", "KernelInfo", "KernelSession", "KernelsMixin", "missing_message", "ready_line"]


def _bridge_source() -> bytes:
    return (resources.files("sandbox") / "kernel_bridge.py").read_bytes()


class _Box(BackgroundProcesses, Tunnels, Protocol):
    """What a sandbox needs to have kernels."""


#: Open sessions per sandbox (a context id each).
_SESSIONS: weakref.WeakKeyDictionary[object, dict[str, KernelSession]] = weakref.WeakKeyDictionary()


class KernelsMixin:
    """The kernel methods of :class:`~sandbox.client.AgentSandbox` (see
    :class:`~sandbox.capabilities.CodeKernels`)."""

    async def start_kernel(
        self: _Box,
        context_id: str,
        language: str,
        *,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        max_running: int = 8,
        linger: float = 600.0,
        timeout: float = 86_400.0,
    ) -> KernelInfo:
        if not _ID.match(context_id):
            raise AgentError(f"not a context id: {context_id!r}", code="invalid")
        kernel = KERNELS.get(language)
        if kernel is None:
            raise AgentError(f"no kernel for {language!r}", code="invalid")
        command = "exec python3 -c " + shlex.quote(BOOT)
        info = await self.start_process(
            context_id, command, cwd=cwd, timeout=timeout, max_running=max_running, head=64 << 10, tail=16 << 10,
            linger=linger,
        )  # fmt: skip
        cfg = {"id": context_id, "language": language, "kernel": kernel, "workdir": cwd, "env": env or {}}
        src = _bridge_source()
        try:
            await self.process_input(context_id, b"%d\n" % len(src) + src + json.dumps(cfg).encode() + b"\n", eof=True)
        except AgentError:
            pass  # it ended already (no python3): its output says why
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                out = await self.process_output(context_id, since=(0, 0), wait=1.0, max_bytes=64 << 10)
                found = ready_line(context_id, out.stdout, out.info.running, info.started)
                if found is not None:
                    return found
                if not out.info.running:
                    raise _no_bridge(out.info.exit_code, out.stderr)
                if time.monotonic() > deadline:
                    raise KernelUnavailableError(f"the kernel did not start within {START_TIMEOUT:g} s", missing=[])
        except BaseException:
            with contextlib.suppress(AgentError):
                await self.process_kill(context_id, signal=9, grace=0.0)
            with contextlib.suppress(AgentError):
                await self.process_release(context_id)
            raise

    async def kernel_info(self: _Box, context_id: str) -> KernelInfo:
        s = _SESSIONS.get(self, {}).get(context_id)
        if s is not None and not s.closed:
            return s.info  # (connected: it runs; a bridge gone since is found at its next use)
        for p in await self.processes():
            if p.id == context_id:
                out = await self.process_output(context_id, since=(0, 0), max_bytes=64 << 10)
                found = ready_line(context_id, out.stdout, out.info.running, p.started)
                if found is not None:
                    return found
        raise AgentError(f"No code context {context_id} in this sandbox", code="not_found")

    async def kernel_session(self: _Box, context_id: str) -> KernelSession:
        sessions = _SESSIONS.setdefault(self, {})
        s = sessions.get(context_id)
        if s is not None and not s.closed:
            return s
        info = await KernelsMixin.kernel_info(self, context_id)
        if not info.running:
            raise AgentError(f"Code context {context_id}'s kernel has ended", code="conflict")
        tunnel = await self.open_tunnel(info.port)
        s = KernelSession(tunnel, info)
        try:
            hello = await s.request({"token": info.token}, "hello", 30.0)
        except BaseException:
            await s.close()
            raise
        if hello.get("protocol") != 1:
            await s.close()
            raise ProtocolError("the kernel bridge speaks another protocol")
        sessions[context_id] = s
        return s

    async def stop_kernel(self: _Box, context_id: str) -> None:
        s = _SESSIONS.get(self, {}).pop(context_id, None)
        if s is not None:
            await s.close()
        with contextlib.suppress(AgentError):
            await self.process_kill(context_id, signal=15, grace=2.0)
        with contextlib.suppress(AgentError):
            await self.process_release(context_id)
        for _ in range(25):  # its supervisor leaves within a few tenths of a second
            if all(p.id != context_id for p in await self.processes()):
                return
            await asyncio.sleep(0.1)


def _no_bridge(exit_code: int | None, stderr: bytes) -> KernelUnavailableError:
    err = stderr.decode("utf-8", "replace").strip()
    if exit_code == 127 or "python3: not found" in err:
        return KernelUnavailableError(missing_message([], "none"), missing=["python3"])
    return KernelUnavailableError(
        f"the kernel bridge ended before it was ready (exit status {exit_code}): {err[-1500:]}", missing=[]
    )
