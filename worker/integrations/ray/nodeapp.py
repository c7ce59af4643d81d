"""The node service's own HTTP service, and what a front door reads from a node: its tools,
the tool catalog's search, its image pulls (a part of :class:`.node.NodeService`).

A front door (``loom-worker serve --ray``) hands a workspace's requests that only the
node can answer (its call history, its secrets, its snapshots, its processes and sandbox,
the vendors' native tools: :data:`.forward.FORWARDED`) to the node, where the very app
``loom-worker serve`` runs (:func:`worker.http.create_app` over the node's registry and
workspace root) answers them, in this process: no port is opened for it. So the answers
are the local service's, byte for byte. The request enters that app as a client on its
loopback would (``Host: 127.0.0.1``, the node's own token when it has one): the front
door has already decided who may call. The answer's ASGI messages stream back in order,
at most 16 in flight (the app waits while the front door's client reads slowly).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import ray

from sandbox.pulls import PULL_SINK, PullEvent

from .nodebase import NodeBase

#: Headers the front door's guard has already judged (the node's app would judge them
#: against its own name), and the connection's own.
_DROPPED = frozenset(
    {b"authorization", b"host", b"origin", b"cookie", b"connection", b"keep-alive", b"transfer-encoding"}
)
#: The tool listings a front door reads, ``format|native``.
FORMATS = ("openai", "anthropic", "mcp")


class NodeApp(NodeBase):
    """The node's own service app (see the module docstring)."""

    _app: Any = None
    _app_lock: asyncio.Lock | None = None

    async def _service(self) -> Any:
        """The node's service (:class:`worker.http.state.Service`), started on first use."""
        if self._app is None:
            if self._app_lock is None:
                self._app_lock = asyncio.Lock()
            async with self._app_lock:
                if self._app is None:
                    from ...http import create_app

                    app = create_app(self.settings, await self._reg(), workspaces=self.workspaces)
                    await self._stack.enter_async_context(app.router.lifespan_context(app))
                    self._app = app
        from ...http.state import service_of

        return service_of(self._app)

    @ray.method(num_returns="streaming", _generator_backpressure_num_objects=16)
    async def http(
        self,
        ws_id: str,
        method: str,
        path: str,
        raw_path: bytes,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> AsyncIterator[dict[str, Any]]:
        """One request of workspace ``ws_id`` (its path under ``/v1/workspaces/<id>``) to
        the node's app: the answer's ASGI messages, in order. Raises WorkspaceNotFound,
        ValueError (a path outside the workspace)."""
        await self._path(ws_id)
        prefix = f"/v1/workspaces/{ws_id}"
        if path != prefix and not path.startswith(prefix + "/"):
            raise ValueError(f"{path!r} is not a route of workspace {ws_id!r}")
        await self._service()
        hdrs = [(k, v) for k, v in headers if k.lower() not in _DROPPED]
        hdrs.append((b"host", b"127.0.0.1"))
        if self.settings.api_token:
            hdrs.append((b"authorization", b"Bearer " + self.settings.api_token.encode()))
        scope = {
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
        out: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=16)
        given = False

        async def receive() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client stays: the front door cancels this call
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            await out.put(message)

        task = asyncio.create_task(self._app(scope, receive, send))
        try:
            while True:
                get = asyncio.ensure_future(out.get())
                await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    while not out.empty():
                        yield out.get_nowait()
                    task.result()  # what the app raised (it answers its errors itself)
                    return
                message = get.result()
                yield message
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    return
        finally:
            task.cancel()

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
