"""Sandbox images over HTTP: pull one, and watch every pull of the service.

    POST /v1/images/pull    {"image": "python:3.12-slim"}
    GET  /v1/images/pulls   every pull's progress while the stream is open (the dashboard)

Both answer with Server-Sent Events, as every stream of the service does
(:mod:`worker.http.stream` says why). ``event: progress`` carries a
:class:`sandbox.pulls.PullEvent` (``{"image", "registry", "state": "pulling", "layers",
"layers_done", "bytes_done", "bytes_total", "status"}``) at most five times a second per
pull; the pull's last event has ``"state": "done"`` or ``"failed"`` (with ``reason`` and
``error``).

``POST .../pull`` makes the image available as ``LOOM_PULL`` says (``missing``: pulled
unless the engine has it; ``always``: pulled; ``never``: only looked for) from the registries
``LOOM_REGISTRIES`` allows, with Docker's own credentials, then ends with one ``event:
result`` (``{"image", "pulled": true|false}``) or ``event: error`` (``{"image", "registry",
"reason", "message"}``, ``reason`` one of ``not_found``, ``unauthorized``, ``not_allowed``,
``unreachable``, ``invalid``, ``failed``, or ``not_present`` when LOOM_PULL=never and the
engine does not have it). A client that goes away does not stop the pull; the next call
that needs the image waits for it.

Pulls also happen without this route: at a workspace's first call and when its settings
name a new image (``PATCH /v1/workspaces/{id}``); ``GET .../pulls`` shows those too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sse_starlette import EventSourceResponse, ServerSentEvent

from sandbox.base import ImageInventory, PullWatcher
from sandbox.errors import ImageNotFoundError, ImagePullError, SandboxUnavailableError
from sandbox.pulls import PULL_SINK, PullEvent, check_reference

from ..registry.contract import HasImages
from ..result import json_line
from .common import ERRORS
from .errors import NoImagePulls
from .state import ServiceDep

#: Seconds between keep-alive comments while nothing is pulled.
PING_SECONDS = 15
_SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}
}
_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str = Field(
        min_length=1,
        max_length=512,
        pattern=r"^\S+$",
        description="The image, as `docker pull` takes it: python:3.12-slim, ghcr.io/org/app:1, name@sha256:...",
    )

    @field_validator("image")
    @classmethod
    def _reference(cls, v: str) -> str:
        return check_reference(v)


def _backend(service: ServiceDep) -> Any:
    """The engine(s) pulling images (the Docker backend; a cluster's every node); else None."""
    registry = service.registry
    backend = registry.images if isinstance(registry, HasImages) else None
    return backend if isinstance(backend, ImageInventory) and isinstance(backend, PullWatcher) else None


router = APIRouter(tags=["images"])
_ERRORS = {**ERRORS, 501: {"description": "The sandbox backend does not pull images"}}


@router.post("/v1/images/pull", responses={**_ERRORS, **_SSE}, response_class=EventSourceResponse)
async def pull(service: ServiceDep, body: PullRequest) -> EventSourceResponse:
    """Make an image available as LOOM_PULL says; its progress as SSE ``progress``
    events, then ``result`` or ``error``."""
    backend = _backend(service)
    if backend is None:
        raise NoImagePulls
    return EventSourceResponse(_pull_events(backend, body.image), ping=PING_SECONDS, headers=_HEADERS)


@router.get("/v1/images/pulls", responses={**_ERRORS, **_SSE}, response_class=EventSourceResponse)
async def pulls(service: ServiceDep) -> EventSourceResponse:
    """Every pull of the service while the stream is open, as SSE ``progress`` events
    (the dashboard's view of images being fetched)."""
    backend = _backend(service)
    if backend is None:
        raise NoImagePulls
    return EventSourceResponse(_watch(backend.add_pull_listener), ping=PING_SECONDS, headers=_HEADERS)


def _error(image: str, e: SandboxUnavailableError) -> dict[str, Any]:
    """The ``error`` event of a pull: the image, the registry and why."""
    if isinstance(e, ImagePullError):
        return {"image": image, "registry": e.registry, "reason": e.reason, "message": str(e)}
    # ImageNotFoundError: LOOM_PULL=never and the engine does not have it; else the engine.
    reason = "not_present" if isinstance(e, ImageNotFoundError) else "engine"
    return {"image": image, "registry": None, "reason": reason, "message": str(e)}


def _progress(event: PullEvent) -> ServerSentEvent:
    return ServerSentEvent(data=json_line(event.as_dict()), event="progress")


async def _pull_events(backend: Any, image: str) -> AsyncIterator[ServerSentEvent]:
    queue: asyncio.Queue[PullEvent] = asyncio.Queue()

    async def ensure() -> bool:
        PULL_SINK.set(queue.put_nowait)  # this task's pull (or the one under way) reports here
        return bool(await backend.ensure_image(image))

    task = asyncio.create_task(ensure())
    try:
        while not task.done():
            getter = asyncio.create_task(queue.get())
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield _progress(getter.result())
            else:
                getter.cancel()
        while not queue.empty():
            yield _progress(queue.get_nowait())
        try:
            pulled = task.result()
        except SandboxUnavailableError as e:
            yield ServerSentEvent(data=json_line(_error(image, e)), event="error")
            return
        yield ServerSentEvent(data=json_line({"image": image, "pulled": pulled}), event="result")
    finally:
        if not task.done():
            # The client left: the pull goes on (it is shielded inside); only stop waiting.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def _watch(
    add_listener: Callable[[Callable[[PullEvent], None]], Callable[[], None]],
) -> AsyncIterator[ServerSentEvent]:
    queue: asyncio.Queue[PullEvent] = asyncio.Queue(maxsize=1000)

    def put(event: PullEvent) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # a reader that fell far behind loses progress, not ends
            queue.put_nowait(event)

    remove = add_listener(put)
    try:
        while True:
            yield _progress(await queue.get())
    finally:
        remove()
