"""One execution of code in a context: recorded, bounded in time, streamed.

It runs under :meth:`Workspace.run_recorded <worker.workspace.Workspace.run_recorded>`:
the workspace's mutation lock is held, what background processes changed before is
theirs, and what changed while the code ran is recorded in the changelog as the
execution's ``call_id`` (undoable like a command's).

Time has two layers, as for commands. In the sandbox, the bridge interrupts the kernel at
``timeout`` (SIGINT, as Ctrl-C: the code gets ``KeyboardInterrupt``, the state is kept)
and, if it has not finished :data:`INTERRUPT_GRACE` seconds later, restarts it (the state
is lost). On the host, if no answer came :data:`ANSWER_SLACK` seconds after that, the
bridge itself is stopped (the context starts again at its next call).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from sandbox.capabilities import CodeKernels, code_kernels
from sandbox.client import AgentSandbox
from sandbox.errors import AgentError, TunnelClosedError
from sandbox.kernels import KernelInfo

from . import wire
from .contexts import CodeArgumentError
from .model import CodeEvent, Execution, Outcome

if TYPE_CHECKING:
    from ..workspace import Workspace

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 86_400.0
#: Seconds between the interrupt and the restart of a kernel that does not stop.
INTERRUPT_GRACE = 3.0
#: Seconds the host waits beyond timeout and grace for the bridge's answer (a restart).
ANSWER_SLACK = 90.0
#: The longest code one execution takes (characters).
MAX_CODE = 1 << 20
#: How the changelog names an execution's command: its code's first line, this long.
SHOWN = 200


def check(code: str, timeout: float) -> float:
    """Raises CodeArgumentError."""
    if not isinstance(code, str):
        raise CodeArgumentError("code", "must be a string")
    if len(code) > MAX_CODE:
        raise CodeArgumentError("code", f"{len(code)} characters is more than {MAX_CODE}: write it to a file first")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT:
        raise CodeArgumentError("timeout", f"must be more than 0 and at most {MAX_TIMEOUT:g} seconds")
    return float(timeout)


def shown(code: str) -> str:
    lines = code.strip().splitlines() or [""]
    first = lines[0][:SHOWN]
    more = " ..." if len(lines) > 1 or len(lines[0]) > SHOWN else ""
    return f"run_code: {first}{more}"


async def execute(
    ws: Workspace,
    info: KernelInfo,
    code: str,
    *,
    timeout: float,
    call_id: str,
    tool: str,
    notes: list[str],
    emit: Callable[[CodeEvent], Awaitable[None]],
) -> Execution:
    """Run ``code`` in the context ``info`` (running), ``emit`` each output and display as
    it comes; the Execution (also emitted, last). Raises ProtocolError (a bridge that
    sent garbage), the recorder's and the infrastructure errors."""
    box = code_kernels(ws.sandbox)
    ex = Execution(context_id=info.id, call_id=call_id)
    reader = wire.Reader()
    oom_counter = ws.sandbox.oom_counter if isinstance(ws.sandbox, AgentSandbox) else None
    ooms = oom_counter() if oom_counter is not None else None
    started = time.perf_counter()

    async def run() -> wire.End:
        for attempt in (0, 1):
            session = await box.kernel_session(info.id)
            received = False
            async with session.lock:
                try:
                    async with asyncio.timeout(timeout + INTERRUPT_GRACE + ANSWER_SLACK):
                        async for ev in session.execute(code, timeout=timeout, grace=INTERRUPT_GRACE):
                            received = True
                            kind = ev["type"]
                            if kind == "stdout" or kind == "stderr":
                                out = reader.output(ev)
                                if out is not None:
                                    (ex.logs.stdout if kind == "stdout" else ex.logs.stderr).append(out.text)
                                    await emit(out)
                            elif kind == "result":
                                r = reader.result(ev)
                                if r is not None:
                                    ex.results.append(r)
                                    await emit(r)
                            elif kind == "end":
                                return wire.end(ev)
                except TimeoutError:
                    await session.close()
                    await box.stop_kernel(info.id)
                    return _ended("restarted", "host_deadline")
                except TunnelClosedError:
                    # The sandbox itself may have gone (under gVisor an allocation past the
                    # memory limit can take the whole sandbox): asked before anything
                    # reconnects to a new one.
                    lost = await ws.sandbox.lost_reason() if isinstance(ws.sandbox, AgentSandbox) else None
                    if lost is not None:
                        return _ended("kernel_died", "sandbox_" + lost)
                    if attempt == 0 and not received and await _runs(box, info.id):
                        continue  # a kept connection that had ended; the bridge is there
                    return _ended("kernel_died", "bridge_gone")
        raise AssertionError("unreachable")

    end, changed = await ws.run_recorded(shown(code), run, tool=tool, call_id=call_id)
    oom = end.oom
    if not oom and end.status == "kernel_died" and oom_counter is not None and ooms is not None:
        after = oom_counter()
        oom = after is not None and after > ooms
    oom = oom or end.why == "sandbox_oom"
    ex.outcome = end.status
    ex.error = end.error
    ex.execution_count = end.execution_count
    ex.files_changed = changed
    ex.message = message(end, timeout, notes, oom)
    ex.duration_ms = (time.perf_counter() - started) * 1000.0
    await emit(ex)
    return ex


async def _runs(box: CodeKernels, context_id: str) -> bool:
    try:
        return (await box.kernel_info(context_id)).running
    except AgentError:
        return False


def _ended(status: Outcome, why: str) -> wire.End:
    return wire.End(status, None, None, [], why, None, None, False, "")


def message(end: wire.End, timeout: float, notes: list[str], oom: bool) -> str:
    """What happened, said for a model ("" when the code simply ran)."""
    said: list[str] = []
    if "bridge_replaced" in notes or "kernel_replaced" in end.notes:
        said.append(
            "the context's kernel had ended since its last execution: a new one ran this code, the earlier "
            "state (variables, imports) is lost"
        )
    status = end.status
    if status == "error" and end.error is not None:
        said.append(f"the code raised {end.error.name}: {end.error.value}".rstrip(": "))
    elif status == "interrupted":
        if end.why == "timeout":
            said.append(f"timed out after {timeout:g} s: interrupted; the context's state is kept")
        else:
            said.append("interrupted: the context's state is kept")
    elif status == "restarted":
        if end.why == "host_deadline":
            said.append(
                f"timed out after {timeout:g} s and the kernel did not answer: it was stopped, its state "
                "(variables, imports) is lost; a new kernel starts at the next execution"
            )
        else:
            said.append(
                f"timed out after {timeout:g} s and did not stop when interrupted: the kernel was restarted, its "
                "state (variables, imports) is lost"
            )
    elif status == "kernel_died":
        if "start_failed" in end.notes:
            said.append("the context's kernel would not start again: " + end.detail)
        else:
            said.append(
                f"the kernel died while running the code ({_how(end, oom)}): its state (variables, imports) is "
                "lost; a new kernel starts at the next execution"
            )
    return "; ".join(said)


def _how(end: wire.End, oom: bool) -> str:
    if oom and end.why == "sandbox_oom":
        return "the sandbox's memory limit was reached: the engine ended the sandbox, which is started again"
    if oom:
        return "killed for memory: the sandbox's memory limit was reached"
    if end.why is not None and end.why.startswith("sandbox_"):
        return "the sandbox itself was lost and is started again: every context's state is lost"
    if end.why == "bridge_gone":
        return "its bridge ended with it"
    if end.signal is not None:
        name = {9: "SIGKILL", 6: "SIGABRT", 11: "SIGSEGV", 15: "SIGTERM"}.get(end.signal, f"signal {end.signal}")
        extra = ": most likely out of memory" if end.signal == 9 else ""
        return f"killed by {name}{extra}"
    if end.exit_code is not None:
        return f"it exited with status {end.exit_code}"
    return "it ended"


async def interrupt(ws: Workspace, context_id: str) -> bool:
    """Interrupt the execution running in context ``context_id`` as Ctrl-C does: the code
    gets KeyboardInterrupt, the context's state is kept, and the execution ends
    ``interrupted`` (``restarted`` when it does not stop within :data:`INTERRUPT_GRACE`),
    what it changed recorded as for any execution. False when none runs there (or the
    context has ended). Raises the infrastructure errors of reaching the sandbox."""
    box = code_kernels(ws.sandbox)
    try:
        session = await box.kernel_session(context_id)
        return await session.interrupt()
    except (AgentError, TunnelClosedError):
        return False


#: Executions whose consumer left before their end: they run on to it (recorded).
_RUNNING: set[asyncio.Task[Execution]] = set()


async def run(
    ws: Workspace,
    code: str,
    *,
    context: str | None,
    language: str | None,
    timeout: float,
    call_id: str,
    tool: str,
    emit: Callable[[CodeEvent], Awaitable[None]] | None = None,
) -> Execution:
    """Run ``code`` in ``context`` (else ``language``'s default context): its Execution;
    ``emit`` gets each output and display as it comes, and the Execution. Raises
    CodeArgumentError, AgentError (``not_found``: no such context),
    KernelUnavailableError, the infrastructure errors."""
    from .contexts import resolve

    timeout = check(code, timeout)
    info, notes = await resolve(ws, context, language)
    return await execute(ws, info, code, timeout=timeout, call_id=call_id, tool=tool, notes=notes, emit=emit or _ignore)


async def _ignore(_ev: CodeEvent) -> None:
    pass


async def stream(
    ws: Workspace,
    code: str,
    *,
    context: str | None,
    language: str | None,
    timeout: float,
    call_id: str,
    tool: str,
    on_end: Callable[[Execution], None] | None = None,
    hold: contextlib.AsyncExitStack | None = None,
) -> AsyncIterator[CodeEvent]:
    """:func:`run`'s outputs and displays as they come, the :class:`Execution` last. A
    consumer that stops early leaves the execution running to its end or timeout (what it
    changes is recorded, as for a command whose client left). ``on_end`` is called with
    the Execution when it ends, whether a consumer is still there or not (the call
    journal's line). What ``hold`` holds (a service slot) is taken over once the
    execution starts and released when it ends, not when the consumer leaves; a stream
    closed before it started leaves ``hold`` to its owner. Raises as :func:`run`."""
    queue: asyncio.Queue[CodeEvent | BaseException] = asyncio.Queue()
    gone = False

    async def emit(ev: CodeEvent) -> None:
        if not gone:
            queue.put_nowait(ev)

    # (pop_all: the stack's callbacks move to the execution's task; the caller's own
    # aclose then releases nothing twice)
    owned = hold.pop_all() if hold is not None else None

    async def go() -> Execution:
        try:
            ex = await run(
                ws, code, context=context, language=language, timeout=timeout, call_id=call_id, tool=tool, emit=emit
            )
            if on_end is not None:
                on_end(ex)
            return ex
        except BaseException as e:
            queue.put_nowait(e)
            raise
        finally:
            if owned is not None:
                await owned.aclose()

    task = asyncio.get_running_loop().create_task(go(), name=f"run_code {call_id}")
    _RUNNING.add(task)
    task.add_done_callback(_done)
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, Execution):
                return
    finally:
        gone = True


def _done(task: asyncio.Task[Execution]) -> None:
    _RUNNING.discard(task)
    if not task.cancelled():
        task.exception()  # (retrieved: raised to the consumer, if it was still there)
