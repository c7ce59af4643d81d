"""The engine: one Docker SDK client per backend, and the calls every other module makes
through it (blocking SDK calls in a thread, retried and translated; find and remove a
container by name)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import docker
import docker.errors

from ..errors import DaemonUnavailableError
from .errors import SDK_ERRORS, retry_daemon, translate

T = TypeVar("T")


class Engine:
    """A lazily made Docker client (``client_factory``, ``base_url`` or the environment's)."""

    def __init__(self, *, base_url: str | None = None, client_factory: Callable[[], Any] | None = None) -> None:
        self._base_url = base_url
        self._client_factory = client_factory
        self._client: Any = None

    def client(self) -> Any:
        """The SDK client, made on first use. Raises DaemonUnavailableError."""
        if self._client is None:
            try:
                if self._client_factory is not None:
                    self._client = self._client_factory()
                elif self._base_url:
                    self._client = docker.DockerClient(base_url=self._base_url, timeout=60)
                else:
                    self._client = docker.from_env(timeout=60)
            except docker.errors.DockerException as e:
                raise DaemonUnavailableError(f"Cannot reach the Docker daemon: {e}") from e
        return self._client

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread, retried on daemon hiccups. Raises the
        :mod:`sandbox.errors` translation of what the SDK raised (``what`` names the call)."""

        def run() -> T:
            return retry_daemon(fn)(*args, **kwargs)

        try:
            return await asyncio.to_thread(run)
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
        """Close the client (a later call makes a new one)."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._client.close)
            self._client = None
