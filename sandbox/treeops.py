"""The Sandbox side of a harness's directories anywhere in the sandbox
(:class:`~sandbox.capabilities.HarnessTree`): describe, list, make, move, remove and
watch paths as the sandbox's user, and read or write a file in pieces (a large file
streamed, never whole in memory). Mixed into :class:`~sandbox.client.AgentSandbox`; the
agent's side is ``sandbox/agent/fsops.py`` and ``sandbox/agent/fswatch.py``.

A change inside the workspace is the changelog's: the caller brackets it with its change
scans and says so (``in_workspace=True``); without that, a change that would touch the
workspace (also through a link) is refused with :class:`~sandbox.errors.InWorkspaceError`
and nothing changes. Every answer is checked as untrusted (:mod:`sandbox.answers`).
"""

from __future__ import annotations

import asyncio
import builtins
import itertools
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from .answers import check_int, check_str
from .errors import AgentError, ConflictError, ProtocolError, SandboxLostError, TooLargeError
from .results import PathEntry, WatchEvent, WatchEventType

if TYPE_CHECKING:
    from .connection import AgentConnection

#: Host deadline slack over the agent's own budget (``sandbox.client.DEADLINE_SLACK``).
_SLACK = 5.0
#: The pieces a large file is read and written in.
PIECE = 4 << 20
#: Most entries one listing may return (the agent's ``fsops.MAX_ENTRIES``).
MAX_ENTRIES = 100_000
#: Events a watch holds for a reader that does not keep up; beyond, the watch ends.
MAX_WAITING = 20_000
_PATH_LIMIT = 8192
_TYPES = {"file", "dir", "other"}
_EVENT_TYPES = {"create", "write", "remove", "rename", "chmod"}
_watch_ids = itertools.count(1)
#: Stop notifications sent from callbacks, kept referenced until written.
_PENDING: set[asyncio.Task[None]] = set()


def _entry(v: Any, base: str | None = None) -> PathEntry:
    """An entry as the agent described it (``base``: the listed directory)."""
    if not isinstance(v, dict):
        raise ProtocolError("agent sent an invalid entry")
    kind = v.get("type")
    if kind not in _TYPES:
        raise ProtocolError(f"agent sent an unknown entry type {kind!r:.40}")
    name = check_str(v.get("name"), "name", limit=4096)
    rel = None
    if base is not None:
        rel = check_str(v.get("rel"), "rel", limit=_PATH_LIMIT)
        if not rel or rel.startswith("/") or "\x00" in rel or ".." in rel.split("/"):
            raise ProtocolError("agent sent an invalid relative path")
        path = base.rstrip("/") + "/" + rel
    else:
        path = ""
    target = v.get("target")
    return PathEntry(
        path=path,
        name=name,
        type=cast(Any, kind),
        size=check_int(v.get("size"), "size"),
        mode=check_int(v.get("mode"), "mode"),
        perm=check_int(v.get("perm"), "perm") & 0o777,
        uid=check_int(v.get("uid"), "uid"),
        gid=check_int(v.get("gid"), "gid"),
        owner=check_str(v.get("owner"), "owner", limit=256),
        group=check_str(v.get("group"), "group", limit=256),
        mtime_ns=check_int(v.get("mtime_ns"), "mtime_ns", lo=-(1 << 62)),
        symlink=v.get("symlink") is True,
        target=None if target is None else check_str(target, "target", limit=_PATH_LIMIT),
        rel=rel,
    )


def _with_path(e: PathEntry, path: str) -> PathEntry:
    from dataclasses import replace

    return replace(e, path=path)


class PathWatch:
    """A watched directory's changes as they come (:meth:`HarnessTree.watch_path
    <sandbox.capabilities.HarnessTree.watch_path>`). :meth:`next` waits for some,
    :meth:`pending` takes what came; :meth:`close` stops the watch (in the agent too).
    A watch that ended (the sandbox lost, the agent's queue overflowed, more than
    :data:`MAX_WAITING` events waiting here) raises its error once what came before was
    taken."""

    def __init__(self, conn: AgentConnection, wid: int) -> None:
        self._conn = conn
        self.id = wid
        self._events: deque[WatchEvent] = deque()
        self._ready = asyncio.Event()
        self.error: Exception | None = None
        self.closed = False

    def _on_event(self, msg: dict[str, Any]) -> None:
        """The agent's events for this watch (called on the event loop, in order)."""
        if self.closed or self.error is not None:
            return
        if msg.get("event") == "lost":
            self._end(SandboxLostError(f"the sandbox went away while watching ({msg.get('reason', '')})"))
            return
        if "error" in msg:
            self._end(AgentError(check_str(msg.get("error"), "error", limit=4000), code="limit"), notify=False)
            return
        raw = msg.get("events")
        if not isinstance(raw, list):
            raise ProtocolError("agent sent an invalid watch event")
        for item in raw:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not isinstance(item[0], str)
                or len(item[0]) > _PATH_LIMIT
                or item[1] not in _EVENT_TYPES
            ):
                raise ProtocolError("agent sent an invalid watch event")
            self._events.append(WatchEvent(item[0], cast(WatchEventType, item[1])))
        if len(self._events) > MAX_WAITING:
            self._events.clear()
            self._end(
                TooLargeError(
                    f"more than {MAX_WAITING} changes waited to be read: the watch was stopped (read its events "
                    "more often, or watch a smaller tree)",
                    code="limit",
                )
            )
            return
        self._ready.set()

    def _end(self, error: Exception, *, notify: bool = True) -> None:
        self.error = error
        self._ready.set()
        self._conn.set_stream_handler("watch", self.id, None)
        if notify and not self._conn.closed:
            task = asyncio.get_running_loop().create_task(self._stop())
            _PENDING.add(task)
            task.add_done_callback(_PENDING.discard)

    async def _stop(self) -> None:
        try:
            await self._conn.notify("watch_stop", {"watch": self.id})
        except SandboxLostError:
            pass  # (the agent stops its watches when the host goes)

    def pending(self) -> builtins.list[WatchEvent]:
        """The changes that came since the last call (none: an empty list). Raises the
        watch's error once it ended and nothing is left before it."""
        if not self._events and self.error is not None:
            raise self.error
        out = list(self._events)
        self._events.clear()
        self._ready.clear()
        return out

    async def next(
        self, timeout: float | None = None, *, stop: asyncio.Future[Any] | None = None
    ) -> builtins.list[WatchEvent]:
        """The changes that came, waiting up to ``timeout`` seconds (None: for ever) for
        the first, or until ``stop`` is done; an empty list when none came by then.
        Raises as :meth:`pending`."""
        if not self._events and self.error is None:
            ready = asyncio.ensure_future(self._ready.wait())
            try:
                await asyncio.wait(
                    [ready, stop] if stop is not None else [ready], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                ready.cancel()
            if not self._ready.is_set():
                return []
        return self.pending()

    async def close(self) -> None:
        """Stop watching (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._conn.set_stream_handler("watch", self.id, None)
        if self.error is None and not self._conn.closed:
            await self._stop()


class PathReader:
    """A file read in pieces (:meth:`HarnessTree.open_path`): its ``size``, then its bytes
    as an async iterator. Every piece must come from the same unchanged file, or the
    iteration raises ConflictError."""

    def __init__(self, box: TreeMixin, path: str, first: dict[str, Any], piece: int) -> None:
        self._box = box
        self.path = path
        self._piece = piece
        self.size = check_int(first.get("size"), "size")
        self._ident = self._identity(first)
        self._first = self._data(first, piece)

    @staticmethod
    def _identity(r: dict[str, Any]) -> tuple[int, ...]:
        return tuple(check_int(r.get(k), k, lo=-(1 << 62)) for k in ("size", "dev", "ino", "mtime_ns", "ctime_ns"))

    @staticmethod
    def _data(r: dict[str, Any], want: int) -> bytes:
        raw = r.get("_raw")
        if not isinstance(raw, bytes) or len(raw) > want:
            raise ProtocolError("agent sent an invalid file read")
        return raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        data, offset = self._first, len(self._first)
        self._first = b""
        if data:
            yield data
        while offset < self.size:
            r = await self._box._call("fs_read", {"path": self.path, "offset": offset, "length": self._piece})
            if self._identity(r) != self._ident:
                raise ConflictError(f"Conflict: {self.path} changed while it was read", code="conflict")
            data = self._data(r, self._piece)
            if not data:
                return
            offset += len(data)
            yield data


class TreeMixin:
    """The :class:`~sandbox.capabilities.HarnessTree` calls over the agent (see the
    module docstring)."""

    _io_timeout: float

    async def connection(self) -> AgentConnection:
        raise NotImplementedError

    async def _call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        raise NotImplementedError

    async def stat_path(self, path: str) -> PathEntry:
        r = await self._call("fs_stat", {"path": path})
        return _with_path(_entry(r.get("entry")), path)

    async def list_path(self, path: str, *, depth: int = 1, limit: int = MAX_ENTRIES) -> builtins.list[PathEntry]:
        if depth < 1:
            raise ValueError("depth is at least 1")
        # Generous: a deep tree takes a while, more under gVisor.
        r = await self._call("fs_list", {"path": path, "depth": depth, "limit": limit}, max(self._io_timeout, 300.0))
        raw = r.get("entries")
        if not isinstance(raw, list) or len(raw) > limit:
            raise ProtocolError("agent sent an invalid listing")
        return [_entry(v, path) for v in raw]

    async def mkdir_path(self, path: str, *, in_workspace: bool = False) -> PathEntry:
        r = await self._call("fs_mkdir", {"path": path, "recorded": in_workspace})
        return _with_path(_entry(r.get("entry")), path)

    async def move_path(self, source: str, destination: str, *, in_workspace: bool = False) -> PathEntry:
        args = {"source": source, "destination": destination, "recorded": in_workspace}
        r = await self._call("fs_move", args, max(self._io_timeout, 300.0))  # (across file systems: a copy)
        return _with_path(_entry(r.get("entry")), destination)

    async def remove_path(self, path: str, *, in_workspace: bool = False) -> bool:
        r = await self._call("fs_remove", {"path": path, "recorded": in_workspace}, max(self._io_timeout, 600.0))
        return r.get("removed") is True

    async def watch_path(self, path: str, *, recursive: bool = False) -> PathWatch:
        conn = await self.connection()
        watch = PathWatch(conn, next(_watch_ids))
        conn.set_stream_handler("watch", watch.id, watch._on_event)
        try:
            args = {"watch": watch.id, "path": path, "recursive": recursive}
            await conn.request("watch_start", args, timeout=self._io_timeout + _SLACK)
        except BaseException:
            conn.set_stream_handler("watch", watch.id, None)
            raise
        return watch

    async def open_path(self, path: str, *, piece: int = PIECE) -> PathReader:
        if not path.startswith("/"):
            raise ValueError("open_path takes an absolute path")
        first = await self._call("fs_read", {"path": path, "offset": 0, "length": piece})
        return PathReader(self, path, first, piece)

    async def write_path_pieces(
        self,
        path: str,
        total: int,
        pieces: AsyncIterable[bytes],
        *,
        in_workspace: bool = False,
        piece: int = PIECE,
    ) -> int:
        """Write ``total`` bytes taken from ``pieces`` to ``path``: the absolute path as
        :meth:`~sandbox.capabilities.HarnessFiles.write_path` writes it, or, with
        ``in_workspace``, the workspace-relative path put in place whole at the end (the
        caller records the change). Returns the size written. Raises what the writes
        raise; ValueError when ``pieces`` do not hold ``total`` bytes (nothing is then
        put in place in the workspace; outside it, the file holds what came)."""
        conn = await self.connection()
        deadline = self._io_timeout + _SLACK
        source = _rechunk(pieces, piece)
        first = await anext(source, b"")
        rest = total > len(first)  # (a write announced with more content waits for all of it)
        if in_workspace:
            args: dict[str, Any] = {"path": path, "stage": True, "more": rest, "total": total, "mkdirs": True}
            r = await conn.request("write", args, timeout=deadline, raw=first)
            token = check_str(r.get("staged"), "staged", limit=64)
            more: dict[str, Any] = {"staged": token}
            op = "append"
        else:
            r = await conn.request(
                "fs_write", {"path": path, "more": rest, "total": total}, timeout=deadline, raw=first
            )
            token = check_str(r.get("token"), "token", limit=64) if rest else ""
            more = {"token": token}
            op = "fs_append"
        size = len(first)
        try:
            async for data in source:
                if size + len(data) > total:
                    raise ValueError(f"more than the {total} bytes announced for {path}")
                size += len(data)
                await conn.request(op, {**more, "last": size >= total}, timeout=deadline, raw=data)
            if size != total:
                raise ValueError(f"{size} bytes came for {path}, not the {total} announced")
            if in_workspace:
                await conn.request("commit", {"staged": token}, timeout=deadline)
        except BaseException:
            if in_workspace:
                try:
                    await conn.request("abort", {"staged": token}, timeout=deadline)
                except (AgentError, SandboxLostError):
                    pass
            raise
        return size


async def _rechunk(source: AsyncIterable[bytes], piece: int) -> AsyncIterator[bytes]:
    """``source``'s bytes in pieces of ``piece`` bytes (the last one shorter)."""
    buf = bytearray()
    async for chunk in source:
        buf += chunk
        while len(buf) >= piece:
            yield bytes(buf[:piece])
            del buf[:piece]
    if buf:
        yield bytes(buf)
