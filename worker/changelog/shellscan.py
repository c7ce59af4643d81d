"""Shell-command coverage: a content baseline of the workspace plus a cheap change scan.

The baseline (table ``baseline``: one row per file with its stat, sha256 and whether its
content is kept in the blob store) is built on the first ``before_shell`` by reading every
file *through the sandbox*. After a command, the agent's snapshot scan returns only what
changed by stat (type, size, mtime, inode, mode) since the previous scan; only those files
are read and hashed. When the agent restarted (``full=True``) the whole listing is diffed
against the stored stats instead, so nothing is missed across restarts.

Limits (:class:`~worker.changelog.model.Limits`), all reported, never silent:

* a file over ``max_file_bytes``, or beyond ``max_total_bytes`` of kept content, is tracked
  by stat and hash only: its changes are entries with ``restorable=False``;
* files under an ignored directory (``node_modules``, ``.venv``, caches; in ``.git`` only
  ``objects/`` and ``lfs/``) are tracked by stat only. What a command creates needs no
  before-image: a directory made whole is one *tree* entry, creations under an existing
  ignored directory one *group* entry per directory and command (paths in ``members``);
  changes to files that were there before are one not-restorable group entry;
* directories are baseline rows too (existence and mode: their mtime changes with every
  entry made in them), so a command's ``mkdir``/``rm -r``/``chmod`` are entries that undo
  reverses; they are not listed in the returned changed paths (``files_changed``);
* symlinks are recorded by target (the target is the row's content, hashed and kept), so
  a link made, removed or retargeted is undone;
* a workspace over ``max_files`` files is reported with a ``truncated`` entry.

Racy files (modified within :data:`RACY_NS` of a scan, where a same-size rewrite could keep
the same mtime tick) are re-hashed on the next scan, as git does for its index.

Cheap scans: on a Linux kernel (runc) the agent watches every scanned directory with
inotify, so the scan after a command re-reads only the directories that had events
(``ScanResult.from_events``); such a result also lists files written to with an unchanged
stat, so no racy re-hashing is needed. The agent falls back to a full stat walk on any
doubt (queue overflow, watch budget, a restart, gVisor, and at least every
``FULL_SCAN_EVERY`` seconds: writes through a shared mmap raise no event).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from sandbox.base import Sandbox, ScanEntry, ScanRequest, ScanResult
from sandbox.errors import AgentError, ConflictError, PathNotFoundError

from ..recorders import ScanToken
from .recorder import ChangelogCore
from .shellrows import (
    Covering,
    Group,
    Row,
    change_entry,
    dir_order,
    ignored_root,
    is_move,
    mode_changed,
    symlink_digest,
    tree_roots,
    why_not,
)
from .store import BASELINE_COLUMNS, RACY_OWN_WRITE, Store

RACY_NS = 1_000_000_000
#: The baseline's format: "2" lists directories too. A baseline of version "1" (files
#: only) is upgraded by the next scan, which adds its directories without recording
#: them as created.
BASELINE_VERSION = "2"
_READ_CONCURRENCY = 16


@dataclass
class ShellToken(ScanToken):
    """What ``before_shell`` hands to ``after_shell``."""

    started: float
    baseline_ready: bool
    #: The scan to send along with the command (``ExecRequest.scan``), if any.
    scan: ScanRequest | None = None
    #: The command's intent (see :mod:`worker.changelog.intents`), closed by after_shell.
    intent: str | None = None


@dataclass
class _Batch:
    rows: list[Row] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    blobs: list[tuple[str, bytes]] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)


class ShellTracker:
    """Baseline + change scan for one workspace; methods expect the caller to hold the lock."""

    def __init__(self, core: ChangelogCore) -> None:
        self.core = core
        self.limits = core.limits
        self._generation: str | None = None
        self._ready = False  # the baseline exists (once built it is never dropped)
        self._watched = False  # the agent's snapshot at ``_generation`` is watched
        self._dirs_known: bool | None = None  # the baseline lists directories (version 2)

    # -- store helpers (run on the db thread) -----------------------------------------

    def _rows(self, paths: list[str]) -> dict[str, Row]:
        out: dict[str, Row] = {}
        for i in range(0, len(paths), 500):
            chunk = paths[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for r in self.core.store.query(f"SELECT {BASELINE_COLUMNS} FROM baseline WHERE path IN ({marks})", chunk):
                out[r[0]] = Row(*r)
        return out

    def _all_rows(self) -> dict[str, Row]:
        return {r[0]: Row(*r) for r in self.core.store.query(f"SELECT {BASELINE_COLUMNS} FROM baseline")}

    def _racy(self) -> list[str]:
        return [r[0] for r in self.core.store.query("SELECT path FROM baseline WHERE racy != 0")]

    def _kept_bytes(self) -> int:
        return int(self.core.store.query("SELECT COALESCE(SUM(size), 0) FROM baseline WHERE status = 'ok'")[0][0])

    def _rows_and_kept(self, paths: list[str] | None) -> tuple[dict[str, Row], int]:
        # One trip to the database thread for what a scan's diff needs (``paths`` None:
        # the rows are known already).
        return ({} if paths is None else self._rows(paths)), self._kept_bytes()

    def _commit(self, batch: _Batch, *, rebuild: bool = False) -> None:
        # A batch that only refreshes stats of rows whose content is known (a file this
        # changelog wrote, seen by the scan after it) records nothing recovery needs: not
        # fsync'd. Lost, the next scan finds the same files and refreshes them again.
        refresh_only = not (rebuild or batch.entries or batch.blobs or batch.deleted)
        with self.core.store.tx(durable=not refresh_only) as db:
            if rebuild:
                db.execute("DELETE FROM baseline")
            for digest, data in batch.blobs:
                Store.put_blob(db, digest, data)
            for e in batch.entries:
                members = e.pop("_members", None)
                entry_id = Store.insert_entry(db, **e)
                if members:
                    Store.put_members(db, entry_id, members)
            db.executemany("DELETE FROM baseline WHERE path = ?", [(p,) for p in batch.deleted])
            db.executemany(
                f"INSERT OR REPLACE INTO baseline({BASELINE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [r.values() for r in batch.rows],
            )
            Store.set_meta(db, "baseline", BASELINE_VERSION)

    # -- reading ------------------------------------------------------------------------

    async def _describe(
        self, sandbox: Sandbox, e: ScanEntry, budget: list[int], now_ns: int
    ) -> tuple[Row, bytes | None]:
        """A baseline row for scan entry ``e`` and the content to keep (None if not kept)."""
        racy = int(e.mtime_ns >= now_ns - RACY_NS)
        row = Row(e.path, e.type, e.size, e.mtime_ns, e.ino, e.mode, None, None, "other", racy)
        if ignored_root(e.path, self.limits.ignored_dirs) is not None:
            row.status = "ignored"
            return row, None
        if e.type == "dir":
            row.status, row.racy = "dir", 0
            return row, None
        if e.type == "symlink":
            try:
                row.target = (await sandbox.stat(e.path)).target
            except PathNotFoundError:
                pass
            except ConflictError:
                pass  # swapped to and fro while read: kept without content; the next scan sees it
            row.status = "symlink"
            if row.target is None:
                return row, None
            row.sha256 = symlink_digest(row.target)
            return row, row.target.encode("utf-8", "surrogateescape")
        if e.type != "file":
            return row, None
        if e.size > self.limits.max_file_bytes or budget[0] < e.size:
            row.status = "too_large" if e.size > self.limits.max_file_bytes else "over_cap"
            row.sha256 = (await sandbox.hash([e.path])).get(e.path)
            return row, None
        budget[0] -= e.size  # reserved before awaiting: reads run concurrently
        try:
            r = await sandbox.read(e.path, max_bytes=self.limits.max_file_bytes)
        except PathNotFoundError:
            budget[0] += e.size
            raise
        except AgentError:
            budget[0] += e.size
            row.status = "unreadable"
            return row, None
        budget[0] += e.size - len(r.data)
        if r.sha256 is None:  # grew past the cap since the scan
            row.status = "too_large"
            return row, None
        row.sha256, row.status = r.sha256, "ok"
        return row, r.data

    async def _describe_all(
        self, sandbox: Sandbox, entries: list[ScanEntry], budget: list[int]
    ) -> list[tuple[ScanEntry, Row | None, bytes | None]]:
        sem = asyncio.Semaphore(_READ_CONCURRENCY)
        now_ns = time.time_ns()

        async def one(e: ScanEntry) -> tuple[ScanEntry, Row | None, bytes | None]:
            async with sem:
                try:
                    row, data = await self._describe(sandbox, e, budget, now_ns)
                except PathNotFoundError:
                    return e, None, None  # vanished since the scan: the next scan reports it
                return e, row, data

        # Rows that need no read (stat-only paths, directories) are made here: a task each
        # cost ~15 µs, a third of the scan after an install of 20,000 files.
        out: list[tuple[ScanEntry, Row | None, bytes | None]] = []
        slow: list[ScanEntry] = []
        for e in entries:
            if e.type == "dir" or ignored_root(e.path, self.limits.ignored_dirs) is not None:
                row, _ = await self._describe(sandbox, e, budget, now_ns)  # returns at once
                out.append((e, row, None))
            else:
                slow.append(e)
        if slow:
            out += await asyncio.gather(*(one(e) for e in slow))
        return out

    # -- baseline ----------------------------------------------------------------------

    async def build(self, sandbox: Sandbox) -> None:
        """Build the baseline from scratch (first use). Raises sandbox/storage errors."""
        res = await sandbox.scan(".", max_files=self.limits.max_files, snapshot=self.core.snapshot_key)
        budget = [self.limits.max_total_bytes]
        batch = _Batch()
        for _e, row, data in await self._describe_all(sandbox, res.entries, budget):
            if row is None:
                continue
            batch.rows.append(row)
            if data is not None and row.sha256:
                batch.blobs.append((row.sha256, data))
        await self.core.db(self._commit, batch, rebuild=True)
        self._generation, self._watched = res.generation, res.watched
        self._dirs_known = True

    async def ready(self) -> bool:
        if not self._ready:
            self._ready = await self.core.db(self.core.store.meta, "baseline") in ("1", BASELINE_VERSION)
        return self._ready

    # -- change scan ---------------------------------------------------------------------

    def scan_request(self) -> ScanRequest | None:
        """The scan to send along with the next command, or None when the agent's snapshot
        is not watched (then a separate scan is cheaper than a refused command)."""
        if self._generation is None or not self._watched:
            return None
        return ScanRequest(self.core.snapshot_key, self._generation, max_files=self.limits.max_files)

    async def sync(
        self, sandbox: Sandbox, record: dict[str, Any] | None, result: ScanResult | None = None
    ) -> list[str]:
        """Bring the baseline up to date; with ``record`` also write entries for the changes.
        ``result`` is a scan the agent already ran (with an ``exec``) from our generation.

        Returns the changed workspace-relative paths. Raises sandbox/storage errors (the
        next scan is then a full one, so nothing is lost).
        """
        since, self._generation = self._generation, None
        if result is not None:
            res = result
        else:
            res = await sandbox.scan(".", max_files=self.limits.max_files, snapshot=self.core.snapshot_key, since=since)
        self._watched = res.watched
        if res.full:
            base = await self.core.db(self._all_rows)
            seen = {e.path for e in res.entries}
            changed = [e for e in res.entries if (b := base.get(e.path)) is None or not b.same_stat(e)]
            removed = [] if res.truncated else [p for p in base if p not in seen]
        else:
            changed, removed, base = res.entries, res.removed, None
        # After an event-driven scan every write since the previous scan is reported, even
        # one that kept the stat: only a stat walk needs the racy files re-hashed.
        racy = [] if res.from_events else await self.core.db(self._racy)
        if not changed and not removed and not racy and not res.truncated:
            self._generation = res.generation
            return []
        paths = sorted({e.path for e in changed} | set(removed) | set(racy))
        rows, kept = await self.core.db(self._rows_and_kept, None if base is not None else paths)
        if base is not None:
            rows = base
        if self._dirs_known is None:
            self._dirs_known = await self.core.db(self.core.store.meta, "baseline") == BASELINE_VERSION
        batch = await self._diff(sandbox, changed, removed, racy, rows, record, kept)
        if record is not None and res.truncated:
            batch.entries.append(
                change_entry(
                    record,
                    "modify",
                    ".",
                    note=(
                        f"workspace has more than {self.limits.max_files} files: changes beyond the scan cap "
                        "are not tracked"
                    ),
                    restorable=False,
                )
            )
        if batch.rows or batch.deleted or batch.entries or batch.blobs:
            await self.core.db(self._commit, batch)
            self._dirs_known = True
        self._generation = res.generation
        return batch.changed

    async def _diff(
        self,
        sandbox: Sandbox,
        changed: list[ScanEntry],
        removed: list[str],
        racy: list[str],
        rows: dict[str, Row],
        record: dict[str, Any] | None,
        kept: int,
    ) -> _Batch:
        """The baseline rows, blobs and entries for one scan's differences.

        Entries, by kind of change:

        * a directory made whole whose name is ignored or ``.git`` (``node_modules``,
          ``.venv``, ``__pycache__``, a ``git init``) is one *tree* entry with the count
          and size of what it holds; its files get no entries of their own;
        * what a command creates or changes under a directory that is tracked by stat only
          (an existing ``node_modules``, ``.git/objects``) is one *group* entry per such
          directory per command: creations (undone by removing them) apart from changes to
          files whose content was never kept (not restorable, unless an undo also removes
          the tree they are in);
        * everything else, one entry per path: content, kind (file, symlink, directory)
          and permission bits, so undo can put each back exactly.
        """
        batch = _Batch()
        ignored_names = self.limits.ignored_dirs
        budget = [self.limits.max_total_bytes - kept]
        changed_paths = {e.path for e in changed}
        recheck = [p for p in racy if p not in changed_paths and p not in removed]
        if recheck:
            hashes = await sandbox.hash(recheck)
            now_ns = time.time_ns()
            for p in recheck:
                b = rows.get(p)
                if b is None:
                    continue
                if hashes.get(p) == b.sha256 or b.status != "ok":
                    b.racy = int(b.mtime_ns >= now_ns - RACY_NS)
                    batch.rows.append(b)
                else:  # rewritten within one mtime tick: treat as changed, stat unknown
                    changed.append(ScanEntry(p, "file", b.size, -1, 0, b.mode))
        known, changed = await self._known_content(sandbox, changed, rows, budget)
        described = known + [
            (e, row, data) for e, row, data in await self._describe_all(sandbox, changed, budget) if row
        ]
        new = {row.path: row for _e, row, _d in described if rows.get(row.path) is None}
        trees = tree_roots(new, ignored_names)
        covering = Covering(trees)
        created: dict[int, tuple[ScanEntry, Row, bytes | None]] = {}
        gone: dict[str, Row] = {p: rows[p] for p in removed if p in rows}
        groups: dict[str, Group] = {}
        for e, row, data in described:
            b = rows.get(e.path)
            if data is not None and row.sha256:
                batch.blobs.append((row.sha256, data))
            batch.rows.append(row)
            if b is None:
                if row.path in trees:
                    continue  # its one entry is made below
                tree = covering(row.path)
                if tree is not None:
                    trees[tree].add(row)
                    continue
                if row.type == "dir" and not self._dirs_known:
                    continue  # an old baseline's directory, not a new one
                root = ignored_root(row.path, ignored_names)
                if root is not None:
                    groups.setdefault(root, Group(root)).add_created(row, new)
                elif row.type == "file" and row.ino:
                    created[row.ino] = (e, row, data)
                else:
                    self._change(batch, record, None, row)
                continue
            if row.status == "ignored" and b.status == "ignored":
                if b.type != row.type or (row.type != "dir" and not b.same_stat(e)):
                    root = ignored_root(row.path, ignored_names) or ""
                    groups.setdefault(root, Group(root)).add_changed(b)
                continue
            if b.type == row.type and b.sha256 == row.sha256 and b.target == row.target:
                if not mode_changed(b, row):
                    continue  # touched, not changed
            self._change(batch, record, b, row)
        for p, b in gone.items():
            batch.deleted.append(p)
            root = ignored_root(p, ignored_names)
            if root is not None and b.status == "ignored":
                if gone.get(p.rpartition("/")[0]) is None or p.rpartition("/")[0] == root:
                    groups.setdefault(root, Group(root)).add_changed(b)
            elif is_move(b, created.get(b.ino)):
                _e, row, _d = created.pop(b.ino)
                batch.changed += [p, row.path]
                if record is not None:
                    batch.entries.append(
                        change_entry(record, "rename", p, new_path=row.path, before=b, after=row, restorable=True)
                    )
            else:
                self._change(batch, record, b, None)
        for _e, row, _d in created.values():
            self._change(batch, record, None, row)
        for made in trees.values():
            batch.changed.append(made.row.path + "/")
            if record is not None:
                batch.entries.append(made.entry(record))
        # Directories made come before what was put in them and directories removed after
        # what they held, so undoing in reverse order empties a directory before removing it.
        batch.entries.sort(key=dir_order)
        for _root, group in sorted(groups.items()):
            batch.changed += group.files()
            if record is not None:
                batch.entries += group.entries(record)
        return batch

    async def _known_content(
        self, sandbox: Sandbox, changed: list[ScanEntry], rows: dict[str, Row], budget: list[int]
    ) -> tuple[list[tuple[ScanEntry, Row, bytes | None]], list[ScanEntry]]:
        """Files this changelog wrote since the last scan (their rows hold the content's
        hash, stored, and no stat or the stat the sandbox reported for the file it put
        there: :func:`~.finish.baseline_after_change`), checked
        with one ``hash`` request for them all instead of a read of each: a file that
        still holds that content only gets its stat refreshed (what reading it would have
        concluded). Returns those rows, and the entries left for :meth:`_describe_all`
        (the others, and any whose hash differs). Raises sandbox errors."""
        ours = [
            e
            for e in changed
            if e.type == "file"
            and (b := rows.get(e.path)) is not None
            and b.type == "file"
            and (b.mtime_ns == -1 or b.racy == RACY_OWN_WRITE)
            and b.status == "ok"
            and b.sha256 is not None
            and e.size <= self.limits.max_file_bytes
            and ignored_root(e.path, self.limits.ignored_dirs) is None
        ]
        if not ours:
            return [], changed
        hashes = await sandbox.hash([e.path for e in ours])
        known: list[tuple[ScanEntry, Row, bytes | None]] = []
        done: set[str] = set()
        for e in ours:
            b = rows[e.path]
            if hashes.get(e.path) != b.sha256 or budget[0] < e.size:
                continue  # changed since (read and recorded), or beyond the cap: the usual way
            budget[0] -= e.size
            # Still the changelog's own content: reported again with nothing changed (gVisor
            # closes the file it wrote on the host after the write; a command opens it for
            # writing and writes nothing), it is hashed again, never read.
            known.append(
                (e, Row(e.path, "file", e.size, e.mtime_ns, e.ino, e.mode, b.sha256, None, "ok", RACY_OWN_WRITE), None)
            )
            done.add(e.path)
        return known, [e for e in changed if e.path not in done]

    def _change(self, batch: _Batch, record: dict[str, Any] | None, b: Row | None, a: Row | None) -> None:
        path = (a or b).path  # type: ignore[union-attr]
        if (a or b).type != "dir":  # type: ignore[union-attr]
            batch.changed.append(path)  # files_changed: files (and links) only
        if record is None:
            return
        op = "create" if b is None else ("delete" if a is None else "modify")
        note = None if b is None else why_not(b)
        restorable = note is None
        if a is not None and a.type == "symlink":
            note = (note + "; " if note else "") + f"now a symlink -> {a.target}"
        batch.entries.append(change_entry(record, op, path, before=b, after=a, restorable=restorable, note=note))
