"""A code context's kernel as the host sees it: :class:`KernelInfo` (what its bridge
announced in its first line of output, read by :func:`ready_line` as untrusted input)
and :class:`KernelSession` (one connection to the bridge, newline-delimited JSON over a
tunnel). The methods that start and find kernels are :mod:`sandbox.kernels`'."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .errors import KernelUnavailableError, ProtocolError, TunnelClosedError
from .tunnel import Tunnel

#: The kernel (its Jupyter kernel name) of each language a context may have.
KERNELS = {"python": "python3"}
#: Most bytes of one line from a bridge (a result carries images of up to 10 MiB, base64).
MAX_LINE = 64 << 20


@dataclass(frozen=True)
class KernelInfo:
    """A context's kernel as its bridge announced it: ``id`` (the background process's),
    ``language``, ``cwd`` (absolute, in the sandbox), ``env`` (on top of the sandbox's),
    ``port``/``token`` (where its bridge listens), ``running`` (the bridge is up: a kernel
    that died under it is replaced at the next execution)."""

    id: str
    language: str
    cwd: str
    port: int
    token: str
    env: dict[str, str] = field(default_factory=dict)
    running: bool = True
    started: float = 0.0
    #: ``cwd`` as it was asked for: relative to the workspace.
    workdir: str = "."


def ready_line(context_id: str, out: bytes, running: bool, started: float) -> KernelInfo | None:
    """The bridge's announcement in its output ``out`` (None: not yet). Raises
    KernelUnavailableError for the image's refusals, ProtocolError for garbage."""
    if b"\n" not in out:
        return None
    try:
        r = json.loads(out.split(b"\n", 1)[0])
    except ValueError:
        raise ProtocolError("the kernel bridge sent an invalid first line") from None
    if not isinstance(r, dict) or "loom_kernel_bridge" not in r:
        raise ProtocolError("the kernel bridge sent an invalid first line")
    if r.get("error") == "missing":
        missing = [str(m)[:64] for m in r.get("missing") or []][:10]
        raise KernelUnavailableError(missing_message(missing, str(r.get("python", "?"))[:32]), missing=missing)
    if r.get("error") is not None:
        detail = str(r.get("detail", ""))[-2000:]
        raise KernelUnavailableError(f"the kernel did not start: {detail}", missing=[])
    port, token, env = r.get("port"), r.get("token"), r.get("env") or {}
    if (
        not isinstance(port, int)
        or not 1 <= port <= 65535
        or not isinstance(token, str)
        or not 16 <= len(token) <= 128
        or not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise ProtocolError("the kernel bridge sent an invalid first line")
    return KernelInfo(
        id=context_id,
        language=str(r.get("language", ""))[:32],
        cwd=str(r.get("cwd", ""))[:4096],
        port=port,
        token=token,
        env=env,
        running=running,
        started=started,
        workdir=str(r.get("workdir", "."))[:4096],
    )


def missing_message(missing: list[str], python: str) -> str:
    """What the image lacks for a Python kernel, and how to add it."""
    names = ", ".join(missing) or "python3"
    if missing:
        what = f"this sandbox's python3 (Python {python}) cannot import {names}"
    else:
        what = "this sandbox's image has no python3"
    return (
        f"A Python code context needs python3 with ipykernel and jupyter_client in the sandbox's image: {what}. "
        "Use an image that has them (the default loom-sandbox:latest does; in a Debian Dockerfile: "
        "`RUN apt-get install -y python3-ipykernel python3-jupyter-client`, or "
        "`RUN pip install ipykernel jupyter_client`), or install them into this sandbox: allow PyPI "
        "(`loom-worker workspace set -w DIR --egress pypi`), then "
        "`pip install --user --break-system-packages ipykernel jupyter_client` (they last until the "
        "sandbox is replaced)."
    )


class KernelSession:
    """One connection to a context's bridge. Requests take turns (:attr:`lock`)."""

    def __init__(self, tunnel: Tunnel, info: KernelInfo) -> None:
        self.tunnel = tunnel
        self.info = info
        self.lock = asyncio.Lock()
        self._buf = bytearray()
        #: An execution runs on this connection (between its request and its ``end``).
        self.executing = False

    @property
    def closed(self) -> bool:
        return self.tunnel.closed

    async def send(self, obj: dict[str, Any]) -> None:
        """Raises TunnelClosedError."""
        await self.tunnel.write(json.dumps(obj).encode("utf-8", "surrogatepass") + b"\n")

    async def receive(self) -> dict[str, Any]:
        """The next object the bridge sent. Raises TunnelClosedError at the end (the bridge
        went: its kernel with it), ProtocolError for garbage."""
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 1]
                try:
                    obj = json.loads(line)
                except ValueError:
                    raise ProtocolError("the kernel bridge sent a line that is not JSON") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
                    raise ProtocolError("the kernel bridge sent something else than an event")
                return obj
            if len(self._buf) > MAX_LINE:
                await self.close()
                raise ProtocolError(f"the kernel bridge sent a line of more than {MAX_LINE} bytes")
            chunk = await self.tunnel.read()
            if not chunk:
                await self.close()
                raise TunnelClosedError(self.tunnel.error or "the kernel bridge closed the connection")
            self._buf += chunk

    async def request(self, obj: dict[str, Any], expect: str, timeout: float) -> dict[str, Any]:
        """Send ``obj``, wait for the answer of type ``expect``. Raises TunnelClosedError,
        ProtocolError, TimeoutError (the session is then closed)."""
        async with self.lock:
            try:
                async with asyncio.timeout(timeout):
                    await self.send(obj)
                    r = await self.receive()
            except TimeoutError:
                await self.close()
                raise
            if r.get("type") != expect:
                raise ProtocolError(f"the kernel bridge answered {r.get('type')!r} to {obj.get('op')!r}")
            return r

    async def execute(self, code: str, *, timeout: float, grace: float) -> AsyncIterator[dict[str, Any]]:
        """The bridge's events for ``code`` as they come, its ``end`` last. Hold
        :attr:`lock` around it. Raises TunnelClosedError (the bridge went), ProtocolError."""
        self.executing = True
        try:
            await self.send({"op": "execute", "code": code, "timeout": timeout, "grace": grace})
            while True:
                event = await self.receive()
                if event["type"] == "end":
                    self.executing = False
                yield event
                if event["type"] == "end":
                    return
        finally:
            self.executing = False

    async def interrupt(self) -> bool:
        """Interrupt the execution running on this connection, as Ctrl-C does (its events
        go on, then its ``end``: ``interrupted``, or ``restarted`` when it did not stop);
        False when none runs. Not under :attr:`lock` (the execution holds it). Raises
        TunnelClosedError."""
        if not self.executing:
            return False
        # (The bridge ignores an interrupt that comes after the execution's end, sent
        # before that end was read here.)
        await self.send({"op": "interrupt"})
        return True

    async def close(self) -> None:
        await self.tunnel.close()
