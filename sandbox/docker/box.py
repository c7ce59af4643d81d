"""The sandbox object the Docker backend hands out: an agent connection's sandbox that
knows its container, scans on the host under gVisor, and keeps agents of other users."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable
from typing import Any

from .. import users
from ..base import ExecResult, Sandbox, TreeRemoval
from ..client import AgentSandbox
from ..connection import AgentConnection
from ..errors import UserUnsupportedError
from ..hostscan import HostScanner
from ..logs import get_logger

log = get_logger("sandbox.docker")


class DockerSandbox(AgentSandbox):
    """An :class:`AgentSandbox` that knows its container (for tests and diagnostics).

    With ``host_scanner`` (gVisor sandboxes) scans of the workspace root and the removal of
    whole trees run on the host (see :mod:`sandbox.hostscan`): seconds in the sandbox,
    milliseconds here.
    """

    container_name: str
    host_scanner: HostScanner | None = None
    #: The workspace owner (uid, gid), whether root may run commands here, and how an
    #: agent of another user is started (set by the backend; see :meth:`as_user`).
    owner: tuple[int, int] = (-1, -1)
    allow_root: bool = False
    user_connect: Callable[[tuple[int, int]], Awaitable[AgentConnection]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Agents of other users, kept for their next commands (closed with this one).
        self._users: dict[tuple[int, int], AgentSandbox] = {}

    async def _scan(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        scanner = self.host_scanner
        if scanner is not None and req.get("path") == ".":
            quiet = scanner.scan_if_quiet(req)  # (a few system calls: on the loop)
            if quiet is not None:
                return quiet
            try:
                return await asyncio.to_thread(scanner.scan, req)
            except OSError as e:
                # The agent's full walk answers instead (slower, same result). A fork's
                # overlay not mounted yet is expected: the agent's scan starts its sandbox.
                report = log.info if e.errno == errno.ENOTCONN else log.warning
                report("sandbox.host_scan_failed", workspace=str(self.workspace), error=repr(e))
        return await super()._scan(req, timeout)

    async def remove_tree(self, path: str) -> TreeRemoval:
        scanner = self.host_scanner
        if scanner is not None:
            try:
                removed, (files, dirs, size) = await asyncio.to_thread(scanner.remove_tree, path)
                return TreeRemoval(removed=removed, files=files, dirs=dirs, bytes=size)
            except (OSError, ValueError) as e:
                # The agent removes what is left (slower, same result).
                log.info("sandbox.host_remove_fallback", workspace=str(self.workspace), error=repr(e))
        return await super().remove_tree(path)

    async def as_user(self, user: str) -> Sandbox | ExecResult:
        if not users.valid(user):
            raise UserUnsupportedError(f"{user!r} is not a user name or uid[:gid]")
        passwd = await self.read_path("/etc/passwd", max_bytes=4 << 20)
        found = users.resolve(user, passwd.data.decode("utf-8", "replace"))
        if found is None:
            message = users.NOT_FOUND.format(user=user) + "\n"
            return ExecResult(126, b"", message.encode(), "exit", 0.0, False, launch_error="user")
        if found == self.owner:
            return self
        if found[0] == 0 and not self.allow_root:
            raise UserUnsupportedError(
                f"this workspace does not run commands as root ({user}): its settings would have to allow it "
                "(allow_root: a writable root file system and the capabilities adduser needs; see docs/harness.md)"
            )
        box = self._users.get(found)
        if box is None:
            uid_gid: tuple[int, int] = found

            def connect(_lost: bool) -> Awaitable[AgentConnection]:
                return self.user_connect(uid_gid)

            box = self._users[found] = AgentSandbox(self.workspace, connect, io_timeout=self._io_timeout)
            box.oom_counter = self._count_ooms  # the same container's cgroup
        return box

    def _count_ooms(self) -> int | None:
        counter = self.oom_counter
        return counter() if counter is not None else None

    async def close(self) -> None:
        if self.host_scanner is not None:
            self.host_scanner.close()
        for box in list(self._users.values()):
            await box.close()
        self._users.clear()
        await super().close()
