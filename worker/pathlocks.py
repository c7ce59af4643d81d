"""Mutations of one path of a workspace, one at a time, in arrival order.

``edit_file`` reads a file, applies its edits and writes the result only if the file
still has the hash it read (the agent checks, right before its rename). Two edits of one
file sent at once (a model's parallel tool calls) would both read the same content and
the second write would be refused as a conflict, although nothing outside changed the
file. :class:`PathLocks` makes such calls take turns: each holds its path from the read
to the write, so it starts from the state the previous one left, and a conflict is left
to mean what it says: the file changed under the call from outside (a shell command,
another process).

What is held is a *claim* on a path. Two claims conflict when their paths are the same,
or one is a directory above the other (a write of ``d/a.txt`` and a removal of ``d``),
compared lexically and, when that alone does not say so, by the path the symlinks inside
the workspace lead to (``link.txt -> a.txt``: the same file). A new claim waits for every
earlier claim it conflicts with, so claims of one path run in arrival order and claims of
unrelated paths never wait for each other. There is no lock object per path and nothing
is kept once a claim ends; an uncontended claim costs a list append and removal.

The real path is found on the host, in the workspace's own directory, by the rules of the
in-container agent (``sandbox/agent/paths.py``): a link is followed while it stays inside
the workspace, an absolute target below ``/workspace`` is the workspace's. It is looked up
only when another claim is held in the same workspace, a few ``lstat`` calls made on the
event loop (a thread hop would cost more than they do). It is only ever a key: a link
swapped meanwhile costs at most a conflict reported by the conditional write, never a
lost change, and nothing is read from or written to the files here.
"""

from __future__ import annotations

import asyncio
import os
import stat
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from sandbox.spec import WORKSPACE_MOUNT as CONTAINER_ROOT  # (worker.policy.paths would import worker.tool: a cycle)

#: Symlink hops followed before giving up (the agent's own limit).
MAX_HOPS = 40


class _Claim:
    """One claim on a path: the async context manager :meth:`PathLocks.hold` returns."""

    __slots__ = ("done", "ended", "locks", "path", "real")

    def __init__(self, locks: PathLocks, path: str) -> None:
        self.locks = locks
        self.path = path
        self.real: str | None = None  # the path through the links, once looked up
        self.done: asyncio.Event | None = None  # made by the first claim that waits for it
        self.ended = False

    async def __aenter__(self) -> None:
        locks = self.locks
        claims = locks._claims
        earlier = [c for c in claims if locks._conflict(c, self)] if claims else None
        claims.append(self)
        if earlier:
            try:
                for c in earlier:
                    if c.ended:  # (also one cancelled while this one waited for another)
                        continue
                    if c.done is None:
                        c.done = asyncio.Event()
                    await c.done.wait()
            except BaseException:  # cancelled while waiting: those after it go on
                self._release()
                raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        self.locks._claims.remove(self)
        self.ended = True
        if self.done is not None:
            self.done.set()


def _overlap(a: str, b: str) -> bool:
    """Same path, or one is a directory above the other ("." is above everything)."""
    if a == b or a == "." or b == ".":
        return True
    return b.startswith(a + "/") or a.startswith(b + "/")


class PathLocks:
    """The claims on the paths of one workspace (``root``, its real host directory)."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self._claims: list[_Claim] = []

    def hold(self, path: str) -> AbstractAsyncContextManager[None]:
        """Hold workspace-relative, normalized ``path`` (see the module docstring) for the
        body of ``async with``; waits for the earlier conflicting claims to end first. Not
        reentrant: a body must not claim a path its own claim conflicts with (it would
        wait for itself)."""
        return _Claim(self, path)

    def held(self) -> list[str]:
        """The paths claimed now, in arrival order (waiting or running)."""
        return [c.path for c in self._claims]

    def _conflict(self, a: _Claim, b: _Claim) -> bool:
        if _overlap(a.path, b.path):
            return True
        if a.real is None:
            a.real = resolve(self.root, a.path)
        if b.real is None:
            b.real = resolve(self.root, b.path)
        return _overlap(a.real, b.real)


def resolve(root: str, path: str) -> str:
    """``path`` (workspace-relative, normalized) with the symlinks inside the workspace
    under host directory ``root`` followed as the agent follows them; what does not exist
    stays as written. A link that leaves the workspace, a loop, or anything the host cannot
    look at leaves ``path`` as given (the agent refuses such paths anyway)."""
    stack = [] if path == "." else path.split("/")
    cur: list[str] = []
    hops = 0
    while stack:
        comp = stack.pop(0)
        here = os.path.join(root, *cur, comp)
        try:
            st = os.lstat(here)
        except OSError:
            return "/".join([*cur, comp, *stack])
        if not stat.S_ISLNK(st.st_mode):
            cur.append(comp)
            continue
        hops += 1
        try:
            target = os.readlink(here)
        except OSError:
            return path
        base = _link_base(cur, target)
        if base is None or hops > MAX_HOPS:
            return path
        stack = base + stack
        cur = []
    return "/".join(cur) or "."


def _link_base(cur: list[str], target: str) -> list[str] | None:
    """The workspace-relative components a link in directory ``cur`` points to, or None
    when it leaves the workspace."""
    if target.startswith("/"):
        if target != CONTAINER_ROOT and not target.startswith(CONTAINER_ROOT + "/"):
            return None
        target, cur = target[len(CONTAINER_ROOT) :], []
    base = list(cur)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not base:
                return None
            base.pop()
        else:
            base.append(part)
    return base
