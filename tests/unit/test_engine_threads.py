"""The engine's threads (sandbox.docker.threads): the executor contract ``run_in_executor``
relies on, the bound on threads, shutdown, and a call the engine never answers that does
not keep the process from exiting."""

from __future__ import annotations

import asyncio
import contextvars
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sandbox.docker.engine import Engine
from sandbox.docker.threads import DaemonThreads


def test_results_and_exceptions_reach_the_caller() -> None:
    pool = DaemonThreads(2, "t")
    assert pool.submit(lambda a, b=0: a + b, 1, b=2).result(5) == 3
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    pool.shutdown()


def test_no_more_threads_than_asked_and_idle_ones_are_reused() -> None:
    pool = DaemonThreads(3, "t")
    gate = threading.Event()
    running = []
    lock = threading.Lock()

    def held(i: int) -> str:
        with lock:
            running.append(i)
        gate.wait(10)
        return threading.current_thread().name

    futures = [pool.submit(held, i) for i in range(8)]
    deadline = time.monotonic() + 10
    while len(running) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(running) == 3  # the other five wait for a thread
    gate.set()
    names = {f.result(10) for f in futures}
    assert names <= {"t_0", "t_1", "t_2"}
    for _ in range(20):  # one at a time: the threads there are serve them
        pool.submit(lambda: None).result(5)
    assert len([t for t in threading.enumerate() if t.name.startswith("t_")]) <= 3
    pool.shutdown()


def test_shutdown_ends_the_threads_and_refuses_new_calls() -> None:
    pool = DaemonThreads(2, "s")
    pool.submit(time.sleep, 0.05).result(5)
    pool.shutdown(wait=True)
    assert not [t for t in threading.enumerate() if t.name.startswith("s_")]
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)


def test_shutdown_can_cancel_calls_not_started() -> None:
    pool = DaemonThreads(1, "c")
    gate = threading.Event()
    first = pool.submit(gate.wait, 10)
    queued = [pool.submit(lambda: None) for _ in range(3)]
    time.sleep(0.05)
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    gate.set()
    assert first.result(5) is True


async def test_the_engine_runs_its_calls_there_with_the_callers_context_variables() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("the caller's")
    engine = Engine(client_factory=object, threads=2)
    seen = await engine.call(
        "probe", lambda: (var.get(), threading.current_thread().name, threading.current_thread().daemon)
    )
    assert seen == ("the caller's", "docker-engine_0", True)
    await engine.aclose()


def test_a_call_that_never_returns_does_not_keep_the_process_from_exiting() -> None:
    # The standard pool's threads are joined at exit: this child would never end.
    child = textwrap.dedent(
        """
        import asyncio, threading
        from sandbox.docker.engine import Engine

        async def main():
            engine = Engine(client_factory=object, threads=2)
            never = threading.Event()
            try:
                await asyncio.wait_for(engine.call("start sandbox", never.wait), 0.2)
            except TimeoutError:
                print("gave up", flush=True)
            await engine.aclose()

        asyncio.run(main())
        print("done", flush=True)
        """
    )
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["gave", "up", "done"]


def _alive(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def _wait_gone(prefix: str) -> list[str]:
    deadline = time.monotonic() + 10
    while _alive(prefix) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _alive(prefix)


def test_the_threads_of_an_executor_nobody_shut_down_end_when_it_is_collected() -> None:
    import gc

    pool = DaemonThreads(3, "gc_")
    gate = threading.Event()
    busy = pool.submit(gate.wait, 10)
    assert [pool.submit(lambda: 1).result(5) for _ in range(3)] == [1, 1, 1]
    assert _alive("gc_")
    del pool  # an engine dropped without aclose
    gc.collect()
    time.sleep(0.1)
    assert len(_alive("gc_")) == 1  # the idle ones ended; the one in a call has not returned
    gate.set()
    assert busy.result(5) is True  # its call still reaches its caller
    assert _wait_gone("gc_") == []


def test_calls_queued_before_the_executor_was_collected_still_run() -> None:
    import gc

    pool = DaemonThreads(1, "q_")
    gate = threading.Event()
    first = pool.submit(gate.wait, 10)
    queued = [pool.submit(lambda i=i: i) for i in range(5)]
    del pool
    gc.collect()
    gate.set()
    assert first.result(5) is True
    assert [f.result(5) for f in queued] == [0, 1, 2, 3, 4]
    assert _wait_gone("q_") == []


def test_shutdown_twice_is_harmless() -> None:
    pool = DaemonThreads(2, "twice_")
    pool.submit(lambda: None).result(5)
    pool.shutdown(wait=True)
    pool.shutdown(wait=True)
    assert _alive("twice_") == []


async def test_an_engine_that_never_answers_its_version_holds_a_thread_never_the_event_loop(tmp_path: Path) -> None:
    # Making the SDK's client asks the engine its API version, with the SDK's 60 s timeout:
    # on the event loop, a hung engine would freeze every other call of the process.
    path = tmp_path / "engine.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(4)
    accepted: list[socket.socket] = []
    asked = threading.Event()

    def hold() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(conn)
            if conn.recv(4096).startswith(b"GET "):  # the version request, never answered
                asked.set()

    threading.Thread(target=hold, daemon=True).start()
    engine = Engine(base_url=f"unix://{path}")
    try:
        connecting = asyncio.ensure_future(engine.connect())
        assert await asyncio.to_thread(asked.wait, 30)
        assert not connecting.done()  # asked, unanswered, and the loop turned meanwhile
        connecting.cancel()  # the caller's deadline ends its wait
        with pytest.raises(asyncio.CancelledError):
            await connecting
    finally:
        srv.close()
        for conn in accepted:
            conn.close()  # (the thread's request then fails and the thread is free)
        await engine.aclose()


async def test_the_client_is_made_once_whoever_asks_first() -> None:
    made: list[object] = []

    def factory() -> object:
        time.sleep(0.05)
        made.append(object())
        return made[-1]

    engine = Engine(client_factory=factory, threads=4)
    clients = await asyncio.gather(*(engine.connect() for _ in range(6)), engine.call("c", engine.client))
    assert len(made) == 1 and all(c is made[0] for c in clients)
    await engine.aclose()
