"""What a sandbox's own API (envd) answers when a call fails, decided in one place for
its two transports: a Connect error code (the filesystem and process services) and an
HTTP status with envd's JSON body ``{"code": N, "message": ...}`` (``/files``).

E2B's SDKs turn both into their exceptions (``e2b/envd/rpc.py``, ``e2b/envd/api.py``):
Connect ``not_found`` / 404 is ``NotFoundException`` (``FileNotFoundException`` for files),
``invalid_argument`` / 400 ``InvalidArgumentException``, ``unauthenticated`` / 401
``AuthenticationException``, 507 ``NotEnoughSpaceException``; ``unavailable`` / 502 whose
message says the sandbox "was not found" is ``SandboxNotRunningException``, any other
``unavailable`` ``SandboxUnreachableException``. The rows, in order (the first whose class
matches wins)::

    the client's mistakes   no such sandbox (unavailable / 502, as E2B's proxy answers),
                            a user the sandbox has not (unauthenticated / 401), a path
                            missing (not_found / 404), refused (permission_denied / 403),
                            of the wrong kind or an argument out of range (invalid_argument
                            / 400), there already (already_exists / 409), changed while read
                            (aborted / 409), what loom does not offer (unimplemented / 501)
    limits                  a size (resource_exhausted / 413), a full disk (507), too
                            many watches or calls at once (resource_exhausted / 429)
    infrastructure          the sandbox or the changelog cannot be used now (unavailable /
                            503): never the client's fault, never disguised as one
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from fastapi.responses import JSONResponse

from sandbox.errors import (
    AgentError,
    ConflictError,
    NotADirError,
    NotAFileError,
    PathEscapeError,
    PathNotFoundError,
    PermissionDeniedError,
    SandboxError,
    TooLargeError,
    UserUnsupportedError,
)
from sandbox.logs import get_logger
from worker.changelog.errors import ChangelogError, ReserveError
from worker.http.state import NotHeldHere, NotStartedError
from worker.service import Busy

from .target import E2B_HOME, LOOM_MOUNT, SandboxNotFound
from .watchers import TooManyWatchers, WatcherNotFound


class NoSandboxNamed(SandboxNotFound):
    """A request without ``E2b-Sandbox-Id`` (and, for ``/files``, no signature either)."""


class UnknownUser(LookupError):
    """A ``user``/``username`` the sandbox has not (envd: "invalid username")."""


class EnvdInvalid(ValueError):
    """An argument envd refuses (a relative path where it needs one, a bad depth...)."""


class EnvdUnsupported(Exception):
    """What loom's envd does not offer; the message names it."""


@dataclass(frozen=True)
class Failure:
    code: Code
    status: int
    message: str


log = get_logger("worker.integrations.e2b")

#: AgentError codes with their own answer (the rest: by class, below).
_AGENT_CODES: dict[str, tuple[Code, int]] = {
    "exists": (Code.ALREADY_EXISTS, 409),
    "invalid": (Code.INVALID_ARGUMENT, 400),
    "in_workspace": (Code.INVALID_ARGUMENT, 400),
    "no_space": (Code.RESOURCE_EXHAUSTED, 507),
    "limit": (Code.RESOURCE_EXHAUSTED, 429),
    "unsupported": (Code.UNIMPLEMENTED, 501),
}

_ROWS: tuple[tuple[type[BaseException], Code, int], ...] = (
    (NoSandboxNamed, Code.INVALID_ARGUMENT, 400),
    (SandboxNotFound, Code.UNAVAILABLE, 502),
    (UnknownUser, Code.UNAUTHENTICATED, 401),
    (EnvdInvalid, Code.INVALID_ARGUMENT, 400),
    (EnvdUnsupported, Code.UNIMPLEMENTED, 501),
    (PathNotFoundError, Code.NOT_FOUND, 404),
    (WatcherNotFound, Code.NOT_FOUND, 404),
    (TooManyWatchers, Code.RESOURCE_EXHAUSTED, 429),
    (UserUnsupportedError, Code.PERMISSION_DENIED, 403),
    (PermissionDeniedError, Code.PERMISSION_DENIED, 403),
    (PathEscapeError, Code.PERMISSION_DENIED, 403),
    (NotAFileError, Code.INVALID_ARGUMENT, 400),
    (NotADirError, Code.INVALID_ARGUMENT, 400),
    (ConflictError, Code.ABORTED, 409),
    # (not resource_exhausted: the SDKs read that as a rate limit, "try again later")
    (TooLargeError, Code.FAILED_PRECONDITION, 413),
    (ReserveError, Code.RESOURCE_EXHAUSTED, 507),
    (Busy, Code.RESOURCE_EXHAUSTED, 429),
    # a refusal without a row of its own is the client's, never the infrastructure's
    (AgentError, Code.FAILED_PRECONDITION, 400),
    (NotHeldHere, Code.UNIMPLEMENTED, 501),
    (NotStartedError, Code.UNAVAILABLE, 503),
    (SandboxError, Code.UNAVAILABLE, 503),
    (ChangelogError, Code.UNAVAILABLE, 503),
)


#: The workspace's mount where a message names it: E2B's clients know it as /home/user.
_MOUNT = re.compile(r"(?<![\w./-])" + re.escape(LOOM_MOUNT) + r"(?=/|$|[\s:'\",)])")


def e2b_words(message: str) -> str:
    """``message`` with the sandbox's paths as E2B names them."""
    return _MOUNT.sub(E2B_HOME, message)


def failure(e: BaseException) -> Failure | None:
    """How ``e`` is answered; None for an error of none of the kinds above (a bug: the
    caller lets it rise)."""
    if isinstance(e, AgentError) and e.code in _AGENT_CODES:
        code, status = _AGENT_CODES[e.code]
        return Failure(code, status, e2b_words(str(e)))
    for cls, code, status in _ROWS:
        if isinstance(e, cls):
            message = e2b_words(str(e))
            if code is Code.UNAVAILABLE and status == 502:
                # E2B's proxy's words: its SDKs tell a sandbox gone by "was not found".
                message = f"The sandbox was not found: {e}"
            elif code is Code.UNAVAILABLE:
                message = f"The sandbox cannot be used right now: {e}"
                log.warning("e2b.envd_unavailable", error=str(e)[:500], kind=type(e).__name__)
            return Failure(code, status, message)
    return None


def connect_error(e: BaseException) -> ConnectError | None:
    """``e`` as a Connect error (None: not one of ours)."""
    if isinstance(e, ConnectError):
        return e
    f = failure(e)
    return None if f is None else ConnectError(f.code, f.message)


def json_error(status: int, message: str) -> JSONResponse:
    """An error as envd's REST API answers one."""
    return JSONResponse(
        {"code": status, "message": message}, status_code=status, headers={"X-Content-Type-Options": "nosniff"}
    )


def http_error(e: BaseException) -> JSONResponse | None:
    """``e`` as envd's JSON error (None: not one of ours)."""
    f = failure(e)
    return None if f is None else json_error(f.status, f.message)
