"""The service's one error table (:mod:`worker.http.errors`): its order, every row as the
service answers it, and a walk of the route table proving no route decides a status of
its own."""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from sandbox.errors import (
    AgentError,
    KernelUnavailableError,
    PathEscapeError,
    PathNotFoundError,
    SandboxError,
    SandboxUnavailableError,
    TooLargeError,
    UserUnsupportedError,
)
from worker.catalog.search import InvalidQueryError
from worker.changelog.errors import (
    ChangelogDamagedError,
    ChangelogError,
    ChangelogStorageError,
    ChangesNotRecordedError,
    EntryNotFoundError,
    ReserveError,
    UndoConflictError,
    UndoRefusedError,
)
from worker.egress.secrets import SecretError
from worker.harness.handle import HarnessArgumentError
from worker.http import create_app
from worker.http import errors as table
from worker.http.app import route_table
from worker.http.state import NotHeldHere
from worker.kernels import CodeArgumentError
from worker.registry import ToolRegistry
from worker.service import Busy, InvalidWorkspaceId, WorkspaceExists, WorkspaceNotFound
from worker.settings import Settings
from worker.snapshots.errors import (
    ScratchError,
    ScratchLimitError,
    SnapshotDiskFullError,
    SnapshotError,
    SnapshotInUseError,
    SnapshotLimitError,
    SnapshotNotFoundError,
)
from worker.terminals import TerminalArgumentError
from worker.tool import PolicyError
from worker.workspace_settings import SettingsError

#: One error of each row's class (a new row needs one here), and what the service answers.
SAMPLES: dict[type[Exception], tuple[Exception, int, dict[str, Any]]] = {
    RequestValidationError: (RequestValidationError([{"loc": ("body", "x"), "msg": "m", "type": "t"}]), 422, {}),
    table.Invalid: (table.Invalid(("query", "since"), "bad cursor"), 422, {}),
    HarnessArgumentError: (HarnessArgumentError("timeout out of range"), 422, {"error": "invalid"}),
    TerminalArgumentError: (TerminalArgumentError("cols must be an integer 1-1000"), 422, {"error": "invalid"}),
    CodeArgumentError: (
        CodeArgumentError("language", "'cobol' is not a language of this worker's kernels"),
        422,
        {
            "detail": [
                {
                    "loc": ["body", "language"],
                    "msg": "'cobol' is not a language of this worker's kernels",
                    "type": "value_error",
                }
            ]
        },
    ),
    InvalidQueryError: (InvalidQueryError("empty"), 422, {"code": "INVALID_QUERY"}),
    InvalidWorkspaceId: (InvalidWorkspaceId("bad id"), 422, {}),
    WorkspaceNotFound: (WorkspaceNotFound("no w"), 404, {}),
    EntryNotFoundError: (EntryNotFoundError("no entry 3"), 404, {}),
    SnapshotNotFoundError: (SnapshotNotFoundError("no snapshot"), 404, {}),
    table.Gone: (table.Gone("no process"), 404, {}),
    table.NoToolSearch: (table.NoToolSearch(), 404, {}),
    table.NoImagePulls: (table.NoImagePulls(), 501, {}),
    NotHeldHere: (NotHeldHere("its node answers this route"), 501, {}),
    table.NotOffered: (table.NoChangelog(), 409, {}),
    WorkspaceExists: (WorkspaceExists("taken"), 409, {}),
    UndoConflictError: (UndoConflictError("changed since", ["a.txt"]), 409, {"conflicts": ["a.txt"]}),
    UndoRefusedError: (UndoRefusedError("tampered"), 409, {}),
    SnapshotInUseError: (SnapshotInUseError("in use", ["f1"]), 409, {"forks": ["f1"]}),
    ScratchError: (ScratchError("no tar in the image"), 409, {}),
    table.BodyTooLarge: (table.BodyTooLarge("too large"), 413, {}),
    AgentError: (AgentError("a directory", code="is_a_directory"), 409, {"error": "is_a_directory"}),
    table.Unforwardable: (table.Unforwardable("not HTTP/1.1"), 400, {}),
    table.PortUnreachable: (table.PortUnreachable("nothing listens"), 502, {}),
    Busy: (Busy("too many calls"), 429, {}),
    SnapshotLimitError: (SnapshotLimitError("32 snapshots"), 409, {}),
    ReserveError: (ReserveError("below the reserve"), 507, {}),
    SnapshotDiskFullError: (SnapshotDiskFullError("disk full"), 507, {}),
    PolicyError: (PolicyError("Path '../x' is outside the workspace"), 403, {}),
    SettingsError: (SettingsError("env.FOO", "reserved"), 422, {}),
    SecretError: (SecretError("hosts", "an entry is refused"), 422, {}),
    table.Unavailable: (table.Unavailable("could not be stored: OSError"), 503, {}),
    SandboxError: (SandboxUnavailableError("engine down"), 503, {}),
    ChangelogStorageError: (ChangelogStorageError("disk"), 503, {}),
    ChangelogError: (ChangelogError("closed"), 503, {}),
    SnapshotError: (SnapshotError("copy failed"), 503, {}),
    OSError: (OSError(5, "I/O error"), 503, {}),
}
#: Errors answered by a row of a base class, as the execution module sorts them.
SUBCLASSES: list[tuple[Exception, int, str]] = [
    (PathNotFoundError("Not found: a.txt"), 404, "not_found"),
    (TooLargeError("big", code="too_large"), 413, "too_large"),
    (PathEscapeError("outside"), 403, "escape"),
    (UserUnsupportedError("root is not allowed"), 403, "user_unsupported"),
    (KernelUnavailableError("no ipykernel in the image", missing=["ipykernel"]), 409, "kernel_unavailable"),
    (ChangelogDamagedError(Path("/data/w/changelog.db"), "truncated"), 503, "changelog.db"),
    (ChangesNotRecordedError("ran; changes recorded at the next use"), 503, "next use"),
    (ScratchLimitError("the sandbox is at its process limit"), 409, "process limit"),
]


def test_the_table_is_in_the_order_of_the_kinds_and_no_row_is_shadowed() -> None:
    ranks = [table.KINDS.index(row.kind) for row in table.TABLE]
    assert ranks == sorted(ranks), [(row.error.__name__, row.kind) for row in table.TABLE]
    for i, row in enumerate(table.TABLE):
        for earlier in table.TABLE[:i]:
            assert not issubclass(row.error, earlier.error), f"{row.error.__name__} is answered by {earlier.error}"


def test_every_row_has_a_sample() -> None:
    assert {row.error for row in table.TABLE} == set(SAMPLES)


@pytest.fixture
async def app(tmp_path: Path, local_backend: Any) -> AsyncIterator[FastAPI]:
    app = create_app(Settings(workspace_root=tmp_path / "root"), ToolRegistry(backend=local_backend))
    probe = APIRouter()

    @probe.get("/probe/{n}")
    async def raise_sample(n: int) -> None:
        raise _errors()[n]

    app.include_router(probe)
    yield app


def _errors() -> list[Exception]:
    return [e for e, _s, _b in SAMPLES.values()] + [e for e, _s, _w in SUBCLASSES] + [RuntimeError("a bug")]


async def _get(app: FastAPI, n: int) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.get(f"/probe/{n}")


async def test_each_row_is_answered_as_the_table_says(app: FastAPI) -> None:
    for n, (error, status, extra) in enumerate(SAMPLES.values()):
        r = await _get(app, n)
        assert r.status_code == status, (type(error).__name__, r.text)
        body = r.json()
        assert "detail" in body
        for key, value in extra.items():
            assert body[key] == value, (type(error).__name__, body)
    assert (await _get(app, list(SAMPLES).index(Busy))).headers["retry-after"] == "1"


async def test_settings_refusals_name_the_field(app: FastAPI) -> None:
    r = await _get(app, list(SAMPLES).index(SettingsError))
    assert r.json()["detail"][0]["loc"] == ["body", "env", "FOO"]


async def test_subclasses_go_by_their_code_and_infrastructure_names_the_file(app: FastAPI) -> None:
    base = len(SAMPLES)
    for n, (_error, status, word) in enumerate(SUBCLASSES):
        r = await _get(app, base + n)
        assert r.status_code == status and word in r.text, r.text


async def test_anything_else_is_a_logged_500(app: FastAPI) -> None:
    with structlog.testing.capture_logs() as logs:
        r = await _get(app, len(SAMPLES) + len(SUBCLASSES))
    assert r.status_code == 500 and "RuntimeError" in r.json()["detail"]
    assert any(e["event"] == "http.internal_error" and "a bug" in e["error"] for e in logs), logs


# -- the route walk ------------------------------------------------------------------------

#: Statuses a route may document that are not the table's: the guard's (worker.auth).
GUARD = {401, 403}


def _table_statuses() -> set[int]:
    return set().union(*(row.statuses() for row in table.TABLE)) | {500}


def _decides_a_status(fn: Any) -> list[str]:
    """The places where ``fn`` builds an error response itself, or answers an error it
    caught with a value rather than a raise (or :func:`~worker.http.errors.answer`)."""
    tree = ast.parse(inspect.getsource(inspect.unwrap(fn)).lstrip())  # (a method's source is indented)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "status_code" and not (isinstance(kw.value, ast.Constant) and kw.value.value < 400):
                    found.append(f"line {node.lineno}: status_code={ast.unparse(kw.value)}")
        if isinstance(node, ast.ExceptHandler):
            for inner in ast.walk(node):
                # (a bare return ends a stream already answered: its error was an event)
                if (
                    isinstance(inner, ast.Return)
                    and inner.value is not None
                    and not (isinstance(inner.value, ast.Call) and ast.unparse(inner.value.func) == "answer")
                ):
                    found.append(f"line {inner.lineno}: returns from `except {ast.unparse(node.type or ast.Pass())}`")
    return found


def _helpers(fn: Any) -> list[Any]:
    """``fn`` and the functions of its own module it calls (one level: the route's helpers)."""
    module = sys.modules[fn.__module__]
    names = {
        n.func.id
        for n in ast.walk(ast.parse(inspect.getsource(inspect.unwrap(fn)).lstrip()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    own = [getattr(module, name, None) for name in sorted(names)]
    return [fn, *(f for f in own if inspect.isfunction(f) and f.__module__ == fn.__module__)]


def test_every_route_raises_and_documents_only_statuses_of_the_table(tmp_path: Path) -> None:
    app = create_app(Settings(workspace_root=tmp_path))
    assert all(app.exception_handlers[row.error] is app.exception_handlers[Exception] for row in table.TABLE)
    allowed = _table_statuses() | GUARD
    walked = 0
    for route in route_table(app):
        if not isinstance(route, APIRoute):
            continue
        walked += 1
        documented = {int(s) for s in route.responses if str(s).isdigit() and int(s) >= 400}
        assert documented <= allowed, (route.path, documented - allowed)
        if not route.endpoint.__module__.startswith("worker."):
            continue  # the MCP SDK's and the dashboard's static files
        for fn in _helpers(route.endpoint):
            assert _decides_a_status(fn) == [], (route.path, fn.__qualname__, _decides_a_status(fn))
    assert walked > 40


def test_the_port_proxy_and_the_body_limit_answer_through_the_table() -> None:
    from worker.http import body_limit, ports, ports_ws

    for module in (ports, ports_ws, body_limit):
        source = inspect.getsource(module)
        assert "status_code=" not in source and "_problem(" not in source, module.__name__
