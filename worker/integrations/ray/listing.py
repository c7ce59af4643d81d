"""What a front door lists and searches: the tools the nodes actually run (built-in,
catalog, custom and MCP tools, as each node's own registry has them), the tool catalog's
search, and every node's image pulls.

:class:`NodeTools` reads each live node's tool listing at the front door's start and then
every :data:`PERIOD` seconds (a node answers with nothing while its tools' version has not
moved), so a tool a node's catalog adds appears in ``GET /v1/tools`` and in MCP's
``tools/list`` (with ``notifications/tools/list_changed``) within that time. A workspace
may be placed on any node, so the listing is of the tools every live node runs (nodes set
up alike, the usual case, list the same); before any node answers it is the built-in
tools. ``tool_search`` and ``GET /v1/tools/search`` ask one live node's catalog.

:class:`ClusterImages` is the front door's sandbox backend for the image routes: a pull
is made on every live node (``POST /v1/images/pull`` ends when each has the image, with
the first node's error if one failed), and the pulls of every node are watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from sandbox.logs import get_logger
from sandbox.pulls import PULL_SINK, PullEvent

from ...registry.table import ToolTable
from ...tools import builtin_tools
from . import gcs
from .node import node_service
from .nodeapp import FORMATS

log = get_logger("worker.integrations.ray")

#: Seconds between two readings of the nodes' tools.
PERIOD = 2.0


#: Node services' handles by (namespace, node): a handle stays good while its node lives.
_handles: dict[tuple[str, str], Any] = {}


async def _live_services(namespace: str) -> list[tuple[str, Any]]:
    """The services of the live nodes offering sandboxes (made where a node has none)."""
    nodes = sorted(n.node_id for n in await asyncio.to_thread(gcs.nodes) if n.alive and n.slots)
    for gone in [k for k in _handles if k[0] == namespace and k[1] not in nodes]:
        del _handles[gone]
    out = []
    for n in nodes:
        handle = _handles.get((namespace, n))
        if handle is None:
            handle = _handles[(namespace, n)] = await asyncio.to_thread(node_service, n, namespace)
        out.append((n, handle))
    return out


def _cause(e: RayTaskError) -> BaseException:
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


class NodeTools:
    """The nodes' tools, as the front door lists them (see the module docstring)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.version = 0
        self._seen: dict[str, dict[str, Any]] = {}  # by node: its last listing
        local = ToolTable(builtin_tools())
        self._names: list[str] = local.names()
        self._schemas: dict[str, list[dict[str, Any]]] = {f: local.all_schemas(f) for f in FORMATS}
        self.catalog = False
        self._subscribers: dict[object, Callable[[], None]] = {}

    def names(self) -> list[str]:
        return list(self._names)

    def schemas(self, fmt: str) -> list[dict[str, Any]]:
        """Raises ValueError for an unknown format."""
        if fmt not in self._schemas:
            raise ValueError(f"unknown schema format {fmt!r} (openai, anthropic, mcp)")
        return copy.deepcopy(self._schemas[fmt])

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        token = object()
        self._subscribers[token] = callback

        def unsubscribe() -> None:
            self._subscribers.pop(token, None)

        return unsubscribe

    async def refresh(self) -> None:
        """Read the live nodes' listings (a node that does not answer is left out)."""
        services = await _live_services(self.namespace)

        async def one(node: str, service: Any) -> tuple[str, dict[str, Any] | None]:
            known = self._seen.get(node, {}).get("version")
            try:
                found = await asyncio.wait_for(service.tool_listing.remote(known), 30)
            except RayActorError:
                _handles.pop((self.namespace, node), None)  # (made again next time, if its node lives)
                return node, None
            except (RayTaskError, TimeoutError):
                return node, None
            return node, self._seen.get(node) if found is None else found

        listings = {n: found for n, found in await asyncio.gather(*(one(n, s) for n, s in services)) if found}
        self._seen = listings
        if listings:
            self._combine([listings[n] for n in sorted(listings)])

    def _combine(self, listings: list[dict[str, Any]]) -> None:
        common = set(listings[0]["names"]).intersection(*(set(x["names"]) for x in listings[1:]))
        if any(set(x["names"]) != common for x in listings):
            log.warning("ray.tools_differ", common=len(common), nodes=len(listings))
        first = listings[0]
        names = [n for n in first["names"] if n in common]
        schemas = {f: [s for s in first["schemas"][f] if _name(s) in common] for f in FORMATS}
        catalog = all(x["catalog"] for x in listings)
        if (names, schemas, catalog) != (self._names, self._schemas, self.catalog):
            self._names, self._schemas, self.catalog = names, schemas, catalog
            self.version += 1
            for callback in list(self._subscribers.values()):
                try:
                    callback()
                except Exception:
                    log.exception("tools.subscriber_failed", version=self.version)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[NodeTools]:
        """Read now, then every PERIOD seconds while the context lasts."""
        await self.refresh()

        async def loop() -> None:
            while True:
                await asyncio.sleep(PERIOD)
                try:
                    await self.refresh()
                except Exception as e:  # Ray's control store away for a moment: next time
                    log.warning("ray.tools_refresh_failed", error=f"{type(e).__name__}: {e}"[:300])

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _name(schema: dict[str, Any]) -> str:
    fn = schema.get("function")
    return str(fn["name"] if isinstance(fn, dict) else schema.get("name"))


class NodeCatalog:
    """The tool catalog of one live node (``registry.catalog_tools`` of the front door)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    async def search(self, _registry: Any, args: Any, *, has_workspace: bool | None = None) -> dict[str, Any]:
        """``tool_search``'s output from a live node's catalog. Raises InvalidQueryError,
        LookupError (no node answers), the catalog's errors."""
        for _node, service in await _live_services(self.namespace):
            try:
                found: dict[str, Any] = await service.search_tools.remote(args.model_dump())
                return found
            except RayTaskError as e:
                raise _cause(e) from None
            except RayActorError:
                continue
        raise LookupError("no live node of the cluster answers a tool search")


class ClusterImages:
    """The image routes' backend on a cluster: every live node's engine."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    async def has_image(self, image: str) -> bool:
        """Whether every live node has ``image`` (nothing is pulled). Raises
        DaemonUnavailableError."""
        services = await _live_services(self.namespace)
        try:
            return all(await asyncio.gather(*(s.has_image.remote(image) for _n, s in services)))
        except RayTaskError as e:
            raise _cause(e) from None

    async def ensure_image(self, image: str) -> bool:
        """Make ``image`` available on every live node, their progress to the caller's
        pull sink; True when a node pulled it. Raises what a node's pull raised."""
        sink = PULL_SINK.get()

        async def one(service: Any) -> bool:
            pulled = False
            async for ref in service.pull.remote(image):
                try:
                    item = await ref
                except RayTaskError as e:
                    raise _cause(e) from None
                if isinstance(item, PullEvent):
                    if sink is not None:
                        sink(item)
                else:
                    pulled = bool(item)
            return pulled

        done = await asyncio.gather(*(one(s) for _n, s in await _live_services(self.namespace)), return_exceptions=True)
        failed = next((d for d in done if isinstance(d, BaseException)), None)
        if failed is not None:
            raise failed
        return any(done)

    def add_pull_listener(self, fn: Callable[[PullEvent], None]) -> Callable[[], None]:
        """Give ``fn`` every live node's pulls while it listens; returns the function
        that stops it."""

        async def node(service: Any) -> None:
            gen = service.pulls.remote()
            try:
                async for ref in gen:
                    fn(await ref)
            except (RayActorError, RayTaskError):
                pass  # that node is gone: the others go on
            finally:
                import ray

                ray.cancel(gen)

        async def watch() -> None:
            services = await _live_services(self.namespace)
            await asyncio.gather(*(node(s) for _n, s in services))

        task = asyncio.create_task(watch())

        def remove() -> None:
            task.cancel()

        return remove
