"""Whether the tool call running in this task is waiting for a workspace's lock.

Why: a workspace takes one change at a time (its mutation lock in-process, the
changelog's ``flock`` across processes), and the registry's deadline for a call covers
its wait for another call's change (two calls on one workspace through the Python API,
an undo or snapshot from another process). When the deadline passes during that wait,
the answer is the wait, not "the sandbox did not answer": the engine was never asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator


class Waiting:
    """One call's waits: ``cut`` once one was cancelled (by the call's deadline, or its
    caller) before it had the lock."""

    __slots__ = ("cut", "task")

    def __init__(self) -> None:
        self.cut = False
        self.task = asyncio.current_task()


_CURRENT: contextvars.ContextVar[Waiting | None] = contextvars.ContextVar("loom_lock_waiting", default=None)


@contextlib.contextmanager
def watched() -> Iterator[Waiting]:
    """Watch the waits of the call run in this block (the registry's)."""
    w = Waiting()
    token = _CURRENT.set(w)
    try:
        yield w
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Mark the block as a wait for a workspace's lock. Only the watched call's own task
    counts: a task it started (a guard's watcher) inherits the context, not the call."""
    w = _CURRENT.get()
    if w is None or w.task is not asyncio.current_task():
        yield
        return
    try:
        yield
    except asyncio.CancelledError:
        w.cut = True
        raise
