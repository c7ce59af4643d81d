"""The engine's threads: an executor whose threads never hold up the process's exit.

Written here rather than using ``concurrent.futures.ThreadPoolExecutor``, whose threads the
interpreter joins at exit (its ``atexit`` hook waits for every call under way): an engine
that stops answering a create or a start held a process that had already failed the call
at its deadline and printed its answer for up to the SDK's 60 s read timeout (found with a
proxy that holds the engine's answers: ``tests/faults/test_engine_hangs.py``). A call in
one of these threads is a request to the engine: abandoning it at exit loses nothing the
engine would not lose to a killed client.

Otherwise the same contract for ``run_in_executor``: at most ``max_workers`` threads, made
as calls need them and reused, a ``Future`` per call, ``shutdown`` ends the idle threads.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Item = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreads(concurrent.futures.Executor):
    """At most ``max_workers`` daemon threads named ``<prefix>_<n>``.

    A thread holds only a weak reference to its executor (as the standard pool's do): when
    an executor nobody shut down is collected (an engine dropped without ``aclose``), its
    idle threads end, and a thread still in a call ends when that call returns."""

    def __init__(self, max_workers: int, prefix: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max = max_workers
        self._prefix = prefix
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one count per thread waiting for work
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._names = itertools.count()
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` in a thread. Raises RuntimeError after shutdown."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max:
                # The thread gets the queue and a weak reference, never the executor itself:
                # its collection puts the end mark that every idle thread passes on and obeys.
                ref = weakref.ref(self, functools.partial(_end, self._queue))
                t = threading.Thread(
                    target=_work,
                    args=(ref, self._queue, self._idle),
                    name=f"{self._prefix}_{next(self._names)}",
                    daemon=True,
                )
                t.start()
                self._threads.append(t)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; the threads end once the queued calls are done (``cancel_futures``:
        queued calls not started are cancelled). ``wait``: until every thread ended,
        including one still waiting for the engine."""
        with self._lock:
            if self._shutdown:
                threads: list[threading.Thread] = []
            else:
                self._shutdown = True
                threads = list(self._threads)
                if cancel_futures:
                    while True:
                        try:
                            item = self._queue.get_nowait()
                        except queue.Empty:
                            break
                        if item is not None:
                            item[0].cancel()
                _end(self._queue)
        if wait:
            for t in threads:
                t.join()


def _end(work: queue.SimpleQueue[_Item | None], _ref: object = None) -> None:
    """The end mark: the thread that takes it puts it back for the next one and ends."""
    work.put(None)


def _work(ref: weakref.ref[DaemonThreads], work: queue.SimpleQueue[_Item | None], idle: threading.Semaphore) -> None:
    """One thread: run calls until the end mark (a shutdown, or the executor collected:
    ``ref``'s callback puts it, behind the calls already queued, which still run)."""
    # ``ref`` is never read: held, it keeps its callback alive (a collected weak reference
    # calls nothing), so the executor's collection reaches this thread.
    while True:
        item = work.get()
        if item is None:
            work.put(None)  # (the next thread ends too)
            return
        future, fn, args, kwargs = item
        del item
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # (the caller's to see, as the standard pool does)
                future.set_exception(e)
        del future, fn, args, kwargs  # (nothing of a finished call kept alive while idle)
        idle.release()
