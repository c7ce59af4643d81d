"""One open request/response channel to a running agent.

A transport gives raw bytes; this module turns them into matched request/response pairs
with ids, host-side deadlines and failure translation. Everything the agent sends is
untrusted: a line over :data:`~sandbox.protocol.MAX_RESPONSE_BYTES`, non-JSON, or an
unknown id is a :class:`~sandbox.errors.ProtocolError` and ends the connection.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import json
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from . import protocol
from .errors import ProtocolError, SandboxLostError, SandboxTimeoutError, agent_error

log = structlog.get_logger("sandbox.connection")


class Transport(abc.ABC):
    """Raw bytes to and from one agent process."""

    @abc.abstractmethod
    async def read(self) -> tuple[bytes, bytes]:
        """Next (stdout, stderr) bytes; ``(b"", b"")`` only at end of stream."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes to the agent's stdin. Raises OSError when the stream is gone."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the stream; the agent sees EOF and exits, killing what it started."""


class AgentConnection:
    """Matched requests over one :class:`Transport`; safe for concurrent callers."""

    def __init__(self, transport: Transport, *, label: str = "agent") -> None:
        self._transport = transport
        self._label = label
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._stderr: deque[bytes] = deque(maxlen=32)
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._hello: asyncio.Future[dict[str, Any]] | None = None
        self.closed = False
        self.close_reason = ""
        self._nonce: str | None = None
        self.forged = 0  # lines without this connection's secret, dropped
        #: Unsolicited events of long-lived processes, by process id (see sandbox.process).
        self.event_handlers: dict[int, Callable[[dict[str, Any]], None]] = {}

    async def start(self, config: dict[str, Any], *, timeout: float = 20.0) -> dict[str, Any]:
        """Deliver the agent and its config; return its hello.

        Raises SandboxLostError if it does not come up within ``timeout``.
        """
        loop = asyncio.get_running_loop()
        self._nonce = secrets.token_hex(16)
        config = {**config, "nonce": self._nonce}
        self._hello = loop.create_future()
        self._pending[0] = self._hello
        self._reader = asyncio.create_task(self._read_loop(), name=f"loom-{self._label}-reader")
        try:
            await self._transport.write(protocol.boot_payload(config))
            return await asyncio.wait_for(asyncio.shield(self._hello), timeout)
        except BaseException as e:
            await self.close(f"agent did not start: {e!r}")
            if self._hello.done() and not self._hello.cancelled():
                self._hello.exception()  # retrieved: reported below instead
            if isinstance(e, TimeoutError | OSError | SandboxLostError):
                raise SandboxLostError(f"The sandbox agent did not start: {self.diagnostics()}") from e
            raise

    def diagnostics(self) -> str:
        """The agent's last stderr lines (why it died), for error messages."""
        text = b"".join(self._stderr).decode("utf-8", "replace").strip()
        return text[-2000:] or self.close_reason or "no output"

    async def request(self, op: str, args: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """Send one request and wait for its answer.

        Raises AgentError subclasses for refusals, SandboxLostError when the stream ends,
        SandboxTimeoutError when ``timeout`` passes (the connection is then closed,
        because an agent that misses its deadline cannot be trusted to be in sync).
        """
        if self.closed:
            raise SandboxLostError(f"Sandbox connection is closed ({self.close_reason})")
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        payload = dict(args)
        payload["id"] = rid
        payload["op"] = op
        try:
            async with self._write_lock:
                await self._transport.write(protocol.encode(payload))
            resp = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            await self.close(f"no answer to {op} within {timeout:.1f}s")
            raise SandboxTimeoutError(f"The sandbox did not answer {op} within {timeout:.1f}s") from None
        except OSError as e:
            await self.close(f"write failed: {e!r}")
            raise SandboxLostError(f"The sandbox connection broke: {e}") from e
        finally:
            self._pending.pop(rid, None)
        if resp.get("ok") is True:
            result = resp.get("result")
            if not isinstance(result, dict):
                raise ProtocolError(f"agent answered {op} with a non-object result")
            return result
        code = resp.get("code")
        msg = resp.get("error")
        if not isinstance(code, str) or not isinstance(msg, str):
            raise ProtocolError(f"agent answered {op} with a malformed error")
        raise agent_error(code, msg[:4000])

    async def _read_loop(self) -> None:
        buf = bytearray()
        reason = "agent exited"
        try:
            while True:
                out, err = await self._transport.read()
                if err:
                    self._stderr.append(err[-4096:])
                if not out and not err:
                    break
                buf += out
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        if len(buf) > protocol.MAX_RESPONSE_BYTES:
                            raise ProtocolError("agent response line exceeds the size limit")
                        break
                    line = bytes(buf[:nl])
                    del buf[: nl + 1]
                    self._dispatch(line)
        except ProtocolError as e:
            reason = f"protocol error: {e}"
        except (OSError, asyncio.IncompleteReadError) as e:
            reason = f"stream error: {e!r}"
        except asyncio.CancelledError:
            reason = "connection closed"
            raise
        finally:
            self._fail_all(reason)

    def _dispatch(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError as e:
            raise ProtocolError(f"agent sent a line that is not JSON: {line[:200]!r}") from e
        if not isinstance(msg, dict):
            raise ProtocolError("agent sent a non-object")
        if self._nonce is not None and msg.get("k") != self._nonce:
            # Written into the stream by something other than our agent: never trusted.
            self.forged += 1
            log.warning("sandbox.forged_message", connection=self._label, count=self.forged)
            return
        if "event" in msg:
            proc = msg.get("proc")
            handler = self.event_handlers.get(proc) if isinstance(proc, int) else None
            if handler is not None:
                handler(msg)
            return
        rid = msg.get("id")
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise ProtocolError(f"agent sent a response without a valid id: {str(msg)[:200]}")
        fut = self._pending.get(rid)
        if fut is None:
            # A late answer to a request the host already gave up on: harmless, dropped.
            return
        if not fut.done():
            if rid == 0:
                if msg.get("ok") is not True or not isinstance(msg.get("result"), dict):
                    fut.set_exception(SandboxLostError("agent hello was malformed"))
                else:
                    fut.set_result(msg["result"])
                self._pending.pop(0, None)
            else:
                fut.set_result(msg)

    def _fail_all(self, reason: str) -> None:
        self.closed = True
        self.close_reason = self.close_reason or reason
        for handler in list(self.event_handlers.values()):
            handler({"event": "lost", "reason": self.close_reason})
        self.event_handlers.clear()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(
                    SandboxLostError(
                        f"The sandbox went away during the call ({self.close_reason}); agent said: {self.diagnostics()}"
                    )
                )
        self._pending.clear()

    async def close(self, reason: str = "closed by host") -> None:
        if not self.close_reason:
            self.close_reason = reason
        self.closed = True
        reader = self._reader
        try:
            await self._transport.close()
        except OSError:
            pass
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            try:
                await reader
            except (asyncio.CancelledError, Exception):
                pass
        self._fail_all(reason)
