"""A backend that runs the agent as a plain host subprocess: **no isolation at all**.

Only for fast tests of the agent's semantics and of the registry and policy logic above
it (the same contract suite then runs on the Docker backend). Never use it for untrusted
commands: they would run on the host as the worker's own user.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

from . import protocol
from .base import Sandbox, SandboxBackend
from .client import AgentSandbox
from .connection import AgentConnection, ProtocolFeed, Transport
from .errors import SandboxLostError
from .identity import workspace_key


class _AgentProcessProtocol(asyncio.SubprocessProtocol):
    """The agent subprocess's pipes: stdout and stderr are pushed as they arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.SubprocessTransport | None = None
        self.feed = ProtocolFeed(self._reading)
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._open = {1, 2}  # output pipes not closed yet

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.SubprocessTransport, transport)  # uvloop's is no subclass

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self.feed.data(data, b"")
        else:
            self.feed.data(b"", data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        # End of stream once stdout and stderr are both closed, so the agent's last words
        # (a traceback on stderr) are in the connection's diagnostics.
        if fd in self._open:
            self._open.discard(fd)
            if not self._open or exc is not None:
                self.feed.eof(exc)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def pause_writing(self) -> None:
        self.feed.pause_writing()

    def resume_writing(self) -> None:
        self.feed.resume_writing()

    def _reading(self, on: bool) -> None:
        pipe = self.transport.get_pipe_transport(1) if self.transport is not None else None
        if isinstance(pipe, asyncio.ReadTransport) and not pipe.is_closing():
            if on:
                pipe.resume_reading()
            else:
                pipe.pause_reading()


class ProcessTransport(Transport):
    """The agent as a host subprocess, its pipes read by a protocol (push mode)."""

    def __init__(self, transport: asyncio.SubprocessTransport, proto: _AgentProcessProtocol) -> None:
        self._transport = transport
        self._proto = proto
        stdin = transport.get_pipe_transport(0)
        if stdin is None:
            raise SandboxLostError("the agent process has no stdin pipe")
        self._stdin = cast(asyncio.WriteTransport, stdin)

    @classmethod
    async def spawn(cls, *argv: str) -> ProcessTransport:
        loop = asyncio.get_running_loop()
        # What a container's agent finds: a PATH, HOME and USER, not this process's whole
        # environment (commands start from the agent's, see sandbox.agent.state.image_env).
        env = {k: os.environ[k] for k in ("PATH", "HOME", "USER") if k in os.environ}
        env["LANG"] = "C.UTF-8"
        transport, proto = await loop.subprocess_exec(
            _AgentProcessProtocol,
            *argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        return cls(transport, proto)

    def start(self, on_data: Callable[[bytes, bytes], None], on_eof: Callable[[str], None]) -> bool:
        return self._proto.feed.start(on_data, on_eof)

    async def read(self) -> tuple[bytes, bytes]:
        return await self._proto.feed.read()

    async def write(self, data: bytes) -> None:
        self._proto.feed.check_open()
        if self._stdin.is_closing():
            raise BrokenPipeError("the agent's stdin is closed")
        self._stdin.write(data)
        await self._proto.feed.drain()

    async def close(self) -> None:
        if not self._stdin.is_closing():
            self._stdin.close()  # EOF: the agent exits, killing what it started
        try:
            await asyncio.wait_for(asyncio.shield(self._proto.exited), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._transport.kill()
            await self._proto.exited
        self._transport.close()


class LocalProcessBackend(SandboxBackend):
    """Runs the agent on the host, rooted at the workspace. Tests only; see module doc."""

    def __init__(self, *, activity_file: str | None = None) -> None:
        self._boxes: dict[Path, AgentSandbox] = {}
        self._activity = activity_file or "/tmp/.loom-activity-local"

    async def _connect(self, workspace: Path) -> AgentConnection:
        transport = await ProcessTransport.spawn(sys.executable, "-I", "-c", protocol.BOOTSTRAP)
        conn = AgentConnection(transport, label=f"local:{workspace.name}")
        # Each workspace's background processes in a directory of its own (in a container
        # the agent's /tmp is the sandbox's own).
        procs = "/tmp/.loom-procs-local-" + workspace_key(workspace)
        await conn.start({"root": str(workspace), "activity_file": self._activity, "procs_dir": procs})
        return conn

    async def get(self, workspace: Path) -> Sandbox:
        ws = Path(workspace).resolve()
        box = self._boxes.get(ws)
        if box is None:
            box = AgentSandbox(ws, lambda _lost: self._connect(ws))
            box.workspace_mount = str(ws)  # the agent runs on the host, rooted there
            self._boxes[ws] = box
        return box

    async def stop(self, workspace: Path) -> bool:
        box = self._boxes.pop(Path(workspace).resolve(), None)
        if box is None:
            return False
        await _end_processes(box)
        await box.close()
        return True

    async def aclose(self) -> None:
        for box in list(self._boxes.values()):
            await _end_processes(box)
            await box.close()
        self._boxes.clear()


async def _end_processes(box: AgentSandbox) -> None:
    """What a container's removal does to its background processes: end them all (their
    supervisors are not children of this agent)."""
    with contextlib.suppress(Exception):
        for p in await box.processes():
            if p.running:
                await box.process_kill(p.id, grace=0.0)
            await box.process_release(p.id)
