"""The images sandboxes are made from: on the engine already, or pulled as the operator says.

- **Pull policy** (:attr:`SandboxSpec.pull`, ``LOOM_PULL``): ``missing`` (the default) pulls
  an image the engine does not have, ``never`` pulls nothing (an image must be built or
  loaded first), ``always`` pulls before every new container, so a tag that moved is
  followed (as ``docker run --pull``).
- **Registries** (:attr:`SandboxSpec.registries`, ``LOOM_REGISTRIES``): where a pull may go,
  as written in image names (``ghcr.io``, ``registry.example.com:5000``; ``docker.io`` for a
  name without one). An image is code that runs beside the workspace's files with its
  permissions, so where it may come from is the operator's decision; an image already on the
  engine was put there by someone with the engine's rights and is used whatever its name.
- **Credentials** are Docker's own (``~/.docker/config.json``, or ``$DOCKER_CONFIG``, with its
  credential helpers), which the SDK reads: ``docker login`` is how a private registry is
  reached, and no secret passes through the worker's settings.
- **Progress** goes to listeners (:meth:`ImagePuller.add_listener`: the service's event
  stream, a CLI's progress bar) and to the sink the calling context set in :data:`PULL_SINK`
  (a call of the CLI's local worker, whose client draws it), as :class:`PullEvent`.
- **Errors** name the image, the registry and its answer: :class:`ImagePullError` with a
  ``reason`` of ``not_found``, ``unauthorized``, ``not_allowed``, ``unreachable``,
  ``invalid`` or ``failed``.

One pull per image at a time: a second call needing it waits for the first, and a pull goes
on when the call that started it is cancelled (its deadline passed), so the next call finds
the image or waits for the same pull.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import docker.auth
import docker.errors
import docker.utils

from ..errors import ImageNotFoundError, ImagePullError
from ..logs import get_logger
from ..pulls import PULL_SINK, PullEvent, normalize_registry, reference_problem
from .engine import Engine

log = get_logger("sandbox.docker")

PullPolicy = Literal["missing", "never", "always"]
#: Progress events of one pull are passed on at most this often (the engine sends hundreds).
EVENT_INTERVAL = 0.2


def registry_of(image: str) -> str:
    """The registry ``image`` is pulled from: ``docker.io`` for a name without one, else the
    host[:port] it starts with. Raises ValueError for a name the engine would not take."""
    if not image or image != image.strip() or any(c.isspace() for c in image):
        raise ValueError(f"not an image name: {image!r}")
    repository, _tag = docker.utils.parse_repository_tag(image)
    try:
        registry, _name = docker.auth.resolve_repository_name(repository)
    except docker.errors.InvalidRepository as e:
        raise ValueError(f"not an image name: {image!r} ({e})") from None
    return normalize_registry(registry)


def classify(answer: str) -> str:
    """An :class:`ImagePullError` reason for the engine's (or registry's) answer to a pull."""
    text = answer.lower()
    if "invalid reference format" in text or "invalid repository name" in text:
        return "invalid"
    if any(
        s in text
        for s in ("connection refused", "no such host", "dial tcp", "i/o timeout", "tls:", "x509", "timeout exceeded")
    ) or ("server gave http response" in text):
        return "unreachable"
    if "manifest unknown" in text or "not found" in text or "repository does not exist" in text:
        return "not_found"
    if any(s in text for s in ("unauthorized", "authentication required", "no basic auth credentials", "denied")):
        return "unauthorized"
    return "failed"


_REASON_TEXT = {
    "not_found": "the registry has no such image (or it is private and the credentials do not reach it)",
    "unauthorized": "the registry refused the credentials (docker login to it first)",
    "unreachable": "the registry could not be reached",
    "invalid": "not a valid image name",
    "failed": "the pull failed",
}


def pull_error(image: str, registry: str, reason: str, answer: str) -> ImagePullError:
    """The error for a failed pull: the image, the registry and its answer."""
    return ImagePullError(
        f"image {image} could not be pulled from {registry}: {_REASON_TEXT.get(reason, reason)} "
        f"(the engine said: {answer.strip()[:500]})",
        image=image,
        registry=registry,
        reason=reason,
    )


@dataclass
class _Pull:
    task: asyncio.Task[None]
    sinks: list[Callable[[PullEvent], None]] = field(default_factory=list)


class _Progress:
    """The engine's per-layer pull messages summed up."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.current: dict[str, int] = {}
        self.layers: set[str] = set()
        self.done: set[str] = set()
        self.status = ""

    def feed(self, msg: dict[str, Any]) -> None:
        status = str(msg.get("status") or "")
        layer = str(msg.get("id") or "")
        detail = msg.get("progressDetail") or {}
        if status:
            self.status = status
        if not layer or status.startswith(("Pulling from", "Digest:", "Status:")):
            return
        self.layers.add(layer)
        if status == "Downloading" and isinstance(detail, dict):
            total, current = detail.get("total"), detail.get("current")
            if isinstance(total, int) and total > 0:
                self.totals[layer] = total
            if isinstance(current, int):
                self.current[layer] = current
        elif status in ("Download complete", "Already exists", "Pull complete"):
            if layer in self.totals:
                self.current[layer] = self.totals[layer]
            if status != "Download complete":
                self.done.add(layer)

    def event(self, image: str, registry: str) -> PullEvent:
        return PullEvent(
            image=image,
            registry=registry,
            state="pulling",
            layers=len(self.layers),
            layers_done=len(self.done),
            bytes_done=sum(self.current.get(k, 0) for k in self.totals),
            bytes_total=sum(self.totals.values()),
            status=self.status,
        )


class ImagePuller:
    """Pulls images for one backend's engine, one pull per image at a time."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._listeners: list[Callable[[PullEvent], None]] = []
        self._pulls: dict[str, _Pull] = {}

    def add_listener(self, fn: Callable[[PullEvent], None]) -> Callable[[], None]:
        """Give ``fn`` every pull's events (on the event loop); returns what removes it."""
        self._listeners.append(fn)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(fn)

        return remove

    async def has(self, image: str) -> bool:
        """Whether ``image`` is on the engine (nothing is pulled). Raises
        DaemonUnavailableError."""
        if reference_problem(image) is not None:
            return False  # not a name the engine has an image by (asked, it may answer for another resource)
        client = await self._engine.connect()

        def get() -> bool:
            try:
                client.images.get(image)
                return True
            except docker.errors.ImageNotFound:
                return False
            except docker.errors.APIError as e:
                if e.status_code == 400:  # not a valid reference: not an image we have
                    return False
                raise

        return await self._engine.call("inspect image", get)

    async def ensure(self, image: str, *, policy: PullPolicy, registries: tuple[str, ...]) -> bool:
        """Make ``image`` be on the engine as ``policy`` says; True when it was pulled.

        Raises ImagePullError (a pull refused or failed), ImageNotFoundError (missing and
        the policy is ``never``), DaemonUnavailableError.
        """
        if policy != "always" and await self.has(image):
            return False
        if policy == "never":
            raise ImageNotFoundError(
                f"image {image} is not on this Docker engine and LOOM_PULL=never: build it (`docker build -t "
                f"{image} .`), load it (`docker load -i FILE`) or pull it (`docker pull {image}`) first"
            )
        await self.pull(image, registries=registries)
        return True

    async def pull(self, image: str, *, registries: tuple[str, ...]) -> None:
        """Pull ``image`` (or wait for the pull of it under way). Raises ImagePullError,
        DaemonUnavailableError."""
        problem = reference_problem(image)
        if problem is not None:
            raise ImagePullError(problem, image=image, registry="", reason="invalid")
        try:
            registry = registry_of(image)
        except ValueError as e:
            raise ImagePullError(str(e), image=image, registry="", reason="invalid") from None
        if registry not in registries:
            allowed = ", ".join(registries) or "none"
            raise ImagePullError(
                f"image {image} is not on this Docker engine, and its registry {registry} is not one this worker "
                f"pulls from ({allowed}; the operator's LOOM_REGISTRIES). Pull it yourself (`docker pull {image}`) "
                "or ask for the registry to be allowed",
                image=image,
                registry=registry,
                reason="not_allowed",
            )
        pull = self._pulls.get(image)
        if pull is None:
            pull = _Pull(asyncio.get_running_loop().create_task(self._pull(image, registry)))
            self._pulls[image] = pull
            pull.task.add_done_callback(lambda task: self._finished(image, task))
        sink = PULL_SINK.get()
        if sink is not None:
            pull.sinks.append(sink)
        try:
            # Shielded: a caller whose deadline passed leaves; the pull goes on for the next.
            await asyncio.shield(pull.task)
        finally:
            if sink is not None:
                with contextlib.suppress(ValueError):
                    pull.sinks.remove(sink)

    def _finished(self, image: str, task: asyncio.Task[None]) -> None:
        self._pulls.pop(image, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have left (the events said it)

    def _emit(self, image: str, event: PullEvent) -> None:
        pull = self._pulls.get(image)
        for fn in [*self._listeners, *(pull.sinks if pull else ())]:
            try:
                fn(event)
            except Exception as e:  # a listener's failure must not fail the pull
                log.warning("sandbox.pull_listener_failed", image=image, error=repr(e))

    async def _pull(self, image: str, registry: str) -> None:
        loop = asyncio.get_running_loop()
        api = (await self._engine.connect()).api
        repository, tag = docker.utils.parse_repository_tag(image)
        progress = _Progress()
        log.info("sandbox.image_pull", image=image, registry=registry)
        self._emit(image, progress.event(image, registry))

        def run() -> str | None:
            """The pull in a thread; the engine's error message, or None when it succeeded."""
            last = 0.0
            try:
                for msg in api.pull(repository, tag=tag or "latest", stream=True, decode=True):
                    if not isinstance(msg, dict):
                        continue
                    if msg.get("error") or msg.get("errorDetail"):
                        detail = msg.get("errorDetail") or {}
                        return str(msg.get("error") or (detail.get("message") if isinstance(detail, dict) else ""))
                    progress.feed(msg)
                    now = time.monotonic()
                    if now - last >= EVENT_INTERVAL:
                        last = now
                        loop.call_soon_threadsafe(self._emit, image, progress.event(image, registry))
            except docker.errors.APIError as e:
                return str(e.explanation or e)
            return None

        try:
            answer = await self._engine.call("pull image " + image, run)
        except Exception as e:
            self._emit(image, PullEvent(image, registry, "failed", reason="failed", error=str(e)))
            raise
        if answer is not None:
            error = pull_error(image, registry, classify(answer), answer)
            log.warning("sandbox.image_pull_failed", image=image, registry=registry, reason=error.reason)
            self._emit(image, PullEvent(image, registry, "failed", reason=error.reason, error=str(error)))
            raise error
        done = progress.event(image, registry)
        self._emit(image, PullEvent(**{**done.as_dict(), "state": "done", "layers_done": done.layers}))
        log.info("sandbox.image_pulled", image=image, registry=registry, bytes=done.bytes_total)
