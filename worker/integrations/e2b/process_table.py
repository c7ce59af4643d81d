"""The processes started through E2B's API, per sandbox: E2B's pid of each, what it was
started with, who is reading its output, how it ended.

E2B names a process by a uint32 pid (and optionally a tag). loom's own processes are
named by ids (``proc-...``, ``term-...``); the table maps one to the other, using the
process's real pid inside the sandbox when loom knows it (a background process, a PTY)
and a number above any Linux pid otherwise (a command of another user).

Each process has one task, its **pump** (:meth:`Proc.pump`), that reads its output from
loom for as long as it runs and hands each piece to the streams subscribed at that moment
(the ``Start`` stream from the first byte, a ``Connect`` from when it connected: envd's
semantics); at the end it records the process's changes in the changelog, then tells
the streams how it ended. An ended process is kept :data:`RETAIN` seconds, so that a
late ``Connect`` still learns its exit (envd keeps it 30 s too); ``List`` shows only
running ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import structlog
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_pb as pb

from sandbox.errors import SandboxError

from . import process_events as ev
from .process_events import Ended
from .process_runners import Runner

log = structlog.get_logger(__name__)

#: Seconds an ended process stays known (``Connect`` gets its start and end).
RETAIN = 30.0
#: Events waiting for a slow reader before the process's output waits for it (envd's
#: buffer is 64 too).
QUEUE = 64
#: Pids made up for processes loom has none for: above Linux's largest (4194304).
SYNTHETIC_PIDS = 1 << 24


class _End:
    """The last item of a subscription: the process ended (:attr:`Proc.ended`)."""


END = _End()
Item = pb.ProcessEvent | _End | ConnectError


@dataclass(eq=False)
class Proc:
    """One process of a sandbox, started through E2B's API."""

    pid: int
    config: pb.ProcessConfig
    tag: str | None
    pty: bool
    runner: Runner
    #: Whether loom's time limit is the one the client asked for (``Connect-Timeout-Ms``
    #: of ``Start``): then its end is the ``Start`` stream's deadline.
    asked_limit: bool = False
    ended: Ended | None = None
    failure: ConnectError | None = None
    subscribers: set[asyncio.Queue[Item]] = field(default_factory=set)
    task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.ended is None and self.failure is None and not self.runner.gone

    def info(self) -> pb.ProcessInfo:
        if self.tag is None:
            return pb.ProcessInfo(config=self.config, pid=self.pid)
        return pb.ProcessInfo(config=self.config, pid=self.pid, tag=self.tag)

    def subscribe(self) -> asyncio.Queue[Item]:
        """A queue of this process's events from now on (its end if it has ended)."""
        q: asyncio.Queue[Item] = asyncio.Queue(QUEUE)
        if self.failure is not None:
            q.put_nowait(self.failure)
        elif self.ended is not None:
            q.put_nowait(END)
        else:
            self.subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[Item]) -> None:
        """``q``'s stream ended: it gets nothing more. (Emptied: a pump waiting to put
        into it goes on.)"""
        self.subscribers.discard(q)
        while not q.empty():
            q.get_nowait()

    async def _publish(self, item: Item) -> None:
        # A slow reader holds the output back rather than lose it (envd does the same).
        for q in list(self.subscribers):
            await q.put(item)

    async def _output(self, stream: str, data: bytes) -> None:
        if self.subscribers:
            await self._publish(ev.data_event(stream, data))

    async def pump(self, sandbox_id: str, on_done: Callable[[], None] | None = None) -> None:
        """Read the process's output until it ends (see the module docstring)."""
        try:
            ended = await self.runner.run(self._output)
        except asyncio.CancelledError:
            self.failure = ev.unavailable(sandbox_id, "the service is shutting down")
            for q in self._last_subscribers():
                with contextlib.suppress(asyncio.QueueFull):
                    q.put_nowait(self.failure)
            raise
        except (SandboxError, OSError) as e:
            # The sandbox went (killed, or lost): what the streams end with.
            log.info("e2b.process.lost", sandbox=sandbox_id, pid=self.pid, error=str(e)[:300])
            self.failure = ev.unavailable(sandbox_id, f"the sandbox was lost while the process ran: {e}")
        except ConnectError as e:
            self.failure = e
        else:
            self.ended = ended
        last: Item = self.failure if self.failure is not None else END
        for q in self._last_subscribers():
            await q.put(last)  # (after what a slow reader has not read yet, as the output waits)
        if on_done is not None:
            on_done()
        await self.runner.release()

    def _last_subscribers(self) -> list[asyncio.Queue[Item]]:
        """(Once the process has ended or failed) the subscriptions to tell; a later one
        gets the end from :meth:`subscribe`."""
        subscribers, self.subscribers = list(self.subscribers), set()
        return subscribers


async def events(
    proc: Proc,
    q: asyncio.Queue[Item],
    *,
    deadline: float | None,
    keepalive: float,
    timeout_is_deadline: bool,
) -> AsyncIterator[pb.ProcessEvent]:
    """The events of one stream of ``proc`` from its subscription ``q``, ending with its
    end event; ``keepalive``: seconds without an event before a KeepAlive is sent;
    ``deadline``: the stream's (loop time). ``timeout_is_deadline``: loom's time limit is
    this stream's deadline (the ``Start`` stream): its end is then the deadline's error,
    as envd's is. Raises ConnectError (``deadline_exceeded``, ``unavailable``)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            wait = keepalive
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    if timeout_is_deadline:
                        await _kill(proc)
                    raise _deadline(proc, timeout_is_deadline)
            try:
                async with asyncio.timeout(wait):
                    item = await q.get()
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline:
                    if timeout_is_deadline:
                        await _kill(proc)
                    raise _deadline(proc, timeout_is_deadline) from None
                yield ev.keepalive_event()
                continue
            if isinstance(item, ConnectError):
                raise item
            if isinstance(item, _End):
                if proc.ended is None:  # (cannot happen: END follows the end)
                    raise ConnectError(Code.UNKNOWN, "the process ended without an end event")
                if timeout_is_deadline and proc.ended.timed_out and proc.asked_limit:
                    raise _deadline(proc, True)
                yield ev.end_event(proc.ended)
                return
            yield item
    finally:
        proc.unsubscribe(q)


async def _kill(proc: Proc) -> None:
    """End ``proc`` at its ``Start`` stream's deadline (loom's own time limit, the same,
    would end it within a tick: this makes it now)."""
    if proc.running:
        with contextlib.suppress(ConnectError, SandboxError):
            await proc.runner.signal(signal.SIGKILL)


def _deadline(proc: Proc, kills: bool) -> ConnectError:
    if kills:
        return ConnectError(
            Code.DEADLINE_EXCEEDED,
            f"the command ran past its timeout of {proc.runner.limit:g} s and was killed "
            "(pass a longer `timeout` to run it longer, 0 for none)",
        )
    return ConnectError(Code.DEADLINE_EXCEEDED, "the stream reached its timeout (the process goes on)")


class SandboxProcs:
    """The E2B processes of one sandbox."""

    def __init__(self, sandbox_id: str, on_empty: Callable[[str], object] | None = None) -> None:
        """``on_empty(sandbox_id)``: called when its last process is forgotten."""
        self.sandbox_id = sandbox_id
        self.by_pid: dict[int, Proc] = {}
        self._synthetic = itertools.count(SYNTHETIC_PIDS)
        self._on_empty = on_empty

    def new_pid(self, real: int | None) -> int:
        """E2B's pid for a new process: its real one when loom has it and no running
        process holds it, else one made up."""
        if real is not None and 0 < real < 1 << 32:
            held = self.by_pid.get(real)
            if held is None or not held.running:
                return real
        while True:
            pid = next(self._synthetic)
            if pid not in self.by_pid:
                return pid

    def add(self, proc: Proc) -> None:
        """Give ``proc`` its E2B pid, keep it (replacing an ended one of the same pid) and
        start its pump."""
        proc.pid = self.new_pid(proc.runner.pid)
        self.by_pid[proc.pid] = proc
        loop = asyncio.get_running_loop()

        def forget() -> None:
            loop.call_later(RETAIN, self._forget, proc)

        proc.task = loop.create_task(proc.pump(self.sandbox_id, forget), name=f"e2b pump {proc.pid}")

    def _forget(self, proc: Proc) -> None:
        if self.by_pid.get(proc.pid) is proc:
            del self.by_pid[proc.pid]
        if not self.by_pid and self._on_empty is not None:
            self._on_empty(self.sandbox_id)

    def find(self, selector: pb.ProcessSelector | None, *, running: bool = True) -> Proc:
        """The process ``selector`` names (``pid`` or ``tag``); ended ones too unless
        ``running``. Raises ConnectError (``not_found``, ``unimplemented``)."""
        sel = selector.selector if selector is not None else None
        if sel is None:
            raise ConnectError(Code.UNIMPLEMENTED, "invalid selector: name the process by pid or tag")
        if sel.field == "pid":
            proc = self.by_pid.get(int(sel.value))
            if proc is not None and (proc.running or not running):
                return proc
        else:
            found = [p for p in self.by_pid.values() if p.tag == sel.value and (p.running or not running)]
            if found:
                return max(found, key=lambda p: p.running)  # a running one first
        raise ev.not_found(selector)

    def running(self) -> list[Proc]:
        return [p for p in self.by_pid.values() if p.running]
