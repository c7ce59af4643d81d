"""envd's filesystem service, ``filesystem.Filesystem`` (``spec/envd/filesystem/
filesystem.proto`` in e2b-dev/E2B): Connect-RPC over HTTP/1.1, with the JSON and the
protobuf codecs, served by connect-python's ASGI server from the E2B package's own
generated stubs (``e2b.envd.filesystem``), at ``/filesystem.Filesystem/...``.

Which sandbox a call is for is its ``E2b-Sandbox-Id`` header (:mod:`.target`); its user,
the ``Authorization: Basic`` name the SDK sends for ``user=``. ``Stat``, ``ListDir``
(``depth``), ``MakeDir`` (``already_exists`` when the directory is there: the SDK's
``False``), ``Move``, ``Remove``, ``WatchDir`` (a server stream: a start event, the
changes as inotify reports them in the sandbox, keepalives at the client's
``Keepalive-Ping-Interval``; it ends when the client goes) and the polling watchers
(:mod:`.watchers`) work on :mod:`.sandboxfs`, so what they change in the workspace is in
its changelog. Errors are Connect codes as envd gives them (:mod:`.errors`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb as pb
from e2b.envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from fastapi import Request
from protobuf import Oneof
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox.results import WatchEvent
from sandbox.treeops import PathWatch
from worker.http.state import Service

from .entries import entry_info
from .errors import NoSandboxNamed, connect_error
from .sandboxfs import SandboxFiles, e2b_path
from .target import sandbox_id_of, target_of
from .watchers import Watchers

T = TypeVar("T")

#: envd's keepalive interval when the client names none (seconds).
DEFAULT_KEEPALIVE = 90.0
_TYPES = {
    "create": pb.EventType.CREATE,
    "write": pb.EventType.WRITE,
    "remove": pb.EventType.REMOVE,
    "rename": pb.EventType.RENAME,
    "chmod": pb.EventType.CHMOD,
}
_CARRIES_ENTRY = {"create", "write", "chmod"}


class _Call:
    """The ASGI request being served, and an event set when its client disconnects."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.gone = asyncio.Event()


_call: ContextVar[_Call] = ContextVar("e2b_filesystem_call")


class _Served:
    """The Connect application, with each request's scope and disconnect made visible to
    the service (connect-python hands a method only its message and headers)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = _Call(scope)

        async def watched() -> Message:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                call.gone.set()
            return msg

        token = _call.set(call)
        try:
            await self.app(scope, watched, send)
        finally:
            _call.reset(token)


def _user(ctx: RequestContext[Any, Any]) -> str | None:
    """The user an SDK names with ``Authorization: Basic base64(user:)``; None without."""
    scheme, _, value = (ctx.request_headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[0] or None
    except (binascii.Error, ValueError):
        return None


async def _files(ctx: RequestContext[Any, Any]) -> SandboxFiles:
    """The files of the sandbox the call names, as its user. Raises NoSandboxNamed,
    SandboxNotFound."""
    request = Request(_call.get().scope)
    if not sandbox_id_of(request):
        raise NoSandboxNamed("no sandbox named: send the E2b-Sandbox-Id header")
    return SandboxFiles(await target_of(request), _user(ctx))


async def _answer(work: Callable[[], Awaitable[T]], *, slot: bool = True) -> T:
    """``work()`` in one of the service's call slots (``slot``; a watch waiting for
    changes holds none), its failure as envd's Connect error."""
    try:
        if not slot:
            return await work()
        service: Service = _call.get().scope["app"].state.service
        async with service.runner.slot():
            return await work()
    except Exception as e:
        err = connect_error(e)
        if err is None:
            raise
        raise err from e


def _keepalive(ctx: RequestContext[Any, Any]) -> float:
    try:
        return max(1.0, float(ctx.request_headers.get("keepalive-ping-interval") or DEFAULT_KEEPALIVE))
    except ValueError:
        return DEFAULT_KEEPALIVE


class FilesystemService(Filesystem):
    """The ``Filesystem`` service (the Protocol of ``filesystem_connect``)."""

    def __init__(self) -> None:
        self.watchers = Watchers()

    async def stat(self, request: pb.StatRequest, ctx: RequestContext[Any, Any], /) -> pb.StatResponse:
        async def work() -> pb.StatResponse:
            path, entry = await (await _files(ctx)).stat(request.path)
            return pb.StatResponse(entry=entry_info(entry, path))

        return await _answer(work)

    async def list_dir(self, request: pb.ListDirRequest, ctx: RequestContext[Any, Any], /) -> pb.ListDirResponse:
        async def work() -> pb.ListDirResponse:
            found = await (await _files(ctx)).list(request.path, request.depth or 1)
            return pb.ListDirResponse(entries=[entry_info(e, path) for path, e in found])

        return await _answer(work)

    async def make_dir(self, request: pb.MakeDirRequest, ctx: RequestContext[Any, Any], /) -> pb.MakeDirResponse:
        async def work() -> pb.MakeDirResponse:
            path, entry = await (await _files(ctx)).make_dir(request.path)
            return pb.MakeDirResponse(entry=entry_info(entry, path))

        return await _answer(work)

    async def move(self, request: pb.MoveRequest, ctx: RequestContext[Any, Any], /) -> pb.MoveResponse:
        async def work() -> pb.MoveResponse:
            path, entry = await (await _files(ctx)).move(request.source, request.destination)
            return pb.MoveResponse(entry=entry_info(entry, path))

        return await _answer(work)

    async def remove(self, request: pb.RemoveRequest, ctx: RequestContext[Any, Any], /) -> pb.RemoveResponse:
        async def work() -> pb.RemoveResponse:
            await (await _files(ctx)).remove(request.path)
            return pb.RemoveResponse()

        return await _answer(work)

    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[pb.WatchDirResponse]:
        files = await _answer(lambda: _files(ctx))
        watch = await _answer(lambda: files.watch(request.path, request.recursive))
        gone = _call.get().gone
        interval = _keepalive(ctx)
        base = e2b_path(request.path)
        try:
            yield _response("start", pb.WatchDirResponse.StartEvent())
            while True:
                events = await _answer(lambda: _next(watch, gone, interval), slot=False)
                if gone.is_set():
                    return  # the client went: the watch ends here
                if not events:
                    yield _response("keepalive", pb.WatchDirResponse.KeepAlive())
                    continue
                for ev in await _fs_events(files, base, events, request.include_entry):
                    yield _response("filesystem", ev)
        finally:
            await watch.close()

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.CreateWatcherResponse:
        async def work() -> pb.CreateWatcherResponse:
            files = await _files(ctx)
            watch = await files.watch(request.path, request.recursive)
            base = e2b_path(request.path)
            wid = await self.watchers.add(files.target.sandbox_id, watch, base, request.include_entry)
            return pb.CreateWatcherResponse(watcher_id=wid)

        return await _answer(work)

    async def get_watcher_events(
        self, request: pb.GetWatcherEventsRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.GetWatcherEventsResponse:
        async def work() -> pb.GetWatcherEventsResponse:
            files = await _files(ctx)
            w = await self.watchers.get(files.target.sandbox_id, request.watcher_id)
            events = w.watch.pending()
            if not events:
                return pb.GetWatcherEventsResponse()
            return pb.GetWatcherEventsResponse(events=await _fs_events(files, w.base, events, w.include_entry))

        return await _answer(work)

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.RemoveWatcherResponse:
        async def work() -> pb.RemoveWatcherResponse:
            files = await _files(ctx)
            await self.watchers.remove(files.target.sandbox_id, request.watcher_id)
            return pb.RemoveWatcherResponse()

        return await _answer(work)


def _response(field: str, value: object) -> pb.WatchDirResponse:
    """A message of WatchDir's stream (its ``event`` oneof set to ``field``)."""
    return pb.WatchDirResponse(event=cast(Any, Oneof(field, value)))


async def _next(watch: PathWatch, gone: asyncio.Event, timeout: float) -> list[WatchEvent]:
    """The watch's next changes, or [] after ``timeout`` seconds or once the client is gone."""
    if gone.is_set():
        return []
    waiter = asyncio.ensure_future(gone.wait())
    try:
        return await watch.next(timeout, stop=waiter)
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter


async def _fs_events(
    files: SandboxFiles, base: str, events: list[WatchEvent], with_entry: bool
) -> list[pb.FilesystemEvent]:
    """``events`` as envd's messages (with the entry of what is still there, when asked)."""
    out = []
    for ev in events:
        msg = pb.FilesystemEvent(name=ev.name, type=_TYPES[ev.type])
        if with_entry and ev.type in _CARRIES_ENTRY:
            # Best effort, as envd's: an entry gone meanwhile has none.
            with contextlib.suppress(Exception):
                path, entry = await files.stat(base if ev.name == "." else f"{base.rstrip('/')}/{ev.name}")
                msg.entry = entry_info(entry, path)
        out.append(msg)
    return out


def routes(settings: Any) -> list[Any]:
    service = FilesystemService()
    app = FilesystemASGIApplication(service)
    return [Mount(app.path, app=_Served(app))]


__all__ = ["FilesystemService", "routes"]
