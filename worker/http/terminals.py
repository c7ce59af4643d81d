"""A workspace's interactive terminals (:mod:`worker.terminals`) over HTTP and a WebSocket:

    POST   /v1/workspaces/{id}/terminals           {"command"?, "cols"?, "rows"?, "cwd"?, "env"?}  201 TerminalInfo
    GET    /v1/workspaces/{id}/terminals           {"terminals": [TerminalInfo, ...]}, oldest first
    GET    /v1/workspaces/{id}/terminals/{tid}     TerminalInfo
    DELETE /v1/workspaces/{id}/terminals/{tid}     kill it (and everything it started): TerminalInfo
    WS     /v1/workspaces/{id}/terminals/{tid}/ws?since=N   its screen, both ways (below)

Opening one starts the sandbox; listing, reading and the WebSocket never do (a terminal
of a sandbox that is not running is a 404, a close 4404). A terminal outlives every
connection to it: closing the page detaches, the terminal goes on until its process ends
or is killed, and any number of clients may attach, one after the other or at once.

The WebSocket's protocol, ``loom.terminal.v1`` (offer it as a subprotocol; the server
chooses it, and never echoes another, the ``loom.bearer.<token>`` one of a browser
included: :mod:`worker.auth`):

- server → client: first one text frame ``{"type": "attached", "id", "cursor",
  "dropped", "cols", "rows"}`` (``cursor``: the absolute offset, in the terminal's output,
  of the next byte sent; ``dropped``: bytes of output lost before it, the scrollback kept
  being bounded), then binary frames, the terminal's output bytes as they come (what was
  kept since ``since`` first: ``since`` omitted replays the whole kept scrollback, a
  client that kept count of ``cursor`` resumes where it stopped), and when the process
  has ended and its output is sent, ``{"type": "exit", "exit_code", "outcome",
  "signal"}`` and a close 1000;
- client → server: binary frames, input bytes (keys as the terminal gets them: ``\\r``
  for Enter); text frames, JSON: ``{"type": "resize", "cols": C, "rows": R}``,
  ``{"type": "signal", "signal": "INT"}`` (a name, with or without ``SIG``, or a
  number; to the terminal's foreground process group), ``{"type": "input", "data":
  "text"}``. A message it cannot act on is answered ``{"type": "error", "message"}``;
  the connection stays.
- refusals: the connection is accepted, then closed with ``4000 +`` the HTTP status the
  service's error table gives (:mod:`.errors`): 4404 no such workspace or terminal, 4503
  the sandbox is unavailable, ...; the reason says why. 1011: an error of the service.

Output is read from the terminal only as fast as the client takes it (each frame is sent
before the next is read), and input only as fast as the terminal takes it (uvicorn reads
the next frame once this one is handed over): nothing is buffered without bound here. A
terminal whose reader falls behind its bounded scrollback loses the oldest output, which
``dropped`` counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, WebSocket
from fastapi import Path as PathParam
from pydantic import Field, field_validator
from starlette.websockets import WebSocketDisconnect

from sandbox.base import ProcessInfo
from sandbox.errors import AgentError, TunnelClosedError
from sandbox.logs import get_logger
from sandbox.protocol import env_problem

from ..auth import accept_subprotocol
from ..harness.handle import SandboxHandle
from ..terminals import MAX_SIZE, MIN_SIZE, Terminal, TerminalArgumentError, signal_number
from .common import WS_ERRORS, StrictModel, WorkspaceId, sandbox_runs
from .errors import Gone, Invalid, status_of
from .state import Service, ServiceDep, service_of

log = get_logger("worker.http.terminals")

#: The WebSocket subprotocol of this route.
PROTOCOL = "loom.terminal.v1"
_TERMINAL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
TerminalId = PathParam(pattern=f"^{_TERMINAL_ID.pattern}$", description="Terminal id.")
#: The largest input message: a paste of this much is one write.
MAX_INPUT = 1 << 20
#: A close reason is at most 123 bytes (RFC 6455 5.5: a control frame's 125, less the code).
_REASON_BYTES = 123

router = APIRouter(tags=["terminals"])
_BASE = "/v1/workspaces/{workspace_id}/terminals"
_ERRORS = {**WS_ERRORS, 404: {"description": "No such workspace or terminal"}}


class OpenBody(StrictModel):
    command: list[str] | None = Field(
        None, min_length=1, description="An argv, run as it is (no shell). Omitted or null: a login shell."
    )
    cols: int = Field(80, ge=MIN_SIZE, le=MAX_SIZE, strict=True, description="Columns.")
    rows: int = Field(24, ge=MIN_SIZE, le=MAX_SIZE, strict=True, description="Rows.")
    cwd: str = Field(".", min_length=1, max_length=4096, description="Relative to the workspace, or absolute.")
    env: dict[str, str] | None = Field(None, description="Variables on top of the sandbox's.")

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        if (problem := env_problem(env)) is not None:
            raise ValueError(problem)
        return env


class TerminalInfo(StrictModel):
    id: str
    command: str = Field(
        description="What runs in it, as one line (the login shell's, e.g. `/bin/bash -l`, when none was given)."
    )
    cols: int
    rows: int
    pid: int | None = None
    started: float = Field(description="Epoch seconds.")
    running: bool
    ended: float | None = None
    exit_code: int | None = Field(None, description="128 + n when a signal n ended it (as a shell says it).")
    outcome: str | None = Field(None, description="How it ended: exit, timeout or signal.")
    signal: int | None = Field(None, description="The signal that ended it.")
    output_bytes: int = Field(description="Bytes it has printed: the offset its output ends at.")


class TerminalList(StrictModel):
    terminals: list[TerminalInfo]


def _info(p: ProcessInfo) -> TerminalInfo:
    cols, rows = p.pty or (0, 0)
    return TerminalInfo(
        id=p.id,
        command=p.command,
        cols=cols,
        rows=rows,
        pid=p.pid,
        started=p.started,
        running=p.running,
        ended=p.ended,
        exit_code=p.exit_code,
        outcome=p.outcome,
        signal=p.signal,
        output_bytes=p.stdout_bytes,
    )


async def _handle(service: Service, workspace_id: str) -> SandboxHandle | None:
    """The workspace's sandbox handle when its container runs (None: no terminals, and
    none is started for a look). Raises InvalidWorkspaceId, WorkspaceNotFound,
    SandboxError, NotHeldHere."""
    path: Path = await service.workspaces.locate(workspace_id)
    registry = service.local
    if not await sandbox_runs(registry.backend, path):
        return None
    return registry.sandbox(path)


async def _running(service: Service, workspace_id: str, terminal_id: str) -> SandboxHandle:
    """As :func:`_handle`; raises Gone when the sandbox is not running."""
    handle = await _handle(service, workspace_id)
    if handle is None:
        raise Gone(f"No terminal {terminal_id}: the sandbox is not running")
    return handle


@router.post(_BASE, status_code=201, responses=_ERRORS, response_model=TerminalInfo)
async def open_terminal(service: ServiceDep, workspace_id: WorkspaceId, body: OpenBody) -> TerminalInfo:
    """Open a terminal: ``command`` (a login shell when omitted) on a new pseudo-terminal
    of ``cols`` x ``rows`` in the workspace's sandbox (started if it is not). Its screen:
    the WebSocket ``.../terminals/{tid}/ws``."""
    path = await service.workspaces.locate(workspace_id)
    runner = service.runner
    runner.opened.add(path)  # stopped with the service (a refused cwd or command may have started it)
    async with runner.slot():
        term = await service.local.sandbox(path).open_terminal(
            body.command, cols=body.cols, rows=body.rows, cwd=body.cwd, env=body.env
        )
    try:
        return _info(term.info)
    finally:
        await term.close()  # detached: it goes on


@router.get(_BASE, responses=_ERRORS, response_model=TerminalList)
async def list_terminals(service: ServiceDep, workspace_id: WorkspaceId) -> TerminalList:
    """The workspace's terminals (running, or ended within their linger time), oldest
    first. Never starts a sandbox."""
    handle = await _handle(service, workspace_id)
    infos = [] if handle is None else await handle.terminals()
    return TerminalList(terminals=[_info(t) for t in infos])


@router.get(f"{_BASE}/{{terminal_id}}", responses=_ERRORS, response_model=TerminalInfo)
async def get_terminal(service: ServiceDep, workspace_id: WorkspaceId, terminal_id: str = TerminalId) -> TerminalInfo:
    """One terminal."""
    handle = await _running(service, workspace_id, terminal_id)
    for t in await handle.terminals():
        if t.id == terminal_id:
            return _info(t)
    raise Gone(f"No terminal {terminal_id}")


@router.delete(f"{_BASE}/{{terminal_id}}", responses=_ERRORS, response_model=TerminalInfo)
async def kill_terminal(service: ServiceDep, workspace_id: WorkspaceId, terminal_id: str = TerminalId) -> TerminalInfo:
    """Kill the terminal's process and everything it started; its state once ended."""
    handle = await _running(service, workspace_id, terminal_id)
    return _info(await handle.kill_terminal(terminal_id))


# -- the WebSocket ----------------------------------------------------------------------------


def close_code(e: BaseException) -> tuple[int, str]:
    """The close code and reason of a refusal: 4000 + the error table's status, or 1011."""
    status = status_of(e)
    if status is None:
        return 1011, f"Internal error: {type(e).__name__}"
    return 4000 + status, str(e) or type(e).__name__


def _reason(text: str) -> str:
    data = text.encode("utf-8")
    if len(data) <= _REASON_BYTES:
        return text
    return data[: _REASON_BYTES - 3].decode("utf-8", "ignore") + "..."


@router.websocket(f"{_BASE}/{{terminal_id}}/ws")
async def terminal_ws(
    websocket: WebSocket,
    workspace_id: str,
    terminal_id: str,
    since: str | None = Query(None, description="Output offset to resume from (default: the kept scrollback)."),
) -> None:
    """The terminal's screen, both ways, over the WebSocket subprotocol ``loom.terminal.v1``.

    Query ``since``: an offset in its output to resume from (default: the scrollback
    kept). The server sends a text frame ``{"type": "attached", ...}``, then the output as
    binary frames, at its end ``{"type": "exit", ...}`` and a close 1000; the client
    sends input as binary frames and JSON text frames (``resize``, ``signal``,
    ``input``). A refusal is a close 4000 + the HTTP status (4404: no such workspace or
    terminal). The whole protocol: [terminals](../terminals.md#http-and-websocket)."""
    # (the parameters are checked here, not by FastAPI, so that a refusal is a close
    # with its reason rather than a handshake refused without one)
    service = service_of(websocket.app)
    subprotocol = accept_subprotocol(websocket.scope, (PROTOCOL,))  # (never the token's)
    try:
        if not _TERMINAL_ID.fullmatch(terminal_id):
            raise Gone(f"No terminal {terminal_id[:64]!r}")
        handle = await _running(service, workspace_id, terminal_id)
        term = await handle.attach_terminal(terminal_id, since=_offset(since))
    except Exception as e:
        code, why = close_code(e)
        if code == 1011:
            log.error("terminal.attach_failed", error=f"{type(e).__name__}: {e}"[:300], exc_info=e)
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):  # (a client already gone)
            await websocket.accept(subprotocol=subprotocol)
            await websocket.close(code, _reason(why))
        return
    try:
        await websocket.accept(subprotocol=subprotocol)
        await _Session(websocket, term).run()
    finally:
        with contextlib.suppress(Exception):
            await term.close()  # detached: the terminal goes on


def _offset(since: str | None) -> int | None:
    """``since`` as an offset. Raises Invalid (a 422: a close 4422)."""
    if since is None:
        return None
    if not since.isascii() or not since.isdigit() or len(since) > 19:
        raise Invalid(("query", "since"), "since: an offset in the output, an integer >= 0")
    return int(since)


class _Session:
    """One attached client: the output pump and the input reader, until either ends."""

    def __init__(self, websocket: WebSocket, term: Terminal) -> None:
        self.ws = websocket
        self.term = term
        self._send_lock = asyncio.Lock()

    async def _send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send(message)

    async def _text(self, payload: dict[str, Any]) -> None:
        await self._send({"type": "websocket.send", "text": json.dumps(payload)})

    async def run(self) -> None:
        cols, rows = self.term.info.pty or (0, 0)
        attached = {"id": self.term.id, "cursor": self.term.cursor, "dropped": self.term.dropped}
        try:
            await self._text({"type": "attached", **attached, "cols": cols, "rows": rows})
        except (WebSocketDisconnect, OSError):
            return  # the client left at once
        pump = asyncio.create_task(self._pump())
        reader = asyncio.create_task(self._read())
        try:
            done, _ = await asyncio.wait({pump, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, reader):
                task.cancel()
            for task in (pump, reader):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        task = done.pop()
        error = task.exception()
        if task is reader and error is None:
            return  # the client left: detached
        if error is None:  # the output ended: the program too
            end = self.term.info
            if end.running:  # (its state could not be read as the stream ended)
                with contextlib.suppress(Exception):
                    end = await asyncio.wait_for(self.term.wait(), 10.0)
            await self._close_after(
                {"type": "exit", "exit_code": end.exit_code, "outcome": end.outcome, "signal": end.signal}, 1000, ""
            )
            return
        if isinstance(error, (WebSocketDisconnect, OSError)):
            return  # (a send to a client that left)
        code, why = close_code(error)
        if code == 1011:
            log.error("terminal.ws_failed", error=f"{type(error).__name__}: {error}"[:300], exc_info=error)
        await self._close_after(None, code, why)

    async def _close_after(self, payload: dict[str, Any] | None, code: int, why: str) -> None:
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
            if payload is not None:
                await self._text(payload)
            await self.ws.close(code, _reason(why))

    async def _pump(self) -> None:
        output = self.term.output()
        try:
            async for chunk in output:
                if chunk:
                    await self._send({"type": "websocket.send", "bytes": bytes(chunk)})
        finally:  # (an async generator left early is finalized now, not by the GC)
            aclose = getattr(output, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _read(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data, text = message.get("bytes"), message.get("text")
            if data is not None:
                if len(data) > MAX_INPUT:
                    await self._text({"type": "error", "message": f"input of {len(data)} bytes: at most {MAX_INPUT}"})
                    continue
                await self._act(self.term.write(data))
            elif text is not None:
                await self._control(text)

    async def _act(self, step: Awaitable[Any]) -> None:
        """Run one action the client asked for. What the terminal refuses (it has ended,
        a size out of range) is answered in an error frame; the sandbox lost ends the
        session (the output's end closes it when the program has ended)."""
        try:
            await step
        except TunnelClosedError:
            await self._text({"type": "error", "message": "the terminal has ended: input not delivered"})
        except (AgentError, ValueError) as e:
            await self._text({"type": "error", "message": str(e)})

    async def _control(self, text: str) -> None:
        try:
            action = control_action(self.term, text)
        except ValueError as e:
            await self._text({"type": "error", "message": str(e)})
            return
        await self._act(action())


def _size(msg: dict[str, Any], key: str) -> int:
    v = msg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not MIN_SIZE <= v <= MAX_SIZE:
        raise TerminalArgumentError(f"resize: {key} must be an integer {MIN_SIZE}-{MAX_SIZE}, not {v!r}")
    return v


def control_action(term: Terminal, text: str) -> Callable[[], Awaitable[Any]]:
    """What a text frame asks of ``term``, ready to run. Raises ValueError (answered in
    an error frame) for a message it cannot act on."""
    size = len(text) if len(text) > MAX_INPUT else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_INPUT:  # (bytes: "€" is three)
        raise ValueError(f"a message of {size} bytes: at most {MAX_INPUT}")
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError):  # (RecursionError: "[[[[..." nested past the parser's depth)
        raise ValueError('a text message is JSON: {"type": "resize" | "signal" | "input", ...}') from None
    kind = msg.get("type") if isinstance(msg, dict) else None
    if kind == "resize":
        cols, rows = _size(msg, "cols"), _size(msg, "rows")
        return lambda: term.resize(cols, rows)
    if kind == "signal":
        sig = signal_number(msg.get("signal"))  # (a name such as INT, or a number)
        return lambda: term.signal(sig)
    if kind == "input":
        data = msg.get("data")
        if not isinstance(data, str):
            raise ValueError("input: data must be a string")
        return lambda: term.write(data.encode("utf-8", "replace"))
    raise ValueError(f"unknown message type {kind!r}: resize, signal or input")


__all__ = ["PROTOCOL", "close_code", "control_action", "router"]
