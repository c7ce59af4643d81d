"""At a worker's start: record what a crashed worker's commands changed.

A worker (``serve``, the CLI's local worker) that starts looks for changelogs under its
data directory with an intent a dead process left open (:mod:`worker.changelog.intents`)
and reconciles each through its workspace's sandbox, as the next call on that workspace
would: the interrupted command's changes are recorded as its own, marked interrupted,
and a staged temporary is removed. A workspace whose directory is gone is skipped, and
a failure is logged, never raised: reconciliation happens again at the next call.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from sandbox.logs import get_logger

from ..changelog.api import Changelog
from ..changelog.intents import IntentJournal
from .core import ToolRegistry

log = get_logger("worker.registry")


def interrupted_workspaces(data_dir: Path) -> list[Path]:
    """The workspaces whose changelog under ``data_dir`` holds work a dead process left
    open. Blocking (a few small reads per changelog)."""
    out: list[Path] = []
    for root in sorted((Path(data_dir) / "workspaces").glob("*/")):
        if not (root / "intents").is_file():
            continue
        journal = IntentJournal(root / "intents")
        try:
            if not journal.orphans():
                continue
        except Exception:  # unreadable: the next use says so
            continue
        finally:
            journal.close()
        with contextlib.suppress(sqlite3.Error):
            db = sqlite3.connect(f"file:{root / 'changelog.sqlite3'}?mode=ro", uri=True)
            try:
                row = db.execute("SELECT value FROM meta WHERE key = 'workspace'").fetchone()
            finally:
                db.close()
            if row is not None and Path(row[0]).is_dir():
                out.append(Path(row[0]))
    return out


async def reconcile_interrupted(registry: ToolRegistry, data_dir: Path) -> list[Path]:
    """Reconcile every workspace :func:`interrupted_workspaces` finds; returns those done.
    Never raises (a failure is logged; the next call on that workspace tries again)."""
    import asyncio

    done: list[Path] = []
    try:
        found = await asyncio.to_thread(interrupted_workspaces, data_dir)
    except OSError as e:
        log.warning("changelog.reconcile_failed", error=str(e)[:300])
        return done
    for path in found:
        try:
            ws = await registry.pool.workspace(str(path))
            if isinstance(ws.recorder, Changelog):
                await ws.recorder.recover(ws.sandbox)
                done.append(path)
                log.info("changelog.reconciled_at_start", workspace=str(path))
        except Exception as e:  # logged: the next call on it reconciles
            log.warning("changelog.reconcile_failed", workspace=str(path), error=f"{type(e).__name__}: {e}"[:300])
    return done
