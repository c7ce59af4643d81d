"""Restore: make a workspace the copy of a tree (a snapshot's), recorded so it can be undone.

The target is a tree on the host that no sandbox can reach (a snapshot's, immutable); the
workspace is read and written only through its sandbox, as every other change is. The
caller holds the changelog's lock. Steps:

1. the shell baseline is brought up to date (changes made from outside are absorbed, as
   before any command), so it describes the workspace exactly;
2. the target is walked on the host and compared with the baseline: a path whose kind,
   size, permission bits and mtime match is unchanged (the quick check of the
   changelog's own scans, of rsync and git); a file whose size matches but not its mtime
   is compared by hash;
3. one entry per path to change is recorded, pending, in one transaction, with the
   before-image of everything it replaces or removes (content kept even under the
   ignored directories and beyond the baseline's caps, read through the sandbox when the
   baseline has none, up to the per-file cap) and the after-image;
4. the changes are made through the sandbox: removals deepest first (a removed
   directory goes whole), then creations and changes parents first, then directories'
   permission bits deepest first (so a read-only directory is filled before it is made
   read-only); each entry is then settled applied or failed, in one transaction;
5. the baseline is brought up to date again, without entries.

The entries are ordinary ones (tool ``restore``, one call id): ``undo --call`` reverts them
in reverse order, byte for byte, and the dashboard and ``log`` show them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.base import Sandbox
from sandbox.errors import AgentError

from .diff import unified
from .recorder import ChangelogCore
from .shellscan import Row, ShellTracker, symlink_digest
from .store import Store, sha256


@dataclass(frozen=True)
class Node:
    """A path of the target tree."""

    type: str  # file | dir | symlink | other
    size: int
    mtime_ns: int
    mode: int
    target: str | None = None


@dataclass
class Plan:
    """What a restore changes (or, in a dry run, would)."""

    removed: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    entries: list[int] = field(default_factory=list)
    diff: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "removed": self.removed,
            "created": self.created,
            "modified": self.modified,
            "failed": self.failed,
            "entries": self.entries,
        }


def walk(root: Path) -> dict[str, Node]:
    """Every path under ``root`` (relative, never following a link). Raises OSError.

    A tree that changes during the walk (a live workspace, measured before its snapshot)
    never makes it fail: what vanishes or stops being a link between the listing and the
    look is left out, as a walk a moment later would have it."""
    out: dict[str, Node] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            it = os.scandir(root / rel if rel else root)
        except (FileNotFoundError, NotADirectoryError):
            if not rel:
                raise
            continue
        with it:
            for e in it:
                path = f"{rel}/{e.name}" if rel else e.name
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                mode = st.st_mode
                if stat.S_ISDIR(mode):
                    out[path] = Node("dir", 0, st.st_mtime_ns, stat.S_IMODE(mode))
                    stack.append(path)
                elif stat.S_ISLNK(mode):
                    try:
                        target = os.readlink(e.path)
                    except OSError as err:
                        if err.errno not in (errno.EINVAL, errno.ENOENT):
                            raise
                        continue
                    out[path] = Node("symlink", st.st_size, st.st_mtime_ns, 0, target)
                elif stat.S_ISREG(mode):
                    out[path] = Node("file", st.st_size, st.st_mtime_ns, stat.S_IMODE(mode))
                else:
                    out[path] = Node("other", 0, st.st_mtime_ns, stat.S_IMODE(mode))
    return out


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_FMT = {"file": stat.S_IFREG, "dir": stat.S_IFDIR}


def _depth(p: str) -> int:
    return p.count("/")


def _under(path: str, roots: set[str]) -> bool:
    parts = path.split("/")
    return any("/".join(parts[:i]) in roots for i in range(1, len(parts)))


class Restorer:
    """One restore of a workspace to the tree ``target`` (a host path)."""

    def __init__(self, core: ChangelogCore, tracker: ShellTracker, sandbox: Sandbox, target: Path) -> None:
        self.core = core
        self.tracker = tracker
        self.sandbox = sandbox
        self.target = target
        self.cap = core.limits.max_file_bytes

    async def run(self, *, call_id: str, note: str, dry_run: bool) -> Plan:
        """Restore (or with ``dry_run`` only plan and diff). Raises sandbox and storage
        errors, OSError reading the target."""
        if not await self.tracker.ready():
            await self.tracker.build(self.sandbox)
        else:
            await self.tracker.sync(self.sandbox, None)
        base: dict[str, Row] = await self.core.db(self.tracker._all_rows)
        want = await asyncio.to_thread(walk, self.target)
        plan, steps = await self._plan(base, want)
        if dry_run:
            plan.diff = await self._diff(steps)
            return plan
        fields, blobs = [], []
        ts = time.time()
        for s in steps:
            f, b = await self._entry(s, call_id=call_id, note=note, ts=ts)
            fields.append(f)
            blobs += b
        ids = await self.core.db(self._record, fields, blobs)
        plan.entries = ids
        outcome = await self._apply(steps)
        await self.core.db(self._settle, ids, outcome)
        plan.failed = [s.path for s, ok in zip(steps, outcome, strict=True) if not ok]
        await self.tracker.sync(self.sandbox, None)
        return plan

    # -- planning ---------------------------------------------------------------------

    async def _plan(self, base: dict[str, Row], want: dict[str, Node]) -> tuple[Plan, list[_Step]]:
        """The steps, in the order they are applied (see the module docstring)."""
        plan = Plan()
        # What goes: paths the target does not have, or has as another kind; a directory
        # that goes is removed whole, by the step of the topmost one.
        gone = {p for p, b in base.items() if p not in want or want[p].type != b.type}
        gone_dirs = {p for p in gone if base[p].type == "dir"}
        removals = [
            _Step("remove", p, base[p], None, top=not _under(p, gone_dirs))
            for p in sorted(gone, key=lambda p: (-_depth(p), p))
        ]
        plan.removed = [s.path for s in removals]
        changes: list[_Step] = []
        maybe: list[tuple[str, Row, Node]] = []
        for p in sorted(want, key=lambda p: (_depth(p), p)):
            n, b = want[p], base.get(p)
            if b is None or p in gone:
                changes.append(_Step("create", p, None, n))
                plan.created.append(p)
            elif n.type == "symlink":
                if b.target is None:  # under an ignored directory the baseline keeps no target
                    with contextlib.suppress(AgentError):
                        b.target = (await self.sandbox.stat(p)).target
                if b.target != n.target:
                    changes.append(_Step("relink", p, b, n))
            elif n.type == "file" and (b.size != n.size):
                changes.append(_Step("write", p, b, n))
            elif n.type == "file" and b.mtime_ns != n.mtime_ns:
                maybe.append((p, b, n))
            elif n.type in ("file", "dir") and stat.S_IMODE(b.mode) != n.mode:
                changes.append(_Step("chmod", p, b, n))
        if maybe:
            unknown = [p for p, b, _n in maybe if b.status != "ok" or not b.sha256]
            now = await self.sandbox.hash(unknown) if unknown else {}
            for p, b, n in maybe:
                have = b.sha256 if b.status == "ok" and b.sha256 else now.get(p)
                if have != await asyncio.to_thread(_file_sha, self.target / p):
                    changes.append(_Step("write", p, b, n))
                elif stat.S_IMODE(b.mode) != n.mode:
                    changes.append(_Step("chmod", p, b, n))
        plan.modified = sorted(s.path for s in changes if s.kind != "create")
        # Directories' own permission bits last, deepest first.
        dirs = sorted(
            (s for s in changes if s.kind == "chmod" and s.before and s.before.type == "dir"),
            key=lambda s: -_depth(s.path),
        )
        rest = [s for s in changes if not (s.kind == "chmod" and s.before and s.before.type == "dir")]
        return plan, removals + rest + dirs

    async def _before(self, p: str, b: Row) -> tuple[str | None, bytes | None, str | None]:
        """The hash and content of what ``p`` holds now, and a note when not kept."""
        if b.type == "symlink":
            if b.target is None:  # (kept by stat only under an ignored directory)
                with contextlib.suppress(AgentError):
                    b.target = (await self.sandbox.stat(p)).target
            return (
                (symlink_digest(b.target), b.target.encode("utf-8", "surrogateescape"), None)
                if b.target
                else (None, None, None)
            )
        if b.type != "file":
            return None, None, None
        if b.status == "ok" and b.sha256:
            data = await self.core.db(self.core.store.get_blob, b.sha256)
            if data is not None:
                return b.sha256, data, None
        r = await self.sandbox.read(p, max_bytes=self.cap)
        if r.sha256 is None:
            digest = (await self.sandbox.hash([p])).get(p)
            return digest, None, f"before-image not kept: {r.size} bytes exceeds the {self.cap} byte per-file cap"
        return r.sha256, r.data, None

    async def _entry(
        self, s: _Step, *, call_id: str, note: str, ts: float
    ) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
        b, n = s.before, s.after
        blobs: list[tuple[str, bytes]] = []
        before_hash = why = None
        if b is not None and s.kind != "chmod":
            before_hash, data, why = await self._before(s.path, b)
            if data is not None and before_hash:
                blobs.append((before_hash, data))
        elif b is not None and b.type == "file":  # permission bits only: the content's hash
            before_hash = b.sha256 if b.status == "ok" and b.sha256 else (await self.sandbox.hash([s.path])).get(s.path)
        after_hash = None
        if n is not None and n.type == "file":
            s.data = (self.target / s.path).read_bytes() if s.kind != "chmod" else None
            after_hash = sha256(s.data) if s.data is not None else before_hash
            if s.data is not None and len(s.data) <= self.cap:
                blobs.append((sha256(s.data), s.data))
        elif n is not None and n.type == "symlink" and n.target is not None:
            after_hash = symlink_digest(n.target)
            blobs.append((after_hash, n.target.encode("utf-8", "surrogateescape")))
        op = "create" if b is None else ("delete" if n is None else "modify")
        fields = {
            "ts": ts,
            "call_id": call_id,
            "subtask_id": None,
            "tool": "restore",
            "op": op,
            "path": s.path,
            "before_hash": before_hash,
            "after_hash": after_hash,
            "before_kind": None if b is None else b.type,
            "after_kind": None if n is None else n.type,
            "before_mode": None if b is None or b.type == "symlink" else b.mode or None,
            "after_mode": None if n is None or n.type == "symlink" else _FMT.get(n.type, 0) | n.mode,
            "state": "pending",
            "origin": "tool",
            "restorable": int(why is None),
            "note": note if why is None else f"{note}; {why}",
        }
        return fields, blobs

    def _record(self, fields: list[dict[str, Any]], blobs: list[tuple[str, bytes]]) -> list[int]:
        with self.core.store.tx() as db:
            for digest, data in blobs:
                Store.put_blob(db, digest, data)
            return [Store.insert_entry(db, **f) for f in fields]

    def _settle(self, ids: list[int], outcome: list[bool]) -> None:
        with self.core.store.tx(durable=False) as db:
            for uid, ok in zip(ids, outcome, strict=True):
                db.execute(
                    "UPDATE entries SET state = ? WHERE id = ? AND state = 'pending'",
                    ("applied" if ok else "failed", uid),
                )

    # -- applying ---------------------------------------------------------------------

    async def _apply(self, steps: list[_Step]) -> list[bool]:
        out = []
        box = self.sandbox
        for s in steps:
            n = s.after
            try:
                if s.kind == "remove":
                    if s.top:
                        await box.remove_tree(s.path)
                elif s.kind == "chmod" and n is not None:
                    await box.chmod(s.path, n.mode)
                elif n is not None and n.type == "dir":
                    await box.mkdir(s.path, mode=n.mode | 0o700)
                elif n is not None and n.type == "symlink" and n.target is not None:
                    if s.kind == "relink":
                        await box.remove_tree(s.path)
                    await box.symlink(s.path, n.target)
                elif n is not None and n.type == "other":
                    raise AgentError(
                        f"{s.path}: a special file (FIFO, socket, device) is not made again", code="invalid"
                    )
                elif n is not None and n.type == "file" and s.data is not None:
                    await box.write(
                        s.path, s.data, expect_absent=s.kind == "create", fsync=self.core.fsync, mode=n.mode
                    )
                    if s.kind == "write" and s.before is not None and stat.S_IMODE(s.before.mode) != n.mode:
                        await box.chmod(s.path, n.mode)
                out.append(True)
            except AgentError:
                out.append(False)
        # Directories made above were writable for their content; their own bits now.
        for s in sorted(
            (s for s in steps if s.kind == "create" and s.after and s.after.type == "dir"),
            key=lambda s: -_depth(s.path),
        ):
            if s.after is not None and s.after.mode != s.after.mode | 0o700:
                try:
                    await box.chmod(s.path, s.after.mode)
                except AgentError:
                    pass
        return out

    async def _diff(self, steps: list[_Step]) -> str:
        parts = []
        for s in steps:
            if s.kind == "chmod" or (s.kind == "remove" and not s.top and s.before and s.before.type == "dir"):
                continue
            old: bytes | str | None = None
            if s.before is not None and s.before.type == "file":
                _h, data, _w = await self._before(s.path, s.before)
                old = data if data is not None else "(content not kept)"
            elif s.before is not None and s.before.type == "symlink":
                old = f"(symlink -> {s.before.target})"
            elif s.before is not None:
                old = f"({s.before.type})"
            new: bytes | str | None = None
            if s.after is not None and s.after.type == "file":
                new = (self.target / s.path).read_bytes()
            elif s.after is not None and s.after.type == "symlink":
                new = f"(symlink -> {s.after.target})"
            elif s.after is not None:
                new = f"({s.after.type})"
            if (s.before is not None and s.before.type == "dir") or (s.after is not None and s.after.type == "dir"):
                continue
            parts.append(unified(s.path, old, new))
        return "".join(parts)


@dataclass
class _Step:
    kind: str  # remove | create | write | relink | chmod
    path: str
    before: Row | None
    after: Node | None
    top: bool = True
    data: bytes | None = None
