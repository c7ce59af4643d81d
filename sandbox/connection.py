"""One open request/response channel to a running agent.

A transport (:mod:`sandbox.transport`) gives raw bytes; this module turns them into
matched request/response pairs with ids, host-side deadlines and failure translation.

Besides answers the agent sends events: a spawned process's output (routed by its
``proc`` to :attr:`AgentConnection.event_handlers`), a streamed command's output (by its
request's ``req``, see ``request(on_event=...)``), a tunnel's bytes (by its
``tunnel``) and a watched directory's changes (by its ``watch``; both see
:meth:`AgentConnection.set_stream_handler`). :meth:`AgentConnection.notify`
sends a request the agent does not answer. A tunnel's bytes travel raw: a line with
``"raw": N`` is followed by N bytes as they are (at most :data:`MAX_RAW`), either way.

Everything the agent sends is untrusted: a line over
:data:`~sandbox.protocol.MAX_RESPONSE_BYTES`, non-JSON, or a response without a valid id
is a :class:`~sandbox.errors.ProtocolError` and ends the connection; a line without this
connection's secret is dropped, and so is a late answer to a request already given up.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from . import protocol
from .errors import AgentError, ProtocolError, SandboxLostError, SandboxTimeoutError, agent_error
from .logs import get_logger

# The transports are in their own module; these names stay importable from here.
from .transport import ProtocolFeed, SocketTransport, StreamProtocol, StreamTransport, Transport

__all__ = [
    "MAX_RAW",
    "AgentConnection",
    "ProtocolFeed",
    "SocketTransport",
    "StreamProtocol",
    "StreamTransport",
    "Transport",
]

log = get_logger("sandbox.connection")
#: Most bytes of events held for processes whose handler is not registered yet.
_EARLY_EVENT_BYTES = 4 << 20
#: Most raw bytes one message may carry, either way (the agent's ``channel.MAX_RAW``).
MAX_RAW = 4 << 20
_decode_json = json.JSONDecoder().decode


class AgentConnection:
    """Matched requests over one :class:`Transport`; safe for concurrent callers."""

    def __init__(self, transport: Transport, *, label: str = "agent") -> None:
        self._transport = transport
        self._label = label
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._stderr: deque[bytes] = deque(maxlen=32)
        self._reader: asyncio.Task[None] | None = None
        self._buf = bytearray()  # an incomplete response line
        self._closer: asyncio.Task[None] | None = None  # push mode: closing after a protocol error
        self._write_lock = asyncio.Lock()
        self._hello: asyncio.Future[dict[str, Any]] | None = None
        self.closed = False
        self.close_reason = ""
        self._nonce: str | None = None
        self.forged = 0  # lines without this connection's secret, dropped
        #: Unsolicited events of long-lived processes, by process id (see sandbox.process).
        self.event_handlers: dict[int, Callable[[dict[str, Any]], None]] = {}
        # Events that arrive before their process's handler: the spawn's answer and the
        # process's first output can come in one chunk, before the spawner resumes.
        self._early_events: dict[int, list[tuple[dict[str, Any], int]]] = {}
        self._early_bytes = 0
        #: Events of one request (``req``: a streamed exec) or one tunnel (``tunnel``),
        #: by (that key, its id); registered before anything can arrive for them.
        self._streams: dict[tuple[str, int], Callable[[dict[str, Any]], None]] = {}
        self._tunnel_ids = itertools.count(1)
        # Raw bytes being received after the line that announced them (a tunnel's data).
        self._raw_need = 0
        self._raw_msg: dict[str, Any] | None = None
        self._raw_parts: list[bytes] = []
        #: Where the agent hands over tunnels' sockets (``sandbox.handover.FdChannel``),
        #: when the backend could take it (runc, with the direct channel); closed with this.
        self.fd_channel: Any = None

    @property
    def direct(self) -> bool:
        """True once traffic runs over the agent's direct channel (:meth:`go_direct`)."""
        return isinstance(self._transport, _Spliced)

    def set_event_handler(self, proc: int, handler: Callable[[dict[str, Any]], None]) -> None:
        """Route the events of process ``proc`` to ``handler``, first those that came early."""
        self.event_handlers[proc] = handler
        early = self._early_events.pop(proc, [])
        for msg, size in early:
            self._early_bytes -= size
            if self.event_handlers.get(proc) is handler:
                handler(msg)

    def set_stream_handler(self, kind: str, key: int, handler: Callable[[dict[str, Any]], None] | None) -> None:
        """Route events carrying ``{kind: key}`` (``kind``: ``"req"``, ``"tunnel"`` or ``"watch"``) to
        ``handler`` (None: drop them from now on). It also gets ``{"event": "lost"}``
        when the connection ends."""
        if handler is None:
            self._streams.pop((kind, key), None)
        else:
            self._streams[(kind, key)] = handler

    def owns_secret(self, value: object) -> bool:
        """Whether ``value`` is this connection's secret (a handshake on another socket)."""
        return self._nonce is not None and isinstance(value, str) and hmac.compare_digest(value, self._nonce)

    def new_tunnel_id(self) -> int:
        """A tunnel id not used before on this connection (the host names tunnels)."""
        return next(self._tunnel_ids)

    async def start(self, config: dict[str, Any], *, timeout: float = 20.0, preloaded: bool = False) -> dict[str, Any]:
        """Deliver the agent and its config (``preloaded``: only the config, the agent's
        code was sent before: a warm sandbox's); return its hello.

        Raises SandboxLostError if it does not come up within ``timeout``.
        """
        loop = asyncio.get_running_loop()
        self._nonce = secrets.token_hex(16)
        config = {**config, "nonce": self._nonce}
        self._hello = hello = loop.create_future()
        self._pending[0] = hello
        if not self._transport.start(self._on_data, self._fail_all):
            self._reader = asyncio.create_task(self._read_loop(), name=f"loom-{self._label}-reader")

        async def boot() -> dict[str, Any]:
            if preloaded:
                await self._transport.write(protocol.encode(config))
            else:
                # The agent (~0.7 MB) and its config in two writes, not one joined payload: a
                # copy of the agent less on every cold start (~0.5 ms of the worker's CPU).
                await self._transport.write(protocol.agent_bundle())
                await self._transport.write(protocol.encode(config))
            return await asyncio.shield(hello)

        try:
            if not preloaded and not protocol.bundle_built():
                # Its first build compiles the agent (tens of ms): never on the event loop.
                await asyncio.to_thread(protocol.agent_bundle)
            # The payload's write is bounded too: a stream nobody reads (a container removed
            # under its attach, which the engine may leave open) must not hold a start forever.
            return await asyncio.wait_for(boot(), timeout)
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

    async def go_direct(
        self, open_socket: Callable[[str], Awaitable[SocketTransport]], *, timeout: float, dial: str | None = None
    ) -> bool:
        """Move this connection's traffic to the agent's direct channel (see the agent's
        ``op_direct``): ask it to listen, connect with ``open_socket(path)`` and check the
        first line carries this connection's secret; with ``dial`` (a path in the
        sandbox where the host listens), ask it to connect there instead, and
        ``open_socket(dial)`` takes that connection. The old stream stays open: its end
        still means the agent is gone, and its stderr still feeds :meth:`diagnostics`.

        Returns False, staying on the current stream, when the agent's socket cannot be
        reached (``open_socket`` raised OSError: no access to the container's /proc, a
        worker inside another container, ...). Call it only while no request is in flight.

        Raises SandboxLostError when the handshake fails after connecting (the agent may
        have switched already, so this connection is closed), and the infrastructure
        errors ``request`` raises for the offer itself (a refusal by the agent: False).
        """
        if self._reader is not None or self._pending:
            return False  # pull-mode transport, or traffic in flight: stay where we are
        try:
            resp = await self.request("direct", {} if dial is None else {"dial": dial}, timeout=timeout)
        except AgentError as e:
            # The agent could not listen (an image whose /tmp is not writable to it, for
            # one: runc gives the tmpfs the mode of the image's own /tmp): stay here.
            log.info("sandbox.direct_refused", connection=self._label, error=str(e))
            return False
        path = resp.get("path")
        if not isinstance(path, str) or (path != dial if dial is not None else not path.startswith("/tmp/")):
            raise ProtocolError("agent answered direct with a bad path")
        try:
            sock = await asyncio.wait_for(open_socket(path), timeout)
        except (OSError, TimeoutError) as e:
            log.info("sandbox.direct_unavailable", connection=self._label, error=repr(e))
            return False
        try:
            # The agent writes its first line as soon as it accepts: no long wait for it.
            first = await asyncio.wait_for(sock.first_line(), min(timeout, 5.0))
            msg = _decode_json(first.decode())
            if not isinstance(msg, dict) or msg.get("k") != self._nonce or msg.get("direct") is not True:
                raise ProtocolError("the direct channel did not answer with this connection's secret")
        except (OSError, TimeoutError, ValueError, ProtocolError) as e:
            await sock.close()
            await self.close(f"direct channel handshake failed: {e!r}")
            raise SandboxLostError(f"The sandbox's direct channel failed its handshake: {e!r}") from e
        old = self._transport
        self._transport = _Spliced(old, sock)
        sock.start(self._on_data, self._fail_all)
        old.start(self._on_stderr, self._fail_all)
        return True

    def _on_stderr(self, out: bytes, err: bytes) -> None:
        # After the move to the direct channel the agent writes nothing to the attach
        # stream's stdout; anything there (a command writing into it) is ignored.
        if err:
            self._stderr.append(err[-4096:])

    async def notify(self, op: str, args: dict[str, Any], *, raw: bytes | memoryview | None = None) -> None:
        """Send a request the agent does not answer (an op of its ``NOTIFY_OPS``), with
        ``raw`` bytes after its line as they are (the agent gets them as ``data``).

        Raises SandboxLostError when the connection is closed or the write fails.
        """
        if self.closed:
            raise SandboxLostError(f"Sandbox connection is closed ({self.close_reason})")
        payload = dict(args)
        payload["op"] = op
        if raw is not None:
            payload["raw"] = len(raw)
        try:
            async with self._write_lock:
                line = protocol.encode(payload)
                if raw and len(raw) <= 65536:  # (a keystroke: one write, one message to read there)
                    await self._transport.write(line + raw)
                else:
                    await self._transport.write(line)
                    if raw:
                        await self._transport.write(bytes(raw) if isinstance(raw, memoryview) else raw)
        except OSError as e:
            await self.close(f"write failed: {e!r}")
            raise SandboxLostError(f"The sandbox connection broke: {e}") from e

    async def request(
        self,
        op: str,
        args: dict[str, Any],
        *,
        timeout: float,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        on_sent: Callable[[int], None] | None = None,
        raw: bytes | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its answer.

        ``on_event`` gets the events the agent sends for this request (``"req": id``),
        all of them before the answer, and ``{"event": "lost"}`` if the connection ends
        first. ``on_sent(id)`` is called once the request is written. ``raw`` (at most
        :data:`~sandbox.protocol.MAX_RAW_REQUEST` bytes) follows the request's line as
        it is (the agent gets it as ``data``); raw bytes after the answer's line come
        back as the result's ``_raw``.

        Raises AgentError subclasses for refusals, SandboxLostError when the stream ends,
        SandboxTimeoutError when ``timeout`` passes (the connection is then closed,
        because an agent that misses its deadline cannot be trusted to be in sync).
        """
        if self.closed:
            raise SandboxLostError(f"Sandbox connection is closed ({self.close_reason})")
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[rid] = fut
        payload = dict(args)
        payload["id"] = rid
        payload["op"] = op
        if raw is not None:
            if len(raw) > protocol.MAX_RAW_REQUEST:
                raise ValueError(f"{len(raw)} raw bytes in one request (at most {protocol.MAX_RAW_REQUEST})")
            payload["raw"] = len(raw)
        timer: asyncio.TimerHandle | None = None
        if on_event is not None:
            self._streams[("req", rid)] = on_event
        try:
            async with self._write_lock:
                await self._transport.write(protocol.encode(payload))
                if raw:
                    await self._transport.write(raw)
            if on_sent is not None:
                on_sent(rid)
            # The deadline counts from the end of the write, as asyncio.wait_for did; one
            # timer handle that fails the future is much cheaper than wait_for (a wrapper
            # coroutine, a second future and done-callbacks on every call).
            timer = loop.call_later(timeout, _expire, fut)
            resp = await fut
        except TimeoutError:
            await self.close(f"no answer to {op} within {timeout:.1f}s")
            raise SandboxTimeoutError(f"The sandbox did not answer {op} within {timeout:.1f}s") from None
        except OSError as e:
            await self.close(f"write failed: {e!r}")
            raise SandboxLostError(f"The sandbox connection broke: {e}") from e
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(rid, None)
            if on_event is not None:
                self._streams.pop(("req", rid), None)
        if resp.get("ok") is True:
            result = resp.get("result")
            if not isinstance(result, dict):
                raise ProtocolError(f"agent answered {op} with a non-object result")
            data = resp.get("data")
            if isinstance(data, bytes):
                result["_raw"] = data
            return result
        code = resp.get("code")
        msg = resp.get("error")
        if not isinstance(code, str) or not isinstance(msg, str):
            raise ProtocolError(f"agent answered {op} with a malformed error")
        raise agent_error(code, msg[:4000])

    async def _read_loop(self) -> None:
        """Pull mode: a task reads the transport and feeds what arrives."""
        reason = "agent exited"
        try:
            while True:
                out, err = await self._transport.read()
                if not out and not err:
                    break
                self._feed(out, err)
        except ProtocolError as e:
            reason = f"protocol error: {e}"
        except (OSError, asyncio.IncompleteReadError) as e:
            reason = f"stream error: {e!r}"
        except asyncio.CancelledError:
            reason = "connection closed"
            raise
        finally:
            self._fail_all(reason)

    def _on_data(self, out: bytes, err: bytes) -> None:
        """Push mode: bytes straight from the transport's ``data_received``."""
        if self.closed:
            return  # after close or a protocol error nothing the agent sends counts
        try:
            self._feed(out, err)
        except ProtocolError as e:
            self._abandon(f"protocol error: {e}")
        except Exception as e:  # a bug in an event handler: fail closed, never silently
            log.exception("sandbox.dispatch_failed", connection=self._label)
            self._abandon(f"internal error: {e!r}")

    def _abandon(self, reason: str) -> None:
        """End the connection from inside a callback: fail every caller now, then close
        the stream (the agent sees EOF and exits) in the background."""
        self._fail_all(reason)
        if self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(
                self._close_transport(), name=f"loom-{self._label}-close"
            )

    async def _close_transport(self) -> None:
        try:
            await self._transport.close()
        except OSError:
            pass

    def _feed(self, out: bytes, err: bytes) -> None:
        """Split stdout into lines and dispatch each (with the raw bytes that follow a
        line announcing them, see :meth:`_dispatch`); keep the stderr tail.

        Raises ProtocolError for an oversized line or a malformed message.
        """
        if err:
            self._stderr.append(err[-4096:])
        if not out:
            return
        start = 0
        end = len(out)
        if self._raw_need:
            start = self._take_raw(out, 0)
            if start >= end:
                return
        limit = protocol.MAX_RESPONSE_BYTES
        buf = self._buf
        if buf:
            nl = out.find(b"\n", start)
            if nl < 0:
                buf += memoryview(out)[start:]
                if len(buf) > limit:
                    raise ProtocolError("agent response line exceeds the size limit")
                return
            buf += memoryview(out)[start:nl]
            if len(buf) > limit:
                raise ProtocolError("agent response line exceeds the size limit")
            self._dispatch(buf)  # parsed into new objects: the buffer can be reused after
            buf.clear()
            start = nl + 1
            if self._raw_need:
                start = self._take_raw(out, start)
        while start < end:
            nl = out.find(b"\n", start)
            if nl < 0:
                if end - start > limit:
                    raise ProtocolError("agent response line exceeds the size limit")
                buf += memoryview(out)[start:]
                return
            if nl - start > limit:
                raise ProtocolError("agent response line exceeds the size limit")
            # The usual chunk is exactly one whole line: parse it without copying
            # (JSON allows the trailing newline as whitespace).
            self._dispatch(out if start == 0 and nl == end - 1 else out[start:nl])
            start = nl + 1
            if self._raw_need:
                start = self._take_raw(out, start)

    def _take_raw(self, out: bytes, start: int) -> int:
        """Take what ``out`` holds from ``start`` of the raw bytes being received; hand
        the message on once they are all there. Returns where the stream goes on."""
        need = self._raw_need
        avail = len(out) - start
        if not self._raw_parts and avail >= need:
            payload = out if start == 0 and need == avail else out[start : start + need]
            self._raw_need = 0
            self._raw_done(payload)
            return start + need
        take = min(need, avail)
        self._raw_parts.append(out[start : start + take])
        self._raw_need -= take
        if not self._raw_need:
            payload = b"".join(self._raw_parts)
            self._raw_parts.clear()
            self._raw_done(payload)
        return start + take

    def _raw_done(self, payload: bytes) -> None:
        msg, self._raw_msg = self._raw_msg, None
        assert msg is not None
        msg["data"] = payload
        self._handle(msg, len(payload))

    def _dispatch(self, line: bytes | bytearray) -> None:
        try:
            # The agent writes UTF-8 (json.loads would also guess UTF-16/32 first).
            msg = _decode_json(line.decode())
        except ValueError as e:  # also UnicodeDecodeError
            raise ProtocolError(f"agent sent a line that is not JSON: {bytes(line[:200])!r}") from e
        if not isinstance(msg, dict):
            raise ProtocolError("agent sent a non-object")
        if self._nonce is not None and msg.get("k") != self._nonce:
            # Written into the stream by something other than our agent: never trusted.
            # (Raw bytes it may announce are not skipped: they break the stream, which
            # then ends: a forger cannot slip its bytes in as a message.)
            self.forged += 1
            log.warning("sandbox.forged_message", connection=self._label, count=self.forged)
            return
        raw = msg.get("raw")
        if raw is not None:
            # Bytes follow the line as they are (no base64, no JSON escaping): a tunnel's
            # (an event), or an answer's (a read's data, a command's output).
            limit = protocol.MAX_RAW_ANSWER if "event" not in msg and "id" in msg else MAX_RAW
            if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= limit:
                raise ProtocolError(f"agent announced {raw!r:.40} raw bytes")
            if raw:
                self._raw_need, self._raw_msg = raw, msg
                return
            msg["data"] = b""
        self._handle(msg, len(line))

    def _handle(self, msg: dict[str, Any], size: int) -> None:
        """Route one message from the agent: an event to its handler, an answer to its caller."""
        if "event" in msg:
            if self._streams:
                for kind in ("req", "tunnel", "watch"):
                    key = msg.get(kind)
                    if key is not None:
                        stream = self._streams.get((kind, key)) if isinstance(key, int) else None
                        if stream is not None:
                            stream(msg)
                        return  # an event of a stream given up: dropped
            proc = msg.get("proc")
            handler = self.event_handlers.get(proc) if isinstance(proc, int) else None
            if handler is not None:
                handler(msg)
            elif isinstance(proc, int) and self._early_bytes + size <= _EARLY_EVENT_BYTES:
                self._early_events.setdefault(proc, []).append((msg, size))
                self._early_bytes += size
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
        """The stream ended (or is being closed): every waiting caller gets SandboxLostError."""
        self.closed = True
        self.close_reason = self.close_reason or reason
        if self.fd_channel is not None:
            self.fd_channel.close()
        for handler in list(self.event_handlers.values()):
            handler({"event": "lost", "reason": self.close_reason})
        self.event_handlers.clear()
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            stream({"event": "lost", "reason": self.close_reason})
        self._early_events.clear()
        self._early_bytes = 0
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


def _expire(fut: asyncio.Future[Any]) -> None:
    """A request's timer: its deadline passed with no answer."""
    if not fut.done():
        fut.set_exception(TimeoutError())


class _Spliced(Transport):
    """After :meth:`AgentConnection.go_direct`: requests and answers on the direct
    channel, the original stream kept open as the agent's lifeline (and stderr)."""

    def __init__(self, lifeline: Transport, direct: SocketTransport) -> None:
        self.lifeline = lifeline
        self.direct = direct

    async def read(self) -> tuple[bytes, bytes]:  # pragma: no cover - push mode only
        return await self.direct.read()

    async def write(self, data: bytes) -> None:
        await self.direct.write(data)

    async def close(self) -> None:
        try:
            await self.direct.close()
        finally:
            await self.lifeline.close()
