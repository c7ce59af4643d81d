"""The tidying thread: work that may wait until a request is answered (closing a
replaced file, a directory's fsync), done in order on one daemon thread. The agent
drains it before it exits, so the directories of its last writes are on disk."""

import queue
import threading

_tidy = queue.Queue()  # type: queue.Queue
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
    _tidy.put(fn)


def _tidy_loop():
    while True:
        fn = _tidy.get()
        try:
            fn()
        except Exception:
            pass
        finally:
            _tidy.task_done()


def drain(timeout):
    """Wait (at most ``timeout`` seconds) for what the tidying thread still has to do,
    so an agent that exits has fsync'd the directories of its last writes."""
    if not _tidy_thread:
        return
    done = threading.Event()
    _tidy.put(done.set)
    done.wait(timeout)
