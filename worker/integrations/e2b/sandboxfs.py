"""A sandbox's files and directories as E2B's envd serves them, on loom's harness API:
E2B's paths and users mapped, and every change inside the workspace recorded in its
changelog (undoable, in the dashboard's timeline) like a harness's command.

Paths: absolute, ``~``-prefixed or relative to ``/home/user`` (the workspace,
:func:`.target.to_loom`); answers give them back as E2B's (``/home/user/...``). Users:
E2B's default user ``user`` (or none) is the workspace's owner, the user the sandbox
runs as; another name is run as that user of the image where the workspace allows it
(``root`` only with ``allow_root``).

Reads go straight to the sandbox's agent (:class:`~sandbox.capabilities.HarnessTree`).
A change (make a directory, move, remove) whose path is in the workspace is bracketed
with the changelog's scans (:meth:`Workspace.run_recorded
<worker.workspace.Workspace.run_recorded>`), so it is an entry of its own call id; one
that is outside it is made as it is, unrecorded (``/tmp``: the sandbox's scratch space),
and one that reaches the workspace through a link is refused by the agent and made again,
recorded. A file's content goes through :meth:`SandboxHandle.write_file
<worker.harness.SandboxHandle.write_file>` (recorded before it is written), or, for a
large one, in pieces inside a recorded bracket.
"""

from __future__ import annotations

import builtins
import posixpath
import secrets
import shlex
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import TypeVar

from sandbox.base import ExecResult, Sandbox
from sandbox.capabilities import HarnessTree, harness_files, harness_tree
from sandbox.errors import InWorkspaceError
from sandbox.harness import HarnessMixin
from sandbox.results import PathEntry
from sandbox.treeops import PathReader, PathWatch
from worker.result import ToolResult
from worker.workspace import Workspace

from .errors import EnvdInvalid, UnknownUser
from .target import E2B_HOME, Target, to_e2b, to_loom

T = TypeVar("T")

#: E2B's default user: the workspace's owner.
DEFAULT_USER = "user"
#: A file up to this size is written in one recorded write; a larger one in pieces.
WHOLE_WRITE = 16 << 20


def e2b_path(path: str) -> str:
    """The absolute E2B path a request names: ``~`` is ``/home/user``, a relative path is
    below it, ``..`` resolved. Raises EnvdInvalid (``~name``, a NUL)."""
    if "\x00" in path:
        raise EnvdInvalid(f"path {path!r} contains a NUL byte")
    if path.startswith("~"):
        if len(path) > 1 and path[1] != "/":
            raise EnvdInvalid(f"failed to expand path '{path}': cannot expand user-specific home dir")
        path = E2B_HOME + path[1:]
    return posixpath.normpath(posixpath.join(E2B_HOME, path)) if path else E2B_HOME


def _inside(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


class SandboxFiles:
    """One request's view of ``target``'s files, as ``user`` (None: E2B's default)."""

    def __init__(self, target: Target, user: str | None = None) -> None:
        self.target = target
        self.user = user or None

    async def workspace(self) -> Workspace:
        ws = await self.target.workspace()
        self.target.service.runner.opened.add(self.target.path)  # (stopped with the service)
        return ws

    async def tree(self, ws: Workspace | None = None) -> HarnessTree:
        """The sandbox's agent for this request's user. Raises UnknownUser,
        UserUnsupportedError, NotImplementedError (a backend without the calls)."""
        ws = ws or await self.workspace()
        box: Sandbox = ws.sandbox
        if self.user is not None and self.user != DEFAULT_USER:
            if not isinstance(box, HarnessMixin):
                raise UnknownUser(f"invalid username: '{self.user}' (this sandbox runs as one user)")
            got = await box.as_user(self.user)
            if isinstance(got, ExecResult):
                raise UnknownUser(f"invalid username: '{self.user}'")
            box = got
        return harness_tree(box)

    # -- reads ------------------------------------------------------------------------

    async def stat(self, path: str) -> tuple[str, PathEntry]:
        """(E2B path, entry). Raises PathNotFoundError, PermissionDeniedError, EnvdInvalid."""
        shown = e2b_path(path)
        return shown, await (await self.tree()).stat_path(to_loom(shown))

    async def list(self, path: str, depth: int) -> list[tuple[str, PathEntry]]:
        """(E2B path, entry) under ``path`` to ``depth`` levels. Raises as ``list_path``."""
        shown = e2b_path(path)
        entries = await (await self.tree()).list_path(to_loom(shown), depth=depth)
        return [(posixpath.join(shown, e.rel or e.name), e) for e in entries]

    async def watch(self, path: str, recursive: bool) -> PathWatch:
        """A watch of directory ``path`` (see :class:`~sandbox.treeops.PathWatch`)."""
        return await (await self.tree()).watch_path(to_loom(e2b_path(path)), recursive=recursive)

    async def open(self, path: str) -> PathReader:
        """The file at ``path`` to stream (its first piece read). Raises as ``read_path``."""
        return await (await self.tree()).open_path(to_loom(e2b_path(path)))

    # -- changes ----------------------------------------------------------------------

    async def make_dir(self, path: str) -> tuple[str, PathEntry]:
        shown = e2b_path(path)
        target = to_loom(shown)
        entry = await self._change(
            [target],
            f"mkdir -p {shlex.quote(shown)}",
            "e2b.make_dir",
            lambda t, rec: t.mkdir_path(target, in_workspace=rec),
        )
        return shown, entry

    async def move(self, source: str, destination: str) -> tuple[str, PathEntry]:
        src, dst = e2b_path(source), e2b_path(destination)
        a, b = to_loom(src), to_loom(dst)
        command = f"mv {shlex.quote(src)} {shlex.quote(dst)}"
        entry = await self._change([a, b], command, "e2b.move", lambda t, rec: t.move_path(a, b, in_workspace=rec))
        return dst, entry

    async def remove(self, path: str) -> None:
        shown = e2b_path(path)
        target = to_loom(shown)
        await self._change(
            [target],
            f"rm -rf {shlex.quote(shown)}",
            "e2b.remove",
            lambda t, rec: t.remove_path(target, in_workspace=rec),
        )

    async def _change(
        self, paths: builtins.list[str], command: str, tool: str, run: Callable[[HarnessTree, bool], Awaitable[T]]
    ) -> T:
        """``run`` a change of ``paths``: as it is when none is in the workspace, else (or
        when the agent finds it reaches the workspace through a link) bracketed by the
        changelog as ``command``, one call of ``tool`` in the journal."""
        ws = await self.workspace()
        tree = await self.tree(ws)
        mount = ws.sandbox.workspace_mount
        if not any(_inside(p, mount) for p in paths):
            try:
                return await run(tree, False)
            except InWorkspaceError:
                pass  # through a link: recorded after all
        call_id = "call_" + secrets.token_hex(8)
        started = time.perf_counter()
        value, changed = await ws.run_recorded(command, lambda: run(tree, True), tool=tool, call_id=call_id)
        self._journal(ws, tool, {"command": command}, ToolResult.ok(command, None, changed), call_id, started)
        return value

    async def write(self, path: str, data: bytes) -> str:
        """Write ``data`` to ``path`` (parents made, a file there replaced); returns the
        E2B path. Raises what ``SandboxHandle.write_file`` raises."""
        shown = e2b_path(path)
        target = to_loom(shown)
        ws = await self.workspace()
        if self._as_owner() or _inside(target, ws.sandbox.workspace_mount):
            # (the workspace's files are its owner's, whoever asks)
            await self.target.handle.write_file(target, data, call_id="call_" + secrets.token_hex(8))
            return shown
        tree = await self.tree(ws)
        try:
            await harness_files(tree).write_path(target, data)
        except InWorkspaceError:  # a link into the workspace on the way
            await self.target.handle.write_file(target, data, call_id="call_" + secrets.token_hex(8))
        return shown

    async def write_pieces(self, path: str, total: int, pieces: Callable[[], AsyncIterable[bytes]]) -> str:
        """Write a large file (``total`` bytes, from the iterable ``pieces()`` makes: it
        may be asked for twice) never holding it whole: inside the workspace staged in
        pieces and put in place inside a recorded bracket. Returns the E2B path. Raises
        as ``write_path_pieces``."""
        shown = e2b_path(path)
        target = to_loom(shown)
        ws = await self.workspace()
        mount = ws.sandbox.workspace_mount
        if not _inside(target, mount):
            try:
                await (await self.tree(ws)).write_path_pieces(target, total, pieces())
                return shown
            except InWorkspaceError as e:  # a link into the workspace on the way
                target = posixpath.join(mount, str(e))
        rel = posixpath.relpath(target, mount)
        if rel == ".":
            raise EnvdInvalid(f"path '{shown}' is a directory")
        owner = harness_tree(ws.sandbox)  # (the workspace's files are its owner's)
        call_id = "call_" + secrets.token_hex(8)
        started = time.perf_counter()
        command = f"write {total} bytes to {shlex.quote(shown)}"

        async def run() -> int:
            return await owner.write_path_pieces(rel, total, pieces(), in_workspace=True)

        _, changed = await ws.run_recorded(command, run, tool="e2b.write", call_id=call_id)
        result = ToolResult.ok(f"wrote {total} bytes to {shown}", None, changed)
        self._journal(ws, "e2b.write", {"path": shown, "data": f"[{total} bytes]"}, result, call_id, started)
        return shown

    def _as_owner(self) -> bool:
        return self.user is None or self.user == DEFAULT_USER

    def _journal(
        self, ws: Workspace, tool: str, brief: dict[str, object], result: ToolResult, call_id: str, t0: float
    ) -> None:
        """One line in the workspace's call journal (the dashboard's timeline)."""
        journal = self.target.registry.journal
        if journal is None:
            return
        duration = (time.perf_counter() - t0) * 1000.0
        journal.record(ws.root, tool, brief, result.capped(), duration, call_id=call_id, subtask_id=None, root=ws.root)


__all__ = ["DEFAULT_USER", "WHOLE_WRITE", "SandboxFiles", "e2b_path", "to_e2b"]
