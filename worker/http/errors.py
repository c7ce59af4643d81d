"""The service's one error table: which HTTP status every error a route raises gets.

Routes raise; they never build an error response themselves. The table is read top to
bottom and the first row whose class the error is an instance of answers it, in the
order :mod:`worker.registry.execution` sorts a tool call's failures:

=================  ======  ===================================================================
kind               status  errors
=================  ======  ===================================================================
caller             4xx     the request itself: a body or query refused by its model (422), a
                           workspace id (422), something not found (404), a name taken or a
                           state that refuses the request (409), too large (413); an agent's
                           error by its code (``not_found`` 404, ``too_large`` 413, the
                           policy's codes 403, the rest 409); a part this service does not
                           have (409; tool search 404, image pulls 501), a workspace's parts
                           on a service that does not hold them (501: a cluster's front door
                           carries those routes to the workspace's node); the port proxy's: a
                           request it cannot pass on (400), nothing valid answering (502)
limit              429     too many calls at once (``Retry-After``)
                   409     the snapshots a workspace may keep (``LOOM_MAX_SNAPSHOTS``)
                   507     storage the service keeps is full: the changelog's reserve
                           (:class:`~worker.changelog.errors.ReserveError`: free space the
                           data directory must keep, so the call did not start), the
                           snapshot store's disk. 507 rather than 429: waiting does not help,
                           an operator must free space
policy             403     refused by policy: a path that leaves the workspace, a command the
                           policy refuses (:class:`~worker.tool.PolicyError`); the agent's
                           refusals (a path escape, a permission, a user the workspace may
                           not run as) by their code, in the agent's row above
settings           422     a setting refused, ``detail[0].loc`` naming the field
infrastructure     503     the sandbox, the changelog's storage (a damaged changelog and
                           changes not recorded name the file), the host's disk; retry or
                           call the operator
(anything else)    500     a bug: logged with its traceback (``http.internal_error``)
=================  ======  ===================================================================

The bodies: ``{"detail": "..."}``, with what a client acts on beside it (an agent's
``error`` code, an undo's ``conflicts``, a snapshot's ``forks``); a refused field as
FastAPI's own validation errors put it (``{"detail": [{"loc": [...], "msg": ...}]}``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.responses import JSONResponse, Response

from sandbox.errors import AgentError, SandboxError
from sandbox.logs import get_logger

from ..catalog.search import InvalidQueryError
from ..changelog.errors import (
    ChangelogError,
    ChangelogStorageError,
    EntryNotFoundError,
    ReserveError,
    UndoConflictError,
    UndoRefusedError,
)
from ..egress.secrets import SecretError
from ..harness.handle import HarnessArgumentError
from ..jsontext import finite
from ..kernels.contexts import CodeArgumentError
from ..service import Busy, InvalidWorkspaceId, WorkspaceExists, WorkspaceNotFound, encode_json
from ..snapshots.errors import (
    ScratchError,
    SnapshotDiskFullError,
    SnapshotError,
    SnapshotInUseError,
    SnapshotLimitError,
    SnapshotNotFoundError,
)
from ..terminals import TerminalArgumentError
from ..tool import PolicyError
from ..workspace_settings import SettingsError
from .state import NotHeldHere

log = get_logger("worker.http")

Kind = Literal["caller", "limit", "policy", "settings", "infrastructure"]
#: The order of the kinds in the table (and of the execution module's sorting).
KINDS: tuple[Kind, ...] = ("caller", "limit", "policy", "settings", "infrastructure")


class NotOffered(Exception):
    """A route of a part this service does not have (no changelog, no call history, no
    tool search, a backend that does not pull images). ``status`` is the row's."""


class NoChangelog(NotOffered):
    def __init__(self) -> None:
        super().__init__("This service records no changelog")


class NoCallHistory(NotOffered):
    def __init__(self) -> None:
        super().__init__("This service records no call history")


class NoToolSearch(NotOffered):
    def __init__(self) -> None:
        super().__init__("Tool search is not enabled on this service")


class NoImagePulls(NotOffered):
    def __init__(self) -> None:
        super().__init__("this service's sandbox backend does not pull images")


class Gone(LookupError):
    """Something of a workspace that is not there (a process of a sandbox that is not
    running, a secret not set): a 404 with this message, or with ``body`` (a tool's
    result that says so)."""

    def __init__(self, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.body = body


class Invalid(ValueError):
    """A value of the request that no model could check alone (a cursor, a base64 body):
    a 422, ``loc`` naming where it was."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


class Unavailable(Exception):
    """A host resource this route needs failed (the message says which, and only what
    may be shown): a 503."""


class BodyTooLarge(Exception):
    """A request body beyond the service's limit (:mod:`.body_limit`): a 413."""


class PortUnreachable(Exception):
    """The port proxy reached the sandbox, but nothing (valid) answers on the port: a 502."""


class Unforwardable(Exception):
    """A request the port proxy cannot pass on as HTTP/1.1 (h11 refuses it): a 400."""


#: An agent's codes refused by policy (403) and their other 4xx; any other code is 409.
AGENT_STATUS: Mapping[str, int] = {
    "not_found": 404,
    "too_large": 413,
    "invalid_pattern": 422,
    "escape": 403,
    "permission": 403,
    "user_unsupported": 403,
}


def _detail(e: Exception) -> dict[str, Any]:
    return {"detail": str(e)}


def _prefixed(prefix: str) -> Callable[[Exception], dict[str, Any]]:
    def body(e: Exception) -> dict[str, Any]:
        return {"detail": f"{prefix}: {e}"}

    return body


def _loc(loc: list[str], msg: str) -> dict[str, Any]:
    return {"detail": [{"loc": loc, "msg": msg, "type": "value_error"}]}


def _validation(e: Exception) -> dict[str, Any]:
    assert isinstance(e, RequestValidationError)
    return {"detail": jsonable_encoder(e.errors())}


def _setting(e: Exception) -> dict[str, Any]:
    assert isinstance(e, SettingsError)
    return _loc(["body", *e.field.split(".")], e.message)


def _secret(e: Exception) -> dict[str, Any]:
    assert isinstance(e, SecretError)
    return _loc(["body", e.field.split(".")[-1]], e.message)


def _invalid(e: Exception) -> dict[str, Any]:
    assert isinstance(e, Invalid)
    return _loc(list(e.loc), e.message)


@dataclass(frozen=True)
class Row:
    """One row: errors of ``error`` get ``status`` (or ``by_code``'s, for an agent's
    error) and ``body``; ``kind`` places the row in the table's order."""

    error: type[Exception]
    kind: Kind
    status: int
    body: Callable[[Exception], dict[str, Any]] = _detail
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The status by an agent's error's ``code`` (else ``status``).
    by_code: Mapping[str, int] | None = None

    def statuses(self) -> set[int]:
        """Every status this row may answer with."""
        return {self.status, *(self.by_code or {}).values()}

    def status_for(self, e: BaseException) -> int:
        """The status this row answers ``e`` with."""
        if self.by_code is not None and isinstance(e, AgentError):
            return self.by_code.get(e.code, self.status)
        return self.status

    def answer(self, e: Exception) -> Response:
        return _json(self.body(e), self.status_for(e), dict(self.headers) or None)


def _agent(e: Exception) -> dict[str, Any]:
    assert isinstance(e, AgentError)
    return {"detail": str(e), "error": e.code}


def _conflicts(e: Exception) -> dict[str, Any]:
    assert isinstance(e, UndoConflictError)
    return {"detail": str(e), "conflicts": e.conflicts}


def _forks(e: Exception) -> dict[str, Any]:
    assert isinstance(e, SnapshotInUseError)
    return {"detail": str(e), "forks": e.forks}


def _query(e: Exception) -> dict[str, Any]:
    assert isinstance(e, InvalidQueryError)
    return {"detail": str(e), "code": e.code}


def _gone(e: Exception) -> dict[str, Any]:
    assert isinstance(e, Gone)
    return e.body if e.body is not None else {"detail": str(e)}


def _code(e: Exception) -> dict[str, Any]:
    assert isinstance(e, CodeArgumentError)
    return _loc(["body", e.field], e.message)


def _harness(e: Exception) -> dict[str, Any]:
    return {"detail": str(e), "error": "invalid"}


#: The table. A row below one of a base class of its error would never be reached: the
#: error-table test refuses that, and kinds out of :data:`KINDS`' order.
TABLE: tuple[Row, ...] = (
    # -- the caller's mistakes ------------------------------------------------------------
    Row(RequestValidationError, "caller", 422, _validation),
    Row(Invalid, "caller", 422, _invalid),
    Row(HarnessArgumentError, "caller", 422, _harness),
    Row(CodeArgumentError, "caller", 422, _code),
    Row(TerminalArgumentError, "caller", 422, _harness),
    Row(InvalidQueryError, "caller", 422, _query),
    Row(InvalidWorkspaceId, "caller", 422),
    Row(WorkspaceNotFound, "caller", 404),
    Row(EntryNotFoundError, "caller", 404),
    Row(SnapshotNotFoundError, "caller", 404),
    Row(Gone, "caller", 404, _gone),
    Row(NoToolSearch, "caller", 404),
    Row(NoImagePulls, "caller", 501),
    Row(NotHeldHere, "caller", 501),
    Row(NotOffered, "caller", 409),
    Row(WorkspaceExists, "caller", 409),
    Row(UndoConflictError, "caller", 409, _conflicts),
    Row(UndoRefusedError, "caller", 409),
    Row(SnapshotInUseError, "caller", 409, _forks),
    Row(ScratchError, "caller", 409),
    Row(BodyTooLarge, "caller", 413),
    Row(AgentError, "caller", 409, _agent, by_code=AGENT_STATUS),
    Row(Unforwardable, "caller", 400),
    Row(PortUnreachable, "caller", 502),
    # -- limits ---------------------------------------------------------------------------
    Row(Busy, "limit", 429, headers={"Retry-After": "1"}),
    Row(SnapshotLimitError, "limit", 409),
    Row(ReserveError, "limit", 507),
    Row(SnapshotDiskFullError, "limit", 507),
    # -- policy (and, above, the agent's refusals by code: escape, permission, user) --------
    Row(PolicyError, "policy", 403),
    # -- settings -------------------------------------------------------------------------
    Row(SettingsError, "settings", 422, _setting),
    Row(SecretError, "settings", 422, _secret),
    # -- infrastructure -------------------------------------------------------------------
    Row(Unavailable, "infrastructure", 503),
    Row(SandboxError, "infrastructure", 503, _prefixed("Sandbox unavailable")),
    Row(ChangelogStorageError, "infrastructure", 503, _prefixed("Changelog unavailable")),
    Row(ChangelogError, "infrastructure", 503, _prefixed("Changelog unavailable")),
    Row(SnapshotError, "infrastructure", 503, _prefixed("Snapshot failed")),
    Row(OSError, "infrastructure", 503, _prefixed("Unavailable")),
)


def row_of(e: BaseException) -> Row | None:
    """The first row of the table whose class ``e`` is an instance of."""
    for row in TABLE:
        if isinstance(e, row.error):
            return row
    return None


def status_of(e: BaseException) -> int | None:
    """The status the table gives ``e`` (None: none, a 500). A WebSocket route closes
    with 4000 + it (:mod:`.terminals`)."""
    row = row_of(e)
    return None if row is None else row.status_for(e)


def answer(e: Exception) -> Response:
    """The response to ``e``: its row's, else a 500 (logged with its traceback)."""
    row = row_of(e)
    if row is not None:
        return row.answer(e)
    log.error("http.internal_error", error=f"{type(e).__name__}: {e}"[:300], exc_info=e)
    return _json({"detail": f"Internal error: {type(e).__name__}"}, 500, None)


def _json(body: Any, status: int, headers: dict[str, str] | None) -> Response:
    # The errors may echo the input: a lone surrogate or a non-finite number in it must
    # not turn the answer into a 500 (as in common.SafeJSONResponse).
    try:
        return JSONResponse(body, status_code=status, headers=headers)
    except UnicodeEncodeError:
        return Response(encode_json(body), status_code=status, headers=headers, media_type="application/json")
    except ValueError:
        return Response(encode_json(finite(body)), status_code=status, headers=headers, media_type="application/json")


async def _handle(_request: Request, e: Exception) -> Response:
    return answer(e)


#: Exception handlers as Starlette takes them (``create_app(exception_handlers=...)``).
Handlers = dict[int | type[Exception], Callable[[Request, Any], Any]]

#: The app's exception handlers: every class of the table, and ``Exception`` (the 500),
#: to one function that walks the table in its order (Starlette itself would pick the
#: handler of the nearest class in the error's MRO, whatever the order).
HANDLERS: Handlers = {
    **{row.error: _handle for row in TABLE},
    Exception: _handle,
}

__all__ = [
    "HANDLERS",
    "KINDS",
    "TABLE",
    "BodyTooLarge",
    "Gone",
    "Handlers",
    "Invalid",
    "NoCallHistory",
    "NoChangelog",
    "NoImagePulls",
    "NoToolSearch",
    "NotOffered",
    "PortUnreachable",
    "Row",
    "Unavailable",
    "Unforwardable",
    "answer",
    "row_of",
    "status_of",
]
