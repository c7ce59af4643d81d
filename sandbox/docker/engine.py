"""The engine: one Docker SDK client per backend, and the calls every other module makes
through it (blocking SDK calls in a thread, retried and translated; find and remove a
container by name).

The SDK's calls block, so they run in threads: the engine's own pool, not asyncio's
default one (``min(32, cores + 4)`` threads, 6 on a 2-core machine, shared with everything
else the process hands to threads), so starting many sandboxes at once is bounded by the
backend's own setting (:attr:`Engine.threads`) and not by the machine's core count. The
client keeps as many connections to the engine as there are threads (the SDK keeps 10
and drops the others after each call).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import docker
import docker.errors

from ..errors import DaemonUnavailableError
from .errors import SDK_ERRORS, retry_daemon, translate

T = TypeVar("T")


#: Threads (and connections to the engine) of one engine by default.
DEFAULT_THREADS = 16


class Engine:
    """A lazily made Docker client (``client_factory``, ``base_url`` or the environment's),
    and ``threads`` threads its blocking calls run in."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        client_factory: Callable[[], Any] | None = None,
        threads: int = DEFAULT_THREADS,
    ) -> None:
        self._base_url = base_url
        self._client_factory = client_factory
        self._client: Any = None
        self.threads = max(1, threads)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def client(self) -> Any:
        """The SDK client, made on first use. Raises DaemonUnavailableError."""
        if self._client is None:
            try:
                if self._client_factory is not None:
                    self._client = self._client_factory()
                elif self._base_url:
                    self._client = docker.DockerClient(base_url=self._base_url, timeout=60, max_pool_size=self.threads)
                else:
                    self._client = docker.from_env(timeout=60, max_pool_size=self.threads)
            except docker.errors.DockerException as e:
                raise DaemonUnavailableError(f"Cannot reach the Docker daemon: {e}") from e
        return self._client

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread, retried on daemon hiccups. Raises the
        :mod:`sandbox.errors` translation of what the SDK raised (``what`` names the call)."""

        def run() -> T:
            return retry_daemon(fn)(*args, **kwargs)

        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="docker-engine")
        # (as asyncio.to_thread does: the call sees the caller's context variables)
        call = functools.partial(contextvars.copy_context().run, run)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except SDK_ERRORS as e:
            raise translate(e, what) from e

    async def info(self) -> dict[str, Any]:
        """``docker info``. Raises DaemonUnavailableError."""
        result: dict[str, Any] = await self.call("docker info", lambda: self.client().info())
        return result

    async def find(self, name: str) -> Any:
        """The container called ``name``, or None."""
        client = self.client()

        def get() -> Any:
            try:
                return client.containers.get(name)
            except docker.errors.NotFound:
                return None

        return await self.call("inspect sandbox", get)

    async def started_by_peer(self, name: str, wait: float = 5.0) -> bool:
        """Container ``name`` of ours sits in "created": a peer process made it and is
        about to start it (create and start are two engine calls). Wait up to ``wait``
        seconds for it to run. False when it does not (its creator died in between) or
        it is gone."""
        deadline = asyncio.get_running_loop().time() + wait
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            container = await self.find(name)
            if container is None:
                return True  # gone: the caller's next round creates it
            if container.status != "created":
                return container.status == "running"
        return False

    async def remove(self, container: Any) -> None:
        """Remove ``container`` (forced) and wait until its name is free."""

        def rm() -> None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise

        await self.call("remove sandbox", rm)
        # removal is asynchronous on the daemon side; wait until the name is free
        for _ in range(50):
            if await self.find(container.name) is None:
                return
            await asyncio.sleep(0.05)

    async def aclose(self) -> None:
        """Close the client and the threads (a later call makes new ones)."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._client.close)
            self._client = None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
