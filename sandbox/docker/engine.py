"""The engine: one Docker SDK client per backend, and the calls every other module makes
through it (blocking SDK calls in a thread, retried and translated; find and remove a
container by name).

The SDK's calls block, so they run in threads: the engine's own (:mod:`.threads`, which
never hold up the process's exit), not asyncio's default pool (``min(32, cores + 4)``
threads, 6 on a 2-core machine, shared with everything else the process hands to
threads), so starting many sandboxes at once is bounded by the backend's own setting
(:attr:`Engine.threads`) and not by the machine's core count. The client keeps as many
connections to the engine as there are threads (the SDK keeps 10 and drops the others
after each call).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import docker
import docker.errors
import docker.utils
from docker.transport import UnixHTTPAdapter

from ..errors import DaemonUnavailableError, SandboxUnavailableError
from ..logs import get_logger
from . import freezer, stuck
from .config import LABEL_POOL
from .errors import SDK_ERRORS, retry_daemon, translate, unanswered
from .threads import DaemonThreads

T = TypeVar("T")
log = get_logger("sandbox.docker")


#: Threads (and connections to the engine) of one engine by default.
DEFAULT_THREADS = 16

#: Seconds the engine has to answer one call (the SDK's read timeout, and the attach's).
TIMEOUT = 60
#: Seconds after which a removal the engine has not finished is taken for one it is stuck
#: on (:meth:`Engine.remove`); a healthy one takes well under a second, a few on a busy host.
STUCK_AFTER = 10.0

_ATTACH_PARAMS = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}


def _one_pool(client: Any) -> None:
    """One connection pool for the engine's unix socket, and no look at the environment's
    proxy and netrc settings on every call.

    The SDK keys a unix socket's pools by each request's whole URL
    (``UnixHTTPAdapter.get_connection``), so every container's own paths get a pool of
    their own, and past 25 pools the oldest is closed with its connection: starting many
    sandboxes opened a new connection to the engine for nearly every call, ~0.1-0.3 ms
    more of the worker's CPU a call, and one more connection for the engine to accept.
    The pool's URL is not what is requested (the adapter sends the request's path), so
    one pool serves every path. requests' ``trust_env`` finds a proxy or netrc entry for
    each call; a unix socket uses neither. (A TCP or TLS engine keeps the SDK's adapter
    as it is.)"""
    api = client.api
    adapter = getattr(api, "_custom_adapter", None)
    if not isinstance(adapter, UnixHTTPAdapter):
        return
    get = adapter.get_connection

    def one(url: bytes | str, proxies: Any = None) -> Any:
        return get("http+docker://localhost", proxies)

    adapter.get_connection = one  # type: ignore[method-assign]
    api.trust_env = False


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
        self._pool: DaemonThreads | None = None
        self._making = threading.Lock()  # (one client, whichever threads ask for it first)

    def client(self) -> Any:
        """The SDK client, made on first use. Making it asks the engine its API version
        (a request that may wait the whole :data:`TIMEOUT`): code on the event loop awaits
        :meth:`connect` instead. Raises DaemonUnavailableError."""
        if self._client is not None:
            return self._client
        with self._making:
            if self._client is None:
                try:
                    if self._client_factory is not None:
                        self._client = self._client_factory()
                    elif self._base_url:
                        self._client = docker.DockerClient(
                            base_url=self._base_url, timeout=TIMEOUT, max_pool_size=self.threads
                        )
                    else:
                        self._client = docker.from_env(timeout=TIMEOUT, max_pool_size=self.threads)
                except docker.errors.DockerException as e:
                    raise DaemonUnavailableError(f"Cannot reach the Docker daemon: {e}") from e
                if self._client_factory is None:
                    _one_pool(self._client)
            return self._client

    async def connect(self) -> Any:
        """The SDK client, made on first use in one of the engine's threads: an engine that
        does not answer the version request holds that thread, never the event loop, and
        the caller's deadline still ends the wait. Raises DaemonUnavailableError."""
        client = self._client
        if client is None:
            client = await self._in_thread(self.client)
        return client

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread, retried on daemon hiccups. Raises the
        :mod:`sandbox.errors` translation of what the SDK raised (``what`` names the call)."""

        def run() -> T:
            return retry_daemon(fn)(*args, **kwargs)

        try:
            return await self._in_thread(run)
        except SDK_ERRORS as e:
            raise translate(e, what) from e

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        if self._pool is None:
            self._pool = DaemonThreads(self.threads, "docker-engine")
        # (as asyncio.to_thread does: the call sees the caller's context variables)
        call = functools.partial(contextvars.copy_context().run, fn)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    async def attach(self, container_id: str, what: str) -> tuple[Any, bytes]:
        """The engine's attach stream of the container (its stdin, stdout and stderr, in
        the engine's frames): the connected socket and the bytes of the stream that came
        with the engine's answer. ``what`` names the call in errors.

        Written here and not the SDK's ``attach_socket``, which waits for the engine's
        answer with no timeout at all (it posts without the client's): an engine that hung
        held the thread, and the process's exit, for as long as it hung. This waits
        :data:`TIMEOUT` at most and is cancelled with its caller; it runs on the event
        loop, without a thread (~0.2 against the SDK's ~1.8 ms of CPU). An engine the
        worker does not reach through a plain socket (TLS, SSH, a client made by
        ``client_factory``) is attached by the SDK, as before.

        Raises DaemonUnavailableError (no connection, no answer in time),
        SandboxUnavailableError (the engine refused: no such container, not running).
        """
        client = await self.connect()
        where = self._endpoint()
        if where is None:
            sock_io = await self.call(what, lambda: client.api.attach_socket(container_id, params=_ATTACH_PARAMS))
            return sock_io, b""
        path = f"/v{client.api.api_version}/containers/{container_id}/attach?" + "&".join(
            f"{k}={v}" for k, v in _ATTACH_PARAMS.items()
        )
        if isinstance(where, str):
            host = "localhost"  # (what the SDK sends over a unix socket)
        else:
            host = f"[{where[0]}]:{where[1]}" if ":" in where[0] else f"{where[0]}:{where[1]}"
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: loom-worker\r\n"
            "Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n"
        ).encode()
        loop = asyncio.get_running_loop()
        sock: socket.socket | None = None
        try:
            async with asyncio.timeout(TIMEOUT):
                if isinstance(where, str):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    await loop.sock_connect(sock, where)
                else:
                    host, port = where
                    family, kind, proto, _, address = (await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))[0]
                    sock = socket.socket(family, kind, proto)
                    sock.setblocking(False)
                    await loop.sock_connect(sock, address)
                await loop.sock_sendall(sock, request)
                status, headers, rest = await _read_head(loop, sock)
                if status in (101, 200):
                    return sock, rest
                body = await _read_body(loop, sock, headers, rest)
        except TimeoutError:
            if sock is not None:
                sock.close()
            raise DaemonUnavailableError(unanswered(what, f"no answer in {TIMEOUT} s")) from None
        except OSError as e:
            if sock is not None:
                sock.close()
            raise DaemonUnavailableError(f"{what}: the Docker daemon does not answer ({e})") from e
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        sock.close()
        try:
            message = json.loads(body).get("message") or body.decode(errors="replace")
        except (ValueError, AttributeError):
            message = body.decode(errors="replace").strip() or f"HTTP {status}"
        if status >= 500:
            raise DaemonUnavailableError(f"{what}: {message}")
        raise SandboxUnavailableError(f"{what}: {message}")

    def _endpoint(self) -> str | tuple[str, int] | None:
        """Where the engine listens when the worker reaches it through a plain socket: a
        unix socket's path, or a TCP host and port without TLS; else None."""
        if self._client_factory is not None:
            return None
        try:
            env = docker.utils.kwargs_from_env()
        except docker.errors.DockerException:  # (a TLS setting without its files: the SDK says so)
            return None
        if env.get("tls"):
            return None
        url = str(docker.utils.parse_host(self._base_url or env.get("base_url")))
        if url.startswith("http+unix://"):
            return os.path.normpath("/" + url.removeprefix("http+unix://").lstrip("/"))
        if url.startswith("http://"):
            host, _, port = url.removeprefix("http://").rpartition(":")
            return host.strip("[]"), int(port)
        return None

    async def info(self) -> dict[str, Any]:
        """``docker info``. Raises DaemonUnavailableError."""
        result: dict[str, Any] = await self.call("docker info", lambda: self.client().info())
        return result

    async def find(self, name: str) -> Any:
        """The container called ``name``, or None."""
        client = await self.connect()

        def get() -> Any:
            try:
                return client.containers.get(name)
            except docker.errors.NotFound:
                return None

        return await self.call("inspect sandbox", get)

    async def listed(self, what: str, filters: dict[str, Any]) -> list[Any]:
        """The containers (running or not) the engine's ``filters`` select, from its one
        listing and no inspect of each (the SDK's ``list`` inspects every container found,
        and the engine answers an inspect only under the container's lock: a container
        whose runtime hangs, as a stuck ``runsc`` or shim does, would make every listing
        wait out the timeout and fail, every other container with it). The objects carry
        the listing's fields: ``name``, ``status``, ``labels``, ``attrs["Mounts"]``.
        Raises DaemonUnavailableError."""
        client = await self.connect()

        def ls() -> list[Any]:
            found = client.containers.list(all=True, sparse=True, filters=filters)
            for c in found:  # (the fields the SDK's properties read from an inspect)
                c.attrs.setdefault("Name", (c.attrs.get("Names") or ["/"])[0])
                c.attrs.setdefault("Config", {"Labels": c.attrs.get("Labels") or {}})
            return found

        return await self.call(what, ls)

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
        """Remove ``container`` (forced) and wait until its name is free. A removal the
        engine has not finished after :data:`STUCK_AFTER` seconds is that of a container
        it may be stuck on: a gVisor one's runtime processes on this host are killed,
        which ends the wait (:mod:`.stuck`). Raises DaemonUnavailableError (naming the
        container when the engine never finished). A pooled gVisor sandbox is thawed
        first: a frozen one cannot be removed (:mod:`.freezer`)."""

        def rm() -> None:
            if LABEL_POOL in (container.labels or {}):
                freezer.thaw_runtime(container.id)
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise

        task = asyncio.ensure_future(self.call("remove sandbox", rm))
        # (a caller cancelled meanwhile leaves the removal to finish: its error is taken here)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            done, _ = await asyncio.wait({task}, timeout=STUCK_AFTER)
            if not done:
                # (a frozen process takes no signal until thawed: one frozen by another)
                await asyncio.to_thread(freezer.thaw_runtime, container.id)
                killed = await asyncio.to_thread(stuck.kill_runtime, container.id)
                if killed:
                    log.warning("sandbox.runtime_killed", container=container.name, pids=killed, after_s=STUCK_AFTER)
            await task
        except DaemonUnavailableError as e:
            raise DaemonUnavailableError(
                f"{e} (if only {container.name} is never removed, the engine is stuck on it: its runtime "
                "or shim hangs, and restarting the Docker daemon frees it)"
            ) from e
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


async def _read_head(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """An HTTP answer's status, headers (names in lower case) and the bytes after them.
    Raises OSError when the connection ends first or the head is not HTTP."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise ConnectionResetError("the connection closed before the answer")
        head += chunk
        if len(head) > 1 << 16 and b"\r\n\r\n" not in head:
            raise ConnectionError("an answer's head above 64 KiB")
    head, _, rest = head.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, rest


async def _read_body(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, headers: dict[str, str], rest: bytes
) -> bytes:
    """An error answer's body (its ``Content-Length``, at most 64 KiB; without one,
    what came with the head)."""
    try:
        want = min(int(headers.get("content-length", "")), 1 << 16)
    except ValueError:
        return rest
    while len(rest) < want:
        chunk = await loop.sock_recv(sock, want - len(rest))
        if not chunk:
            break
        rest += chunk
    return rest
