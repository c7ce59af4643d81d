"""A backend that runs the agent as a plain host subprocess: **no isolation at all**.

Only for fast tests of the agent's semantics and of the registry and policy logic above
it (the same contract suite then runs on the Docker backend). Never use it for untrusted
commands: they would run on the host as the worker's own user.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from . import protocol
from .base import Sandbox, SandboxBackend
from .client import AgentSandbox
from .connection import AgentConnection, Transport


class ProcessTransport(Transport):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        self._stdout = proc.stdout
        self._stdin = proc.stdin
        self._stderr_task = asyncio.create_task(proc.stderr.read())
        self._stderr_sent = False

    async def read(self) -> tuple[bytes, bytes]:
        data = await self._stdout.read(1 << 16)
        if data:
            return data, b""
        if self._stderr_sent:
            return b"", b""
        self._stderr_sent = True
        return b"", await self._stderr_task

    async def write(self, data: bytes) -> None:
        self._stdin.write(data)
        await self._stdin.drain()

    async def close(self) -> None:
        if not self._stdin.is_closing():
            self._stdin.close()
        try:
            await asyncio.wait_for(self._proc.wait(), 5)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()
        if not self._stderr_task.done():
            self._stderr_task.cancel()


class LocalProcessBackend(SandboxBackend):
    """Runs the agent on the host, rooted at the workspace. Tests only; see module doc."""

    def __init__(self, *, activity_file: str | None = None) -> None:
        self._boxes: dict[Path, AgentSandbox] = {}
        self._activity = activity_file or "/tmp/.loom-activity-local"

    async def _connect(self, workspace: Path) -> AgentConnection:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-c",
            protocol.BOOTSTRAP,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=protocol.MAX_RESPONSE_BYTES,
        )
        conn = AgentConnection(ProcessTransport(proc), label=f"local:{workspace.name}")
        await conn.start({"root": str(workspace), "activity_file": self._activity})
        return conn

    async def get(self, workspace: Path) -> Sandbox:
        ws = Path(workspace).resolve()
        box = self._boxes.get(ws)
        if box is None:
            box = AgentSandbox(ws, lambda _lost: self._connect(ws))
            self._boxes[ws] = box
        return box

    async def stop(self, workspace: Path) -> bool:
        box = self._boxes.pop(Path(workspace).resolve(), None)
        if box is None:
            return False
        await box.close()
        return True

    async def aclose(self) -> None:
        for box in list(self._boxes.values()):
            await box.close()
        self._boxes.clear()
