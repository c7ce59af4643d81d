"""Switching a SQLite connection to WAL mode, shared by the changelog and the catalog."""

from __future__ import annotations

import sqlite3
import time


def enable_wal(db: sqlite3.Connection, wait: float = 60.0) -> None:
    """Switch ``db`` to WAL mode, waiting up to ``wait`` seconds for other connections.

    Two processes opening a new database at once: while one holds its first write
    transaction, SQLite refuses the other's switch at once with "database is locked",
    without its busy handler ever waiting (the switch needs an exclusive lock, and a
    lock upgrade that could deadlock fails immediately). So this retries.

    Raises sqlite3.OperationalError when still locked after ``wait``, or for any other error.
    """
    deadline = time.monotonic() + wait
    delay = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
