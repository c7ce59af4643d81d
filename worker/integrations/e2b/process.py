"""envd's process service (``process.Process``, ``spec/envd/process/process.proto``):
what E2B's SDKs call for ``sandbox.commands`` and ``sandbox.pty``.

Served by connect-python's ASGI server (the SDK's generated ``ProcessASGIApplication``):
Connect over HTTP/1.1 with the JSON and the binary protobuf codecs, unary calls and
server streams, and client streams (``StreamInput``: the client sends its whole stream,
then reads the answer). The sandbox is the request's ``E2b-Sandbox-Id`` (see
:mod:`.target`); the user its ``Authorization: Basic base64(user:)`` (``user``: the
sandbox's user, the workspace's owner; ``root`` only where the workspace allows it).

A process is one of loom's background processes (a PTY one of its terminals), see
:mod:`.process_runners`; the table of E2B's pids and the streams is
:mod:`.process_table`. Every change a process makes in the workspace is recorded in the
changelog (``loom-worker log``, ``undo``) before the client hears that it ended.

What envd does and this does too: ``Start`` streams StartEvent{pid}, the output
(stdout/stderr, or the terminal's) as it comes, then EndEvent{exitCode, exited, status,
error} (Go's words: ``exit status 1``, ``signal: killed``); ``Connect-Timeout-Ms`` of
``Start`` is the process's lifetime (killed then, the stream ending with
``deadline_exceeded``); ``Keepalive-Ping-Interval`` (seconds) sends a KeepAlive event
when nothing else was sent for that long; ``Connect`` (by pid or tag) streams the output
from then on, or the start and end of a process that ended within 30 s. Errors are
Connect's codes as envd answers them (``not_found``, ``invalid_argument``...); a
sandbox that does not exist is ``unavailable`` saying it "was not found" (the SDK's
``SandboxNotRunningException``), one that cannot be reached ``unavailable``; a limit
(too many processes) ``resource_exhausted``; the command policy's refusal
``permission_denied``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import structlog
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import Process, ProcessASGIApplication
from starlette.requests import Request
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox.errors import AgentError, SandboxError, SandboxUnavailableError

from ...http.state import NotHeldHere, NotStartedError
from ...tool import PolicyError
from . import process_events as ev
from .process_start import start_process
from .process_table import SandboxProcs, events
from .target import SandboxNotFound, Target, target_of

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: envd's interval between KeepAlive events when the client names none (seconds).
DEFAULT_KEEPALIVE = 90.0
#: The request an RPC serves (its scope: the app, the headers), for the service's methods.
_REQUEST: contextvars.ContextVar[Request] = contextvars.ContextVar("e2b_process_request")


class ProcessService(Process):
    """``process.Process`` on loom (the generated ``Process`` protocol)."""

    def __init__(self) -> None:
        self._sandboxes: dict[str, SandboxProcs] = {}

    # -- what every call needs ------------------------------------------------------------

    async def _target(self) -> Target:
        """The sandbox of the request being served. Raises ConnectError."""
        try:
            return await target_of(_REQUEST.get())
        except SandboxNotFound:
            sandbox = _REQUEST.get().headers.get("e2b-sandbox-id") or ""
            raise ev.sandbox_gone(sandbox, "it was killed, or never made") from None
        except NotStartedError:
            raise ConnectError(Code.UNAVAILABLE, "the service is starting or stopping: try again") from None

    def _procs(self, sandbox_id: str) -> SandboxProcs:
        procs = self._sandboxes.get(sandbox_id)
        if procs is None:
            procs = self._sandboxes[sandbox_id] = SandboxProcs(sandbox_id, on_empty=self._forget)
        return procs

    def _forget(self, sandbox_id: str) -> None:
        procs = self._sandboxes.get(sandbox_id)
        if procs is not None and not procs.by_pid:
            del self._sandboxes[sandbox_id]

    async def _table(self) -> SandboxProcs:
        return self._procs((await self._target()).sandbox_id)

    # -- the RPCs -------------------------------------------------------------------------

    async def list(self, request: pb.ListRequest, ctx: RequestContext[Any, Any], /) -> pb.ListResponse:
        async def go() -> pb.ListResponse:
            procs = await self._table()
            return pb.ListResponse(processes=[p.info() for p in procs.running()])

        return await self._unary(ctx, go())

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[pb.StartResponse]:
        t = await self._target()
        deadline = _deadline(ctx)
        try:
            proc = await start_process(t, request, user=_username(ctx), timeout_ms=_timeout_ms(ctx))
        except BaseException as e:
            raise _translate(e, t.sandbox_id) from None
        q = proc.subscribe()  # (before its output is read: the stream gets all of it)
        self._procs(t.sandbox_id).add(proc)
        yield pb.StartResponse(event=ev.start_event(proc.pid))
        async for event in events(proc, q, deadline=deadline, keepalive=_keepalive(ctx), timeout_is_deadline=True):
            yield pb.StartResponse(event=event)

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[pb.ConnectResponse]:
        procs = await self._table()
        proc = procs.find(request.process, running=False)
        q = proc.subscribe()
        yield pb.ConnectResponse(event=ev.start_event(proc.pid))
        stream = events(proc, q, deadline=_deadline(ctx), keepalive=_keepalive(ctx), timeout_is_deadline=False)
        async for event in stream:
            yield pb.ConnectResponse(event=event)

    async def update(self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any], /) -> pb.UpdateResponse:
        async def go() -> pb.UpdateResponse:
            procs = await self._table()
            proc = procs.find(request.process)
            size = request.pty.size if request.pty is not None else None
            if size is not None:
                await proc.runner.resize(size.cols, size.rows)
            return pb.UpdateResponse()

        return await self._unary(ctx, go())

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any], /
    ) -> pb.StreamInputResponse:
        async def go() -> pb.StreamInputResponse:
            procs = await self._table()
            proc = None
            async for message in request:
                event = message.event
                if event is None or event.field == "keepalive":
                    continue
                if event.field == "start":
                    proc = procs.find(event.value.process)
                elif proc is None:
                    raise ConnectError(Code.INVALID_ARGUMENT, "the stream's first event names the process (start)")
                else:
                    await _write(proc.runner, event.value.input)
            return pb.StreamInputResponse()

        return await self._unary(ctx, go())

    async def send_input(self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any], /) -> pb.SendInputResponse:
        async def go() -> pb.SendInputResponse:
            procs = await self._table()
            await _write(procs.find(request.process).runner, request.input)
            return pb.SendInputResponse()

        return await self._unary(ctx, go())

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.SendSignalResponse:
        async def go() -> pb.SendSignalResponse:
            procs = await self._table()
            proc = procs.find(request.process)
            if request.signal not in (pb.Signal.SIGKILL, pb.Signal.SIGTERM):
                raise ConnectError(Code.UNIMPLEMENTED, f"invalid signal: {request.signal.name} (SIGTERM or SIGKILL)")
            await proc.runner.signal(int(request.signal))
            return pb.SendSignalResponse()

        return await self._unary(ctx, go())

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.CloseStdinResponse:
        async def go() -> pb.CloseStdinResponse:
            procs = await self._table()
            await procs.find(request.process).runner.close_stdin()
            return pb.CloseStdinResponse()

        return await self._unary(ctx, go())

    async def _unary(self, ctx: RequestContext[Any, Any], call: Awaitable[T]) -> T:
        """``call`` within the request's deadline (``Connect-Timeout-Ms``), its errors as
        Connect's. Raises ConnectError."""
        left = ctx.timeout_ms
        sandbox = _REQUEST.get().headers.get("e2b-sandbox-id") or ""
        try:
            async with asyncio.timeout(None if left is None else max(left, 0.0) / 1000.0):
                return await call
        except TimeoutError:
            raise ConnectError(Code.DEADLINE_EXCEEDED, "the request reached its timeout") from None
        except BaseException as e:
            raise _translate(e, sandbox) from None


def _translate(e: BaseException, sandbox_id: str) -> BaseException:
    """loom's errors as the Connect errors E2B's SDK acts on (what to do is in the
    message); anything else as it is."""
    if isinstance(e, ConnectError):
        return e
    if isinstance(e, PolicyError):
        return ConnectError(Code.PERMISSION_DENIED, f"loom's command policy refused the command: {e.message}")
    if isinstance(e, AgentError) and e.code == "limit":
        return ConnectError(Code.RESOURCE_EXHAUSTED, str(e))
    if isinstance(e, AgentError) and e.code == "not_found":
        return ConnectError(Code.NOT_FOUND, str(e))
    if isinstance(e, AgentError):
        return ConnectError(Code.INVALID_ARGUMENT, str(e))
    if isinstance(e, SandboxUnavailableError | SandboxError):
        return ev.unavailable(sandbox_id, str(e))
    if isinstance(e, NotHeldHere):
        return ConnectError(Code.UNIMPLEMENTED, f"this service does not hold sandbox {sandbox_id}'s processes: {e}")
    return e


async def _write(runner: Any, data: pb.ProcessInput | None) -> None:
    payload = data.input if data is not None else None
    if payload is None:
        raise ConnectError(Code.UNIMPLEMENTED, "invalid input type: send stdin or pty bytes")
    await runner.write(bytes(payload.value), pty=payload.field == "pty")


def _username(ctx: RequestContext[Any, Any]) -> str | None:
    """The user of ``Authorization: Basic base64("user:")`` (None: none named). Raises
    ConnectError (``unauthenticated``) for a header that is not one."""
    value = ctx.request_headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise ConnectError(Code.UNAUTHENTICATED, "invalid Authorization: Basic base64 of 'user:'") from None
    return decoded.partition(":")[0] or None


def _timeout_ms(ctx: RequestContext[Any, Any]) -> int | None:
    raw = ctx.request_headers.get("connect-timeout-ms")
    return int(raw) if raw and raw.isdigit() and int(raw) > 0 else None


def _deadline(ctx: RequestContext[Any, Any]) -> float | None:
    left = ctx.timeout_ms
    return None if left is None else asyncio.get_running_loop().time() + left / 1000.0


def _keepalive(ctx: RequestContext[Any, Any]) -> float:
    raw = ctx.request_headers.get("keepalive-ping-interval") or ""
    try:
        seconds = float(int(raw))
    except ValueError:
        return DEFAULT_KEEPALIVE
    return seconds if seconds > 0 else DEFAULT_KEEPALIVE


class _WithRequest:
    """The generated ASGI app, each request's scope kept for the service's methods (they
    get only the message and its Connect context)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _REQUEST.set(Request(scope)) if scope["type"] == "http" else None
        try:
            await self.app(scope, receive, send)
        finally:
            if token is not None:
                _REQUEST.reset(token)


def routes(settings: Any) -> list[Any]:
    """``/process.Process/...``: the service, one per app."""
    app = ProcessASGIApplication(ProcessService())
    return [Mount(app.path, app=_WithRequest(app))]
