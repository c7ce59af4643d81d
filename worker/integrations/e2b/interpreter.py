"""E2B's code interpreter (``e2b-code-interpreter``; its server is ``template/server`` in
e2b-dev/code-interpreter), on loom's code contexts (:mod:`worker.kernels`).

The SDK sends these requests to the sandbox's port 49999 (the header ``E2b-Sandbox-Port:
49999``); every request for that port is this module's, whatever its path (envd has a
``/health`` too: :class:`PortRoute` tells them apart, and these routes come first)::

    GET    /health                  "OK"
    POST   /execute                 {code, context_id?, language?, env_vars?}: a stream (below)
    POST   /contexts                {language?, cwd?}: {id, language, cwd}
    GET    /contexts                [{id, language, cwd}, ...]
    POST   /contexts/{id}/restart   null (a new kernel: its state is lost)
    DELETE /contexts/{id}           null

An execution answers newline-delimited JSON, one object a line as it happens, as E2B's
server does: ``{"type": "stdout" | "stderr", "text", "timestamp"}`` (ISO 8601, as the
kernel's message date E2B's server passes on), ``{"type": "result", "text"?, "html"?,
"markdown"?, "svg"?, "png"?, "jpeg"?, "pdf"?, "latex"?, "json"?, "javascript"?, "data"?,
"chart"?, "extra", "is_main_result"}``, ``{"type": "number_of_executions",
"execution_count"}``, ``{"type": "error", "name", "value", "traceback"}``, a
``{"type": "keepalive"}`` after every :data:`KEEPALIVE` seconds without a line, and last
``{"type": "end_of_execution"}``. Where loom differs: the execution count comes with the
end (E2B's comes first: the SDK reads it from either place); ``data`` and ``chart`` (E2B's
``e2b/data`` and ``e2b/chart`` MIME types, made by formatters E2B's image registers) are
passed on when the sandbox's image makes them, which loom's default image does not; a
kernel restarted under the execution (it did not stop at an interrupt, or died) is the
error ``ContextRestarting``, as E2B's; the sandbox lost mid-stream is the error
``UnexpectedEndOfExecution``.

Contexts are loom's (``ctx-...``; the default Python context ``ctx-python``, made at its
first use), each a kernel in the workspace's sandbox; their ``cwd`` is ``/home/user`` (the
workspace) or a directory under it. Only Python has a kernel here: another language is a
501 naming it. ``env_vars`` are set in the kernel's ``os.environ`` for the one execution,
as E2B's server does (a line put before the code: its tracebacks count one line more),
and put back after it.

What the code changes in the workspace is recorded in the changelog as the execution's
(tool ``e2b.run_code``), undoable, as any. An execution has no time limit of its own, as
E2B's has not (the SDK's ``timeout`` is the request's): **a client that goes away
mid-execution (its timeout, a closed connection) interrupts it**, as E2B's server does:
the code gets KeyboardInterrupt, the context's state is kept, and what it changed until
then is recorded.

Errors are answered as E2B's server answers them (plain text; the SDK maps the status):
400 a request it refuses (``context_id`` and ``language`` both), 404 no such context, 422
a body its model refuses, 429 the service is busy (``Retry-After``), 501 a language or a
working directory loom does not offer, 502 no such sandbox (``... was not found``: the SDK
says the sandbox was killed or timed out), 503 the sandbox is unavailable (infrastructure).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import posixpath
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, StrictStr
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from sandbox.errors import AgentError, PathNotFoundError
from sandbox.logs import get_logger

from ... import kernels
from ...http import errors
from ...jsontext import json_line
from ...kernels.contexts import CodeArgumentError, check_env
from ...service import Busy, WorkspaceNotFound
from .target import E2B_HOME, JUPYTER_PORT, SandboxNotFound, Target, sandbox_id_of, target_of, to_e2b, to_loom

#: Seconds without a line after which a keepalive line is sent (E2B's server's interval):
#: an idle proxy keeps the connection, and a client gone is found by the next write.
KEEPALIVE = 5.0
#: How the changelog and the call journal name an execution made through this API.
TOOL = "e2b.run_code"
#: The longest an interrupt sent for a client gone may take (the sandbox unreachable).
INTERRUPT_WAIT = 10.0
#: The languages E2B's server speaks, as it normalizes them.
_ALIASES = {"js": "javascript", "ts": "typescript"}
NDJSON = "application/x-ndjson"

log = get_logger("worker.e2b.interpreter")


def _port(scope: Scope) -> int | None:
    for key, value in scope.get("headers") or ():
        if key == b"e2b-sandbox-port":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class PortRoute(APIRoute):
    """A route that matches only the requests for the code interpreter's port
    (``E2b-Sandbox-Port: 49999``): the others go on to the next routes."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get("type") != "http" or _port(scope) != JUPYTER_PORT:
            return Match.NONE, {}
        return super().matches(scope)


router = APIRouter(include_in_schema=False, route_class=PortRoute)


class NotOffered(Exception):
    """Something E2B's interpreter has and loom does not: a 501 saying so."""


class ExecuteBody(BaseModel):
    code: StrictStr
    context_id: StrictStr | None = None
    language: StrictStr | None = None
    env_vars: dict[StrictStr, str] | None = None


class ContextBody(BaseModel):
    cwd: StrictStr | None = E2B_HOME
    language: StrictStr | None = "python"


# -- the request's parts -----------------------------------------------------------------


def language_of(value: str | None) -> str:
    """E2B's language name as its server normalizes it (``js`` is ``javascript``); one
    with a kernel here. Raises NotOffered."""
    lang = (value or "python").strip().lower()
    lang = _ALIASES.get(lang, lang)
    if lang not in kernels.LANGUAGES:
        raise NotOffered(
            f"{lang!r} code is not offered by this server: loom's code contexts have a kernel for "
            f"{', '.join(kernels.LANGUAGES)} only (run other languages with sandbox.commands.run)"
        )
    return lang


def workdir_of(cwd: str | None) -> str:
    """A context's E2B ``cwd`` as loom's (relative to the workspace). Raises NotOffered for
    one outside the workspace (``/home/user``)."""
    path = to_loom(cwd or E2B_HOME)
    rel = posixpath.relpath(path, "/workspace")
    if rel == ".." or rel.startswith("../"):
        raise NotOffered(
            f"a code context in {cwd} is not offered by this server: its kernels start in {E2B_HOME} (the "
            f"workspace) or a directory under it; change directory in the code (os.chdir) to work elsewhere"
        )
    return rel


_ENV = """\
import os
ip = __import__("IPython").get_ipython()
saved = {k: os.environ.get(k) for k in env}
os.environ.update(env)
def restore(*_):
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    ip.events.unregister("post_run_cell", restore)
ip.events.register("post_run_cell", restore)
"""


def with_env(code: str, env: dict[str, str]) -> str:
    """``code`` that sets ``env`` in the kernel's ``os.environ`` for its own run and puts
    the earlier values back after it (IPython's ``post_run_cell``, which runs whether the
    code raised or not). As E2B's server, one line before the code, indented as its first
    line (IPython takes an indented cell when its lines share the indent); the setting
    runs in a namespace of its own, never the user's."""
    if not env:
        return code
    first = next((line for line in code.split("\n") if line.strip()), "")
    indent = first[: len(first) - len(first.lstrip())]
    return f"{indent}exec({_ENV!r}, {{'env': {env!r}}})\n{code}"


# -- the stream's lines ------------------------------------------------------------------


def _line(obj: dict[str, Any]) -> bytes:
    return (json_line(obj) + "\n").encode()


def timestamp(ns: int) -> str:
    """Unix nanoseconds as E2B's server writes an output's time (ISO 8601, UTC)."""
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat()


def result_line(r: kernels.Result) -> dict[str, Any]:
    """A Result as E2B's server sends one: its fields by E2B's names, ``data`` and
    ``chart`` from E2B's own MIME types, the other types in ``extra``; a text in quotes
    (a string's repr) without them, as E2B's server shows it."""
    d: dict[str, Any] = {"type": "result"}
    for name in kernels.MIME_FIELDS.values():
        value = getattr(r, name)
        if value is not None:
            d[name] = value
    text = d.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        d["text"] = text[1:-1]
    extra = dict(r.extra or {})
    for mime, name in (("e2b/data", "data"), ("e2b/chart", "chart")):
        if mime in extra:
            d[name] = extra.pop(mime)
    d["extra"] = extra
    d["is_main_result"] = r.is_main_result
    return d


def event_lines(ev: kernels.CodeEvent) -> list[dict[str, Any]]:
    """The lines E2B's server sends for one of loom's events (an Execution, last: its
    count and its error)."""
    if isinstance(ev, kernels.OutputMessage):
        return [{"type": ev.kind, "text": ev.text, "timestamp": timestamp(ev.timestamp)}]
    if isinstance(ev, kernels.Result):
        return [result_line(ev)]
    out: list[dict[str, Any]] = []
    if ev.execution_count is not None:
        out.append({"type": "number_of_executions", "execution_count": ev.execution_count})
    if ev.error is not None:
        out.append({"type": "error", **ev.error.to_dict()})
    elif ev.outcome in ("restarted", "kernel_died"):
        # E2B's name for a kernel restarted under an execution; loom's message says why.
        out.append({"type": "error", "name": "ContextRestarting", "value": ev.message, "traceback": ""})
    return out


# -- the answers -------------------------------------------------------------------------


def _text(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return PlainTextResponse(message, status_code=status, headers=headers)


def gone(sandbox_id: str | None) -> Response:
    """No such sandbox, as E2B's proxy answers (502; its SDK reads ``was not found`` as a
    sandbox killed or timed out)."""
    message = f"The sandbox {sandbox_id} was not found" if sandbox_id else "No sandbox named (E2b-Sandbox-Id)"
    return JSONResponse({"code": 502, "message": message, "sandboxId": sandbox_id}, status_code=502)


def refusal(e: Exception, request: Request, context: str | None = None) -> Response:
    """The answer to ``e``, raised before an execution's stream or by a context's route.
    Raises ``e`` when the service's error table has no row for it (a bug: the app logs it)."""
    if isinstance(e, SandboxNotFound | WorkspaceNotFound):
        return gone(sandbox_id_of(request))
    if isinstance(e, NotOffered):
        return _text(501, str(e))
    if context is not None and (
        (isinstance(e, CodeArgumentError) and e.field == "context")
        or (isinstance(e, AgentError) and e.code == "not_found" and not isinstance(e, PathNotFoundError))
    ):
        return _text(404, f"Context {context} not found")
    if isinstance(e, CodeArgumentError):
        return _text(400, str(e))
    if isinstance(e, PathNotFoundError):
        return _text(400, f"cwd: no such directory in the sandbox: {e}")
    if isinstance(e, Busy):
        return _text(429, f"The service is busy: retry shortly ({e})", {"Retry-After": "1"})
    if errors.row_of(e) is None:
        raise e
    answer = errors.answer(e)
    body = json.loads(bytes(answer.body))
    detail = body.get("detail") if isinstance(body, dict) else None
    return _text(answer.status_code, detail if isinstance(detail, str) else json.dumps(detail))


async def _answer(request: Request, context: str | None, fn: Callable[[Target], Awaitable[Response]]) -> Response:
    try:
        t = await target_of(request)
        return await fn(t)
    except Exception as e:
        return refusal(e, request, context)


# -- the routes --------------------------------------------------------------------------


@router.get("/health")
async def health() -> Response:
    return JSONResponse("OK")


@router.post("/contexts")
async def create_context(request: Request, body: ContextBody) -> Response:
    async def go(t: Target) -> Response:
        language = language_of(body.language)
        workdir = workdir_of(body.cwd)
        runner = t.service.runner
        runner.opened.add(t.path)  # (stopped with the service: an image without a kernel has started it)
        async with runner.slot():
            ctx = await t.handle.create_code_context(language, workdir)
        return JSONResponse({"id": ctx.id, "language": ctx.language, "cwd": to_e2b(ctx.cwd)})

    return await _answer(request, None, go)


@router.get("/contexts")
async def list_contexts(request: Request) -> Response:
    async def go(t: Target) -> Response:
        found = await t.handle.code_contexts()
        return JSONResponse([{"id": c.id, "language": c.language, "cwd": to_e2b(c.cwd)} for c in found])

    return await _answer(request, None, go)


@router.post("/contexts/{context_id}/restart")
async def restart_context(request: Request, context_id: str) -> Response:
    async def go(t: Target) -> Response:
        async with t.service.runner.slot():
            await t.handle.restart_code_context(context_id)
        return JSONResponse(None)

    return await _answer(request, context_id, go)


@router.delete("/contexts/{context_id}")
async def remove_context(request: Request, context_id: str) -> Response:
    async def go(t: Target) -> Response:
        async with t.service.runner.slot():
            await t.handle.delete_code_context(context_id)
        return JSONResponse(None)

    return await _answer(request, context_id, go)


@router.post("/execute")
async def execute(request: Request, body: ExecuteBody) -> Response:
    """Run code in a context (``context_id``, else ``language``'s default context) and
    stream what it prints and shows, as E2B's server does."""
    if body.context_id and body.language:
        return _text(400, "Only one of context_id or language can be provided")
    stack = contextlib.AsyncExitStack()
    try:
        t = await target_of(request)
        language = language_of(body.language) if body.language else None
        code = with_env(body.code, check_env(body.env_vars))
        kernels.check_code(code, kernels.MAX_TIMEOUT)
        runner = t.service.runner
        await stack.enter_async_context(runner.slot())  # (a full service is a 429 before any byte)
        runner.opened.add(t.path)  # (stopped with the service: a refusal below may come once it started)
        ctx = await t.handle.code_context(body.context_id, language)
        await t.handle.check_reserve()  # (a status, not a stream whose first line says it)
        ws = await t.workspace()
        # No time limit but the longest loom has: E2B's has none, its client's timeout ends
        # the request, and a client gone interrupts the code (see ExecutionStream).
        events = t.handle.run_code_stream(code, ctx.id, None, kernels.MAX_TIMEOUT, tool=TOOL, hold=stack)
    except Exception as e:
        await stack.aclose()
        return refusal(e, request, body.context_id)
    except BaseException:
        await stack.aclose()
        raise

    async def interrupt() -> None:
        await kernels.interrupt(ws, ctx.id)

    return ExecutionStream(events, interrupt, stack)


class ExecutionStream(StreamingResponse):
    """One execution's lines (see the module's docstring). When the client goes before
    the execution's end, the execution is interrupted, as E2B's server does; the cleanup
    runs shielded from the cancellation that ends the stream (Starlette cancels it when
    the client goes, and never closes the iterator itself)."""

    def __init__(
        self,
        events: AsyncIterator[kernels.CodeEvent],
        interrupt: Callable[[], Awaitable[None]],
        stack: contextlib.AsyncExitStack,
    ) -> None:
        self.events = events
        self.interrupt = interrupt
        self.stack = stack
        self.ended = False
        self.pending: asyncio.Future[kernels.CodeEvent] | None = None
        self.lines = self._lines()
        super().__init__(self.lines, media_type=NDJSON, headers={"Cache-Control": "no-store"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    async def _lines(self) -> AsyncGenerator[bytes, None]:
        # (No await in a finally here: a cancelled stream would cancel it again.)
        it = self.events
        while not self.ended:
            if self.pending is None:
                self.pending = asyncio.ensure_future(anext(it))
            done, _ = await asyncio.wait({self.pending}, timeout=KEEPALIVE)
            if not done:
                yield _line({"type": "keepalive"})
                continue
            got, self.pending = self.pending, None
            try:
                ev = got.result()
            except Exception as e:  # the sandbox lost mid-stream (the code's own errors are lines)
                self.ended = True
                yield _line(_unexpected_end(e))
                break
            if isinstance(ev, kernels.Execution):
                self.ended = True
            for obj in event_lines(ev):
                yield _line(obj)
        yield _line({"type": "end_of_execution"})

    async def _close(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        if not self.ended:
            # The client went mid-execution: interrupted, as E2B's server does (#213 there);
            # the execution then ends, recorded, in its own task.
            with anyio.move_on_after(INTERRUPT_WAIT), contextlib.suppress(Exception):
                await self.interrupt()
        with contextlib.suppress(Exception):
            await self.lines.aclose()
        with contextlib.suppress(Exception):
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()
        await self.stack.aclose()


def _unexpected_end(e: Exception) -> dict[str, Any]:
    if errors.row_of(e) is None:  # a bug: said with its traceback, as the service's own
        log.error("e2b.execute_failed", error=f"{type(e).__name__}: {e}"[:300], exc_info=e)
        what = f"internal error: {type(e).__name__}"
    else:
        body = json.loads(bytes(errors.answer(e).body))
        what = str(body.get("detail")) if isinstance(body, dict) else str(body)
    return {
        "type": "error",
        "name": "UnexpectedEndOfExecution",
        "value": f"The execution ended before its end was known ({what}): run the code again",
        "traceback": "",
    }


@router.api_route("/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def not_found(path: str) -> Response:
    """Any other path of the interpreter's port: not found, as E2B's server answers."""
    return JSONResponse({"detail": "Not Found"}, status_code=404)


def routes(settings: Any) -> list[Any]:
    return list(router.routes)
