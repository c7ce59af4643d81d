"""E2B's answers: its error shape, loom's errors translated into it, and the JSON of a
sandbox as E2B's OpenAPI describes it (``Sandbox``, ``SandboxDetail``, ``ListedSandbox``).

Errors are ``{"code": <status>, "message": "..."}`` (E2B's ``Error``; its SDKs read
``message`` and map the status to their exceptions: 401 AuthenticationException, 404
NotFoundException, 429 RateLimitException, 503 ServiceBusyException, anything else
SandboxException with the status). Never FastAPI's ``{"detail": ...}``: the SDK's
generated models fail on it. Routes raise :class:`E2BError` (or loom's own errors) and
:func:`answered` turns them into that shape, in one table:

==========  ==================================================================
status      errors
==========  ==================================================================
400         a request refused (body, query, template, setting, snapshot name)
404         no such sandbox, snapshot, template or route
409         a state that refuses it (pausing a paused sandbox)
429         a limit: sandboxes at once (LOOM_E2B_MAX_SANDBOXES), snapshots
            (LOOM_MAX_SNAPSHOTS, LOOM_MAX_SNAPSHOT_BYTES), calls at once
501         what E2B has and loom does not offer, named
503         infrastructure: the engine, the sandbox, the service not started
507         a disk full (the snapshot store's, the changelog's reserve)
500         anything else (a bug: logged)
==========  ==================================================================
"""

from __future__ import annotations

import errno
import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, ParamSpec

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandbox.errors import SandboxUnavailableError
from sandbox.logs import get_logger
from worker.changelog.errors import ReserveError
from worker.http.state import NotHeldHere, NotStartedError
from worker.service import Busy, InvalidWorkspaceId, WorkspaceNotFound
from worker.snapshots.errors import SnapshotDiskFullError, SnapshotLimitError, SnapshotNotFoundError
from worker.workspace_settings import SettingsError

from .records import SandboxRecord

log = get_logger("worker.e2b")

#: The envd version loom answers as (E2B's SDKs turn features on by it).
ENVD_VERSION = "0.5.7"
CLIENT_ID = "loom"
MIB = 1 << 20


class E2BError(Exception):
    """An answer in E2B's error shape: ``status`` and a message saying what to do."""

    def __init__(self, status: int, message: str, *, retry: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        #: E2B's ``Should-Retry`` header (its SDKs retry a 429 or 503 without one, and
        #: take a present one as final): False for a limit that waiting a second won't lift.
        self.retry = retry


def not_offered(what: str, why: str) -> E2BError:
    """501 for a part of E2B's API loom does not have, naming it."""
    return E2BError(501, f"{what} is not offered by loom-worker: {why}")


def no_sandbox(sandbox_id: str, why: str = "") -> E2BError:
    return E2BError(404, f"sandbox {sandbox_id!r} was not found" + (f": {why}" if why else ""))


def error(status: int, message: str, *, retry: bool | None = None) -> JSONResponse:
    """An error as E2B's API answers one (with ``Should-Retry`` when ``retry`` is given)."""
    headers = None if retry is None else {"Should-Retry": "true" if retry else "false"}
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def translate(e: Exception) -> E2BError | None:
    """``e`` as E2B's API answers it; None for an error that is a bug (the caller logs it)."""
    if isinstance(e, E2BError):
        return e
    if isinstance(e, SettingsError):
        return E2BError(400, f"{e.field}: {e.message}")
    if isinstance(e, InvalidWorkspaceId):
        return E2BError(400, str(e))
    if isinstance(e, WorkspaceNotFound | SnapshotNotFoundError):
        return E2BError(404, str(e))
    if isinstance(e, SnapshotLimitError):
        return E2BError(429, str(e), retry=False)
    if isinstance(e, Busy):  # calls at once: gone in a moment
        return E2BError(429, str(e))
    if isinstance(e, SnapshotDiskFullError | ReserveError) or (isinstance(e, OSError) and e.errno == errno.ENOSPC):
        return E2BError(507, f"the disk is full: {e}")
    if isinstance(e, NotHeldHere):
        return E2BError(501, f"{e} (a cluster's front door does not serve E2B's control plane yet)")
    if isinstance(e, SandboxUnavailableError | NotStartedError):
        return E2BError(503, f"the sandbox's infrastructure is unavailable: {e}")
    if isinstance(e, OSError):
        return E2BError(503, f"the service's storage failed: {e}")
    return None


P = ParamSpec("P")


def answered(route: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """A route whose errors are answered in E2B's shape (:func:`translate`; a bug is
    logged and answered 500)."""

    @functools.wraps(route)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response:
        try:
            return await route(*args, **kwargs)
        except Exception as e:
            known = translate(e)
            if known is None:
                log.exception("e2b.internal_error", route=route.__name__)
                return error(500, f"internal error ({type(e).__name__}): the service's log has its traceback")
            return error(known.status, known.message, retry=known.retry)

    # The route's parameters with their types resolved in the route's own module: FastAPI
    # would resolve the annotations' strings in this module's namespace (the wrapper's).
    wrapper.__signature__ = inspect.signature(route, eval_str=True)  # type: ignore[attr-defined]
    return wrapper


async def read_json(request: Request) -> Any:
    """A request's body as JSON (None when empty). Raises E2BError 400."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise E2BError(400, f"the body is not JSON: {e}") from None


def timestamp(t: float) -> str:
    """``t`` (seconds) as RFC 3339 in UTC, as E2B's API writes dates."""
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


#: ``endAt`` of a sandbox with no end (a workspace of loom's own API never given a timeout).
NO_END = "9999-12-31T23:59:59Z"


def sandbox_json(rec: SandboxRecord, envd_token: str) -> dict[str, Any]:
    """E2B's ``Sandbox``: the answer of create, connect, resume and fork."""
    return {
        "templateID": rec.template,
        "sandboxID": rec.id,
        "alias": rec.template,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": envd_token,
        # (E2B's token for a sandbox whose ports are not public, as loom's never are; the
        # code interpreter's SDK sends it, and no other, on its context requests.)
        "trafficAccessToken": envd_token,
        "domain": None,
    }


def listed_json(rec: SandboxRecord, size: dict[str, int]) -> dict[str, Any]:
    """E2B's ``ListedSandbox``; ``size``: ``cpuCount``, ``memoryMB``, ``diskSizeMB``."""
    out: dict[str, Any] = {
        "templateID": rec.template,
        "alias": rec.template,
        "sandboxID": rec.id,
        "clientID": CLIENT_ID,
        "startedAt": timestamp(rec.started_at),
        "endAt": NO_END if rec.end_at is None else timestamp(rec.end_at),
        **size,
        "metadata": dict(rec.metadata),
        "state": "paused" if rec.state == "paused" else "running",
        "envdVersion": ENVD_VERSION,
        "volumeMounts": [],
    }
    return out


def detail_json(rec: SandboxRecord, size: dict[str, int], envd_token: str) -> dict[str, Any]:
    """E2B's ``SandboxDetail``. A paused sandbox's ``pauseMode`` is ``filesystem``: loom's
    pause stops the container, so its files are kept and its processes are not."""
    out = listed_json(rec, size)
    out["envdAccessToken"] = envd_token
    out["domain"] = None
    out["allowInternetAccess"] = rec.allow_internet_access
    if rec.network is not None:
        out["network"] = rec.network
    out["lifecycle"] = {"autoResume": rec.auto_resume, "onTimeout": "pause" if rec.auto_pause else "kill"}
    if rec.state == "paused":
        out["pauseMode"] = "filesystem"
    return out


__all__ = [
    "ENVD_VERSION",
    "MIB",
    "NO_END",
    "E2BError",
    "answered",
    "detail_json",
    "error",
    "listed_json",
    "no_sandbox",
    "not_offered",
    "read_json",
    "sandbox_json",
    "timestamp",
    "translate",
]
