"""The rows of a shell-command baseline (:mod:`.shellscan`) and the changelog entries a
command's changes become: one entry per file, a *tree* entry for a directory a command made
whole, a *group* entry per ignored directory and command."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sandbox.base import ScanEntry

from .model import size_text
from .store import sha256


@dataclass
class Row:
    """One baseline row."""

    path: str
    type: str
    size: int
    mtime_ns: int
    ino: int
    mode: int
    sha256: str | None
    target: str | None
    status: str  # ok | too_large | over_cap | ignored | symlink | other | unreadable
    racy: int = 0

    def same_stat(self, e: ScanEntry) -> bool:
        return (self.type, self.size, self.mtime_ns, self.ino, self.mode) == (
            e.type,
            e.size,
            e.mtime_ns,
            e.ino,
            e.mode,
        )

    def values(self) -> tuple[Any, ...]:
        return (
            self.path,
            self.type,
            self.size,
            self.mtime_ns,
            self.ino,
            self.mode,
            self.sha256,
            self.target,
            self.status,
            self.racy,
        )


#: Under a ``.git`` directory, these hold what git only ever adds to (objects, LFS
#: content): tracked by stat only, while the small files that say where the repository
#: stands (HEAD, refs, packed-refs, config, index, logs) keep their content, so an agent's
#: ``git commit``/``checkout -b``/``reset``/``stash`` can be undone exactly.
GIT_STORES = frozenset({"objects", "lfs"})


def ignored_root(path: str, ignored: Iterable[str]) -> str | None:
    """The stat-only directory ``path`` lies strictly under (``a/node_modules``,
    ``.git/objects``), or None."""
    parts = path.split("/")
    names = set(ignored)
    in_git = False  # submodules keep their stores under .git/modules/<name>/objects
    for i, comp in enumerate(parts[:-1]):
        if comp in names or (in_git and comp in GIT_STORES):
            return "/".join(parts[: i + 1])
        in_git = in_git or comp == ".git"
    return None


def tree_name(path: str, ignored: Iterable[str]) -> bool:
    """Whether a directory made at ``path`` is recorded as one tree entry: an ignored
    directory (``node_modules``, ``.venv``, ``__pycache__``...) or a repository (``.git``)."""
    name = path.rpartition("/")[2]
    return name == ".git" or name in set(ignored)


def symlink_digest(target: str) -> str:
    """The hash a symlink is recorded under: sha256 of its target (the blob stores the
    target, so a removed or changed link can be made again)."""
    return sha256(target.encode("utf-8", "surrogateescape"))


class Tree:
    """A directory a command made whole, and everything made in it (one entry)."""

    def __init__(self, row: Row) -> None:
        self.row = row
        self.files = 0
        self.dirs = 0
        self.bytes = 0

    def add(self, row: Row) -> None:
        if row.type == "dir":
            self.dirs += 1
        else:
            self.files += 1
            self.bytes += max(row.size, 0) if row.type == "file" else 0

    def entry(self, record: dict[str, Any]) -> dict[str, Any]:
        e = change_entry(
            record,
            "create",
            self.row.path,
            after=self.row,
            restorable=True,
            note=f"made with {_count(self.files, self.dirs, self.bytes)} in it",
        )
        e.update(tree_files=self.files, tree_bytes=self.bytes)
        return e


class Group:
    """What one command did under one stat-only directory that already existed."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.created: list[Row] = []  # the topmost made (a directory stands for its content)
        self.inside: dict[str, list[int]] = {}  # topmost made directory -> [files, dirs, bytes]
        self.changed: list[Row] = []  # modified or removed, content never kept
        self._top: dict[str, str | None] = {}  # directory -> its topmost new ancestor-or-self

    def _topmost_new(self, d: str, new: dict[str, Row]) -> str | None:
        """The topmost of ``d`` and its ancestors below the root that ``new`` holds; each
        directory's answer remembered, so a deep chain is not walked once per path."""
        chain: list[str] = []
        top: str | None = None
        while d and d != self.root:
            if d in self._top:
                top = self._top[d]
                break
            chain.append(d)
            d = d.rpartition("/")[0]
        for c in reversed(chain):  # from the top down
            if top is None and c in new:
                top = c
            self._top[c] = top
        return top

    def add_created(self, row: Row, new: dict[str, Row]) -> None:
        top = self._topmost_new(row.path.rpartition("/")[0], new)
        if top is None:
            self.created.append(row)
            if row.type == "dir":
                self.inside.setdefault(row.path, [0, 0, 0])
            else:
                self.inside[row.path] = [1, 0, max(row.size, 0) if row.type == "file" else 0]
            return
        c = self.inside.setdefault(top, [0, 0, 0])
        if row.type == "dir":
            c[1] += 1
        else:
            c[0] += 1
            c[2] += max(row.size, 0) if row.type == "file" else 0

    def add_changed(self, b: Row) -> None:
        self.changed.append(b)

    def files(self) -> list[str]:
        out = [r.path + ("/" if r.type == "dir" else "") for r in self.created]
        return out + [r.path for r in self.changed if r.type != "dir"]

    def entries(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        if self.created:
            files = sum(c[0] for c in self.inside.values())
            dirs = sum(c[1] for c in self.inside.values()) + sum(r.type == "dir" for r in self.created)
            size = sum(c[2] for c in self.inside.values())
            names = sorted(r.path[len(self.root) + 1 :] for r in self.created)
            e = change_entry(
                record,
                "create",
                self.root,
                restorable=True,
                note=f"made {_count(files, dirs, size)} under {self.root}: " + _some(names),
            )
            e.update(before_kind="dir", after_kind="dir", tree_files=files, tree_bytes=size)
            e["_members"] = [(r.path, r.type) for r in self.created]
            out.append(e)
        if self.changed:
            names = sorted(r.path[len(self.root) + 1 :] for r in self.changed)
            e = change_entry(
                record,
                "modify",
                self.root,
                restorable=False,
                note=(
                    f"{len(self.changed)} path(s) that existed before changed or removed under {self.root} "
                    "(tracked by stat only, content not kept): " + _some(names)
                ),
            )
            nondirs = [r for r in self.changed if r.type != "dir"]
            e.update(
                before_kind="dir",
                after_kind="dir",
                tree_files=len(nondirs),
                tree_bytes=sum(max(r.size, 0) for r in nondirs if r.type == "file"),
            )
            e["_members"] = [(r.path, r.type) for r in self.changed]
            out.append(e)
        return out


#: A new directory holding more new paths than this is one tree entry whatever its name
#: (``pip install --target deps``, an unpacked archive): a user reads one line, not
#: hundreds. Its files' content is still kept in the baseline, so later edits of them
#: stay restorable; smaller new directories get an entry per path (and a diff).
TREE_MIN_PATHS = 64


def tree_roots(new: dict[str, Row], ignored: Iterable[str]) -> dict[str, Tree]:
    """The new directories recorded as one tree entry each: named as an ignored directory
    or ``.git``, or holding more than :data:`TREE_MIN_PATHS` new paths; not inside
    another such new tree nor inside a stat-only directory (there the group entry of that
    directory covers them).

    Linear in the paths: a command that makes a tree 5,000 directories deep has 5,000
    paths and 12.5 million (path, ancestor) pairs, so no path walks up its ancestors."""
    by_depth = sorted(new, key=lambda p: p.count("/"))
    # new paths below each new directory through new directories only, children first
    inside: dict[str, int] = {}
    for path in reversed(by_depth):
        parent = path.rpartition("/")[0]
        if parent in new:
            inside[parent] = inside.get(parent, 0) + 1 + inside.get(path, 0)
    out: dict[str, Tree] = {}
    # Shallower paths first: a tree is added only after every path above it was looked at,
    # so what Covering remembers of those paths stays true.
    cover = Covering(out)
    for path in by_depth:
        row = new[path]
        if row.type != "dir" or ignored_root(path, ignored) is not None:
            continue
        if not tree_name(path, ignored) and inside.get(path, 0) <= TREE_MIN_PATHS:
            continue
        if cover(path) is None:
            out[path] = Tree(row)
    return out


class Covering:
    """The tree of ``trees`` that a path lies strictly inside, or None; what it finds for a
    directory is remembered for the paths below it (a path's answer is its parent's), so
    n paths in a chain cost n lookups, not n²/2. ``trees`` may gain a tree only where no
    path below it was asked about yet."""

    def __init__(self, trees: dict[str, Tree]) -> None:
        self.trees = trees
        self._below: dict[str, str | None] = {}  # directory -> the tree a path in it is in

    def __call__(self, path: str) -> str | None:
        pending: list[str] = []
        found: str | None = None
        parent = path.rpartition("/")[0]
        while parent:
            if parent in self.trees:
                found = parent
                break
            if parent in self._below:
                found = self._below[parent]
                break
            pending.append(parent)
            parent = parent.rpartition("/")[0]
        for d in pending:
            self._below[d] = found
        return found


def mode_changed(b: Row, a: Row) -> bool:
    # A mode of 0 is unknown (a row written by a tool's change or an undo, or a directory
    # of a baseline from before directories had modes): refreshed, not a change.
    return b.mode != 0 and (b.mode & 0o7777) != (a.mode & 0o7777)


def _count(files: int, dirs: int, size: int) -> str:
    return f"{files} file(s) and {dirs} director{'y' if dirs == 1 else 'ies'}, {size_text(size)}"


def _some(names: list[str], k: int = 5) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def dir_order(e: dict[str, Any]) -> tuple[int, int]:
    depth = e["path"].count("/")
    if e["op"] == "create" and e["after_kind"] == "dir":
        return (0, depth)
    if e["op"] == "delete" and e["before_kind"] == "dir":
        return (2, -depth)
    return (1, 0)


def is_move(b: Row, c: tuple[ScanEntry, Row, bytes | None] | None) -> bool:
    # Same inode *and* same content: a freed inode is often reused at once by a new file.
    return c is not None and b.type == "file" and b.status == "ok" and c[1].sha256 == b.sha256


def why_not(b: Row) -> str | None:
    """Why the state ``b`` cannot be put back, or None when it can."""
    if b.type == "dir":
        return None
    if b.type == "symlink":
        return None if b.sha256 else "was a symlink whose target could not be read"
    if b.type != "file":
        return "was a special file (FIFO, socket or device); it cannot be made again"
    if b.status != "ok":
        return {
            "too_large": "before-image not kept: over the per-file size cap",
            "over_cap": "before-image not kept: the baseline's total size cap was reached",
            "unreadable": "before-image not kept: the file was unreadable",
            "ignored": "before-image not kept: under a directory tracked by stat only",
        }.get(b.status, b.status)
    return None


def change_entry(
    record: dict[str, Any],
    op: str,
    path: str,
    *,
    new_path: str | None = None,
    before: Row | None = None,
    after: Row | None = None,
    restorable: bool,
    note: str | None = None,
) -> dict[str, Any]:
    return {
        "ts": time.time(),
        "call_id": record.get("call_id"),
        "subtask_id": record.get("subtask_id"),
        "tool": record.get("tool") or "shell_execute",
        "op": op,
        "path": path,
        "new_path": new_path,
        "before_hash": before.sha256 if before else None,
        "after_hash": after.sha256 if after else None,
        "before_kind": _kind(before),
        "after_kind": _kind(after),
        "before_mode": before.mode if before and before.mode else None,
        "after_mode": after.mode if after and after.mode else None,
        "state": "applied",
        "origin": "shell",
        "restorable": int(restorable),
        "note": _note(record, note),
        "reverts": None,
    }


def _note(record: dict[str, Any], note: str | None) -> str | None:
    if note is None and record.get("command"):
        note = f"$ {record['command'][:200]}"
    if record.get("interrupted"):  # recorded at recovery: the worker stopped before the command's end
        note = f"{note} " if note else ""
        note += "[interrupted: recorded when the worker next started]"
    return note


def _kind(r: Row | None) -> str | None:
    if r is None:
        return None
    return r.type if r.type in ("file", "symlink", "dir") else "other"
