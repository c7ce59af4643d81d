"""The tidying thread: work that may wait until a request is answered (closing a
replaced file, a directory's fsync), done in order on one daemon thread. The agent
drains it before it exits, so the directories of its last writes are on disk."""

import collections
import threading

# (a deque and a semaphore, not queue.Queue: the agent's start would import queue and
# heapq for it, ~1 ms of every sandbox's boot)
_tidy = collections.deque()  # type: collections.deque
_tidy_ready = threading.Semaphore(0)
_tidy_thread = []  # type: list
_tidy_lock = threading.Lock()


def later(fn):
    """Run ``fn`` on the tidying thread: after the current request is answered, in order."""
    if not _tidy_thread:
        with _tidy_lock:
            if not _tidy_thread:
                t = threading.Thread(target=_tidy_loop, daemon=True)
                t.start()
                _tidy_thread.append(t)
    _tidy.append(fn)
    _tidy_ready.release()


def _tidy_loop():
    while True:
        _tidy_ready.acquire()
        fn = _tidy.popleft()
        try:
            fn()
        except Exception:
            pass


def drain(timeout):
    """Wait (at most ``timeout`` seconds) for what the tidying thread still has to do,
    so an agent that exits has fsync'd the directories of its last writes."""
    if not _tidy_thread:
        return
    done = threading.Event()
    later(done.set)
    done.wait(timeout)
