"""Which sandbox an envd or code-interpreter request is for, and the paths E2B uses.

E2B's SDKs send every request of a sandbox to one address (``E2B_SANDBOX_URL``) with the
headers ``E2b-Sandbox-Id`` (the sandbox) and ``E2b-Sandbox-Port`` (49983: envd, 49999:
the code interpreter), so one listener serves any number of sandboxes. A sandbox is a
loom workspace of the same id.

E2B's sandboxes have a user ``user`` whose home and working directory is ``/home/user``;
loom mounts the workspace at ``/workspace``. :func:`to_loom` and :func:`to_e2b` map one to
the other, so that what an E2B client writes under ``/home/user`` is the workspace.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from worker.harness import SandboxHandle
from worker.http.state import Service
from worker.registry.contract import LocalRegistry
from worker.workspace import Workspace

from .plane import gate

#: envd's port, and the code interpreter's (the values of ``E2b-Sandbox-Port``).
ENVD_PORT = 49983
JUPYTER_PORT = 49999
#: E2B's user's home: the workspace.
E2B_HOME = "/home/user"
LOOM_MOUNT = "/workspace"


class SandboxNotFound(LookupError):
    """No sandbox of that id, or one that is not running (killed, timed out, paused): E2B
    answers 404 on its control plane; the proxy in front of a sandbox's own API answers
    502 with this message, which says "was not found"."""


@dataclass(frozen=True)
class Target:
    """The sandbox a request is for."""

    service: Service
    sandbox_id: str
    path: Path
    port: int

    @property
    def registry(self) -> LocalRegistry:
        return self.service.local

    @property
    def handle(self) -> SandboxHandle:
        """The harness API of its sandbox (commands, files, terminals, code contexts)."""
        return self.registry.sandbox(self.path)

    async def workspace(self) -> Workspace:
        return await self.registry.workspace(self.path)


def sandbox_id_of(request: Request) -> str | None:
    """The ``E2b-Sandbox-Id`` header (None without one)."""
    return request.headers.get("e2b-sandbox-id") or None


def port_of(request: Request) -> int:
    """The ``E2b-Sandbox-Port`` header (envd's port without one)."""
    try:
        return int(request.headers.get("e2b-sandbox-port") or ENVD_PORT)
    except ValueError:
        return ENVD_PORT


async def target_of(request: Request, sandbox_id: str | None = None) -> Target:
    """The sandbox ``request`` is for: ``sandbox_id`` or its ``E2b-Sandbox-Id`` header.
    Raises SandboxNotFound (no such sandbox, no header, or one E2B's API no longer shows:
    killed, its time up, paused; the message has E2B's words, "was not found", which its
    SDKs read in a 502 to tell a sandbox that is not running), NotStartedError."""
    service: Service = request.app.state.service
    sid = sandbox_id or sandbox_id_of(request)
    if not sid:
        raise SandboxNotFound("no sandbox named: send the E2b-Sandbox-Id header")
    try:
        path = await service.workspaces.locate(sid)
    except (LookupError, ValueError, OSError) as e:
        raise SandboxNotFound(f"the sandbox {sid} was not found") from e
    refused = await gate(request.app, sid, path)
    if refused is not None:
        raise SandboxNotFound(refused)
    return Target(service, sid, path, port_of(request))


def to_loom(path: str, cwd: str = E2B_HOME) -> str:
    """An E2B path (absolute, or relative to ``cwd``) as loom's sandbox names it:
    ``/home/user/...`` is ``/workspace/...``; anything else stays (``/tmp``, ``/etc``)."""
    full = posixpath.normpath(posixpath.join(cwd, path)) if path else cwd
    if full == E2B_HOME or full.startswith(E2B_HOME + "/"):
        return LOOM_MOUNT + full[len(E2B_HOME) :]
    return full


def to_e2b(path: str) -> str:
    """A path as loom's sandbox names it, as E2B's clients expect it (the reverse of
    :func:`to_loom`)."""
    if path == LOOM_MOUNT or path.startswith(LOOM_MOUNT + "/"):
        return E2B_HOME + path[len(LOOM_MOUNT) :]
    return path
