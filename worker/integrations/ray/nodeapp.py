"""The node service's own HTTP service, and what a front door reads from a node: its tools,
the tool catalog's search, its image pulls (a part of :class:`.node.NodeService`).

A front door (``loom-worker serve --ray``) hands every request under a workspace (but
those it answers itself: :func:`.forward.carried`) to the workspace's node, where the
very app ``loom-worker serve`` runs (:func:`worker.http.create_app` over the node's
registry and workspace root) answers it, in this process: no port is opened for it. So
the answers are the local service's, byte for byte. The request enters that app as a
client on its loopback would (``Host: 127.0.0.1``, the node's own token when it has
one): the front door has already decided who may call.

E2B's API is served there too (as ``serve`` serves it: ``LOOM_E2B_API``), so that a front
door hands it every E2B request that names a sandbox of this node (:meth:`NodeApp.e2b_begin`)
and the requests it sends to one chosen node (a sandbox created here, this node's sandboxes
listed: :meth:`NodeApp.e2b_request`); the workspaces its routes create hold a slot on this
node (:mod:`.nodeslots`).

The answer comes back in one call on the node's call channel when it is whole
(:meth:`NodeApp.http_begin`: a call's answer, the common case, costs one round trip);
a streamed answer's beginning comes back so, and the rest as it is sent, in order
(:meth:`NodeApp.http_next`, each ask taking what is queued, at most 16 messages: the app
waits while the front door's client reads slowly), until it ends or its client leaves
(:meth:`NodeApp.http_cancel`). A WebSocket under a workspace (a terminal's screen) runs
in the same app, its messages relayed both ways (:mod:`.nodews`: ``ws_begin``,
``ws_next``, ``ws_send``, ``ws_close``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray

from sandbox.pulls import PULL_SINK, PullEvent

from .nodebase import NodeBase
from .nodews import NodeSocket, ws_scope

#: Headers the front door's guard has already judged (the node's app would judge them
#: against its own name), and the connection's own.
_DROPPED = frozenset(
    {
        b"authorization",
        b"x-api-key",  # (E2B's API key and sandbox access token: judged there too)
        b"x-access-token",
        b"e2b-traffic-access-token",
        b"host",
        b"origin",
        b"cookie",
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
    }
)
#: The tool listings a front door reads, ``format|native``.
FORMATS = ("openai", "anthropic", "mcp")


#: Seconds a streamed answer waits for its front door's next ask before it is cancelled.
ABANDONED = 300.0
#: Seconds an answer whose head is sent may take to send its first body part before the
#: head goes to the front door alone (a stream's headers reach its client without waiting
#: for its first event).
HEAD_ALONE = 0.05


def _scope(
    method: str, path: str, raw_path: bytes, query: bytes, headers: list[tuple[bytes, bytes]], token: str | None
) -> dict[str, Any]:
    """The ASGI scope of a forwarded request, as a client on the node's loopback sends it."""
    hdrs = [(k, v) for k, v in headers if k.lower() not in _DROPPED]
    hdrs.append((b"host", b"127.0.0.1"))
    if token:
        hdrs.append((b"authorization", b"Bearer " + token.encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": hdrs,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
        "state": {},
    }


def _last(message: dict[str, Any]) -> bool:
    return message["type"] == "http.response.body" and not message.get("more_body", False)


def _e2b_path(path: str) -> None:
    """Raises ValueError for a path that is not of E2B's API."""
    from ...auth import e2b_kind

    if e2b_kind(path) is None:
        raise ValueError(f"{path!r} is not a route of E2B's API")


class _Answer:
    """One forwarded request running in the node's app, its answer's messages queued (at
    most 16: the app waits while the front door's client reads slowly)."""

    def __init__(self, app: Any, scope: dict[str, Any], body: bytes) -> None:
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=16)
        self._body: bytes | None = body
        self.whole = False
        self.asked = time.monotonic()
        self._task = asyncio.create_task(app(scope, self._receive, self._queue.put))

    async def _receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays: its front door cancels the answer
        raise AssertionError("unreachable")

    async def _get(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message; None after ``timeout`` seconds without one. Raises what the
        app raised when it ended without its answer (it answers its errors itself)."""
        get = asyncio.ensure_future(self._queue.get())
        done, _ = await asyncio.wait({get, self._task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        if self._task in done and self._queue.empty():
            self._task.result()
            raise RuntimeError("the node's app ended without completing its answer")
        return None

    async def first(self) -> list[dict[str, Any]]:
        """The whole answer, or its beginning when it streams: the messages up to its first
        body part that is not the last, or its head alone when no body part follows it at
        once."""
        out: list[dict[str, Any]] = []
        while True:
            head = bool(out) and out[-1]["type"] == "http.response.start"
            message = await self._get(HEAD_ALONE if head else None)
            if message is None:
                return out
            out.append(message)
            if _last(message):
                self.whole = True
                return out
            if message["type"] == "http.response.body":
                return out

    async def next(self) -> list[dict[str, Any]]:
        """The messages queued now (waiting for one)."""
        self.asked = time.monotonic()
        message = await self._get(None)
        assert message is not None
        out = [message]
        while not _last(out[-1]) and not self._queue.empty():
            out.append(self._queue.get_nowait())
        self.whole = _last(out[-1])
        self.asked = time.monotonic()
        return out

    def cancel(self) -> None:
        self._task.cancel()


class NodeApp(NodeBase):
    """The node's own service app (see the module docstring)."""

    _app: Any = None
    _app_lock: asyncio.Lock | None = None

    def __init__(self, node_id: str, namespace: str) -> None:
        super().__init__(node_id, namespace)
        self._answers: dict[int, _Answer] = {}  # the streamed answers, by token
        self._sockets: dict[int, NodeSocket] = {}  # the relayed WebSockets, by token (the same count)
        self._next_answer = 0
        # deleting an overlay fork with its files (``delete``) removes the fork whole
        self.workspaces.fork_remover = self._remove_fork

    async def _remove_fork(self, path: Path) -> None:
        service = await self._service()
        await service.snapshots.remove_fork(path)

    async def _service(self) -> Any:
        """The node's service (:class:`worker.http.state.Service`), started on first use."""
        if self._app is None:
            if self._app_lock is None:
                self._app_lock = asyncio.Lock()
            async with self._app_lock:
                if self._app is None:
                    from ...http import create_app
                    from .nodeslots import SlotWorkspaces

                    app = create_app(
                        self._app_settings(),
                        await self._reg(),
                        workspaces=SlotWorkspaces(self),
                        routes=self._e2b_routes(),
                    )
                    await self._stack.enter_async_context(app.router.lifespan_context(app))
                    self._app = app
        from ...http.state import service_of

        return service_of(self._app)

    def _app_settings(self) -> Any:
        """The node's settings, but E2B's sandboxes made ahead (the control plane's warm
        pool, ``e2b_warm_sandboxes``): none on a node. Each would hold one of its slots
        (it is a workspace its routes create), and a front door places a sandbox on a
        node with a free slot, blind to the warm ones waiting elsewhere: after a few
        creates every slot of the cluster was held by sandboxes nobody asked for."""
        if "e2b_warm_sandboxes" not in type(self.settings).model_fields:
            return self.settings
        return self.settings.model_copy(update={"e2b_warm_sandboxes": 0})

    def _e2b_routes(self) -> list[Any]:
        """E2B's routes, when this node serves them (``LOOM_E2B_API``, as ``serve`` does)."""
        from ...cli.service import e2b_routes

        # (None: LOOM_E2B_API=true without the extra, which e2b_routes has said; E2B's
        # requests are then answered 404 here, the node's other routes still served)
        return e2b_routes(self.settings) or []

    async def http_begin(
        self,
        ws_id: str,
        method: str,
        path: str,
        raw_path: bytes,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> tuple[list[dict[str, Any]], int | None]:
        """One request of workspace ``ws_id`` (its path under ``/v1/workspaces/<id>``) to
        the node's app: the answer's ASGI messages, all of them when the answer is whole
        (then None), else those sent so far and the token of the rest
        (:meth:`http_next`, :meth:`http_cancel`). Raises WorkspaceNotFound, ValueError (a
        path outside the workspace)."""
        await self._path(ws_id)
        prefix = f"/v1/workspaces/{ws_id}"
        if path != prefix and not path.startswith(prefix + "/"):
            raise ValueError(f"{path!r} is not a route of workspace {ws_id!r}")
        return await self._begin(method, path, raw_path, query, headers, body)

    async def e2b_begin(
        self,
        sandbox_id: str,
        method: str,
        path: str,
        raw_path: bytes,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> tuple[list[dict[str, Any]], int | None]:
        """One request of E2B's API for sandbox ``sandbox_id`` (placed here), as
        :meth:`http_begin` (envd's and the code interpreter's, which name it by
        ``E2b-Sandbox-Id``; the control plane's ``/sandboxes/{id}/...``). Raises
        WorkspaceNotFound, ValueError (a path not of E2B's API)."""
        await self._path(sandbox_id)
        _e2b_path(path)
        return await self._begin(method, path, raw_path, query, headers, body)

    async def e2b_request(
        self,
        method: str,
        path: str,
        raw_path: bytes,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> list[dict[str, Any]]:
        """A request of E2B's API naming no sandbox placed here yet (a sandbox created on
        this node, this node's sandboxes listed): its whole answer's ASGI messages. Raises
        ValueError (a path not of E2B's API)."""
        _e2b_path(path)
        out, token = await self._begin(method, path, raw_path, query, headers, body)
        while token is not None:
            more = await self.http_next(token)
            out += more
            if _last(more[-1]):
                token = None
        return out

    async def _begin(
        self, method: str, path: str, raw_path: bytes, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[list[dict[str, Any]], int | None]:
        await self._service()
        self._expire_answers()
        answer = _Answer(self._app, _scope(method, path, raw_path, query, headers, self.settings.api_token), body)
        out = await answer.first()
        if answer.whole:
            return out, None
        self._next_answer += 1
        self._answers[self._next_answer] = answer
        return out, self._next_answer

    async def http_next(self, token: int) -> list[dict[str, Any]]:
        """The next messages of a streamed answer (at least one; the last ends it).
        Raises LookupError for a token not (or no longer) open."""
        answer = self._answers.get(token)
        if answer is None:
            raise LookupError(f"no answer {token} is streaming here")
        out = await answer.next()
        if answer.whole:
            self._answers.pop(token, None)
        return out

    def http_cancel(self, token: int) -> None:
        """End a streamed answer whose client left (its request is cancelled here)."""
        answer = self._answers.pop(token, None)
        if answer is not None:
            answer.cancel()

    # -- a WebSocket under a workspace (:mod:`.nodews`) -------------------------------------

    async def ws_begin(
        self,
        ws_id: str,
        path: str,
        raw_path: bytes,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        subprotocols: list[str],
    ) -> tuple[list[dict[str, Any]], int | None]:
        """Open a WebSocket of workspace ``ws_id`` in the node's app: its messages up to
        its acceptance or close, and the token of the rest (None: it closed). Raises
        WorkspaceNotFound, ValueError (a path outside the workspace)."""
        await self._path(ws_id)
        prefix = f"/v1/workspaces/{ws_id}/"
        if not path.startswith(prefix):
            raise ValueError(f"{path!r} is not a route of workspace {ws_id!r}")
        await self._service()
        self._expire_answers()
        sock = NodeSocket(self._app, ws_scope(path, raw_path, query, headers, subprotocols, self.settings.api_token))
        out = await sock.next(first=True)
        if sock.done:
            return out, None
        self._next_answer += 1
        self._sockets[self._next_answer] = sock
        return out, self._next_answer

    def _socket(self, token: int) -> NodeSocket:
        sock = self._sockets.get(token)
        if sock is None:
            raise LookupError(f"no WebSocket {token} is open here")
        return sock

    async def ws_next(self, token: int) -> list[dict[str, Any]]:
        """The app's next messages (at least one; a close ends it). Raises LookupError."""
        sock = self._socket(token)
        out = await sock.next()
        if sock.done:
            self._sockets.pop(token, None)
        return out

    async def ws_send(self, token: int, messages: list[dict[str, Any]]) -> None:
        """The client's messages to the app. Raises LookupError."""
        await self._socket(token).push(messages)

    def ws_close(self, token: int, code: int = 1000) -> None:
        """The client left: the app is told (and its WebSocket forgotten here)."""
        sock = self._sockets.pop(token, None)
        if sock is not None:
            sock.left(code)

    def _expire_answers(self) -> None:
        # A front door gone between two asks leaves its answer here: cancelled once
        # nobody asked for ABANDONED seconds (a live client's front door asks at once).
        now = time.monotonic()
        for token in [t for t, a in self._answers.items() if now - a.asked > ABANDONED]:
            self._answers.pop(token).cancel()
        for token in [t for t, s in self._sockets.items() if s.abandoned(now)]:
            self._sockets.pop(token).left(1001)

    # -- what a front door lists -----------------------------------------------------------

    async def tool_listing(self, known: int | None = None) -> dict[str, Any] | None:
        """The node registry's tools (``names``; ``schemas`` by format, as ``GET
        /v1/tools`` lists them: the vendors' native tools left out), its tools' version,
        and whether it has the tool catalog; None when its version is still ``known``."""
        reg = await self._reg()
        if known is not None and reg.tools_version == known:
            return None
        return {
            "version": reg.tools_version,
            "names": [n for n in reg.names() if "native" not in reg.get(n).tags],
            "schemas": {fmt: reg.all_schemas(fmt) for fmt in FORMATS},
            "catalog": reg.catalog_tools is not None,
        }

    async def search_tools(self, args: dict[str, Any]) -> dict[str, Any]:
        """``GET /v1/tools/search``'s answer from this node's catalog. Raises
        InvalidQueryError, LookupError (no catalog here), and the catalog's errors."""
        from ...catalog.tool_search import ToolSearchArgs

        reg = await self._reg()
        if reg.catalog_tools is None:
            raise LookupError("this node has no tool catalog (LOOM_CATALOG)")
        out: dict[str, Any] = await reg.catalog_tools.search(reg, ToolSearchArgs(**args), has_workspace=True)
        return out

    # -- image pulls ------------------------------------------------------------------------

    @ray.method(num_returns="streaming", _generator_backpressure_num_objects=64)
    async def pull(self, image: str) -> AsyncIterator[PullEvent | bool]:
        """Make ``image`` available on this node's engine (``ensure_image``): its progress
        events, then whether it was pulled. Raises what ``ensure_image`` raises
        (ImagePullError, ImageNotFoundError, DaemonUnavailableError), or LookupError for
        a backend that does not pull."""
        backend = await self._puller()
        queue: asyncio.Queue[PullEvent] = asyncio.Queue()

        async def ensure() -> bool:
            PULL_SINK.set(queue.put_nowait)
            return bool(await backend.ensure_image(image))

        task = asyncio.create_task(ensure())
        while not task.done():
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        while not queue.empty():
            yield queue.get_nowait()
        yield task.result()

    @ray.method(num_returns="streaming", _generator_backpressure_num_objects=64)
    async def pulls(self) -> AsyncIterator[PullEvent]:
        """Every pull of this node's engine while the caller reads (until it cancels)."""
        backend = await self._puller()
        queue: asyncio.Queue[PullEvent] = asyncio.Queue(maxsize=1000)

        def put(event: PullEvent) -> None:
            if not queue.full():  # a reader far behind loses progress, not the stream
                queue.put_nowait(event)

        remove = backend.add_pull_listener(put)
        try:
            while True:
                yield await queue.get()
        finally:
            remove()

    async def has_image(self, image: str) -> bool:
        """Whether this node's engine has ``image`` (nothing is pulled). Raises
        DaemonUnavailableError, LookupError (a backend that does not pull)."""
        return bool(await (await self._puller()).has_image(image))

    async def _puller(self) -> Any:
        from sandbox.base import ImageInventory, PullWatcher

        backend = (await self._reg()).backend
        if not (isinstance(backend, ImageInventory) and isinstance(backend, PullWatcher)):
            raise LookupError("this node's sandbox backend does not pull images")
        return backend
