"""The net change of each path over a session: the state at the session's start (the
changelog's first before-image) and the state now (read through the sandbox).

Only what git tracks is kept: regular files (with their executable bit) and symlinks.
Directories have no content in git; paths inside a repository's ``.git`` are the
repository's internals, not its content; paths the changelog tracks by stat only
(``node_modules``...) and trees made whole have no before-image worth a patch: each is
named in :attr:`Changes.skipped` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sandbox.base import Sandbox

from ..changelog import Changelog, Entry
from ..changelog.diff import first_before
from ..changelog.shellrows import ignored_root
from .errors import HandoffError

Kind = Literal["file", "symlink"]


@dataclass(frozen=True)
class Side:
    """What a path held: a file's bytes or a symlink's target, and git's mode for it."""

    kind: Kind
    data: bytes
    executable: bool = False

    @property
    def mode(self) -> str:
        if self.kind == "symlink":
            return "120000"
        return "100755" if self.executable else "100644"


@dataclass(frozen=True)
class Change:
    """One path's net change (``old_path != new_path`` for a rename; a side None: absent)."""

    old_path: str
    new_path: str
    old: Side | None
    new: Side | None


@dataclass
class Changes:
    changes: list[Change] = field(default_factory=list)
    #: Paths left out, each with why.
    skipped: list[str] = field(default_factory=list)


def in_git_dir(path: str) -> bool:
    """Whether ``path`` lies in (or is) a repository's ``.git``, at any depth."""
    return ".git" in path.split("/")


def _executable(mode: int | None) -> bool:
    return bool(mode and mode & 0o100)


async def _old(cl: Changelog, e: Entry, path: str) -> Side | str | None:
    """The state at the start of ``path`` whose first entry is ``e``: a Side, None
    (absent), or a str saying why it is unknown."""
    if e.path != path or e.before_kind is None:
        return None  # the first change made it (a create, or the target of a rename)
    if e.before_kind not in ("file", "symlink"):
        return f"was a {e.before_kind}"
    blob = await cl.blob(e.before_hash) if e.before_hash else None
    if blob is None:
        return f"its content at the start was not kept ({e.note or 'over the size cap'})"
    return Side(e.before_kind, blob, _executable(e.before_mode))


async def current(sandbox: Sandbox, path: str, max_bytes: int) -> Side | str | None:
    """What ``path`` holds now, read through the sandbox (never following a link).
    Raises sandbox infrastructure errors."""
    from sandbox.errors import AgentError, PathNotFoundError

    try:
        st = await sandbox.stat(path)
    except PathNotFoundError:
        return None
    if st.type == "symlink":
        return Side("symlink", (st.target or "").encode("utf-8", "surrogateescape"))
    if st.type == "dir":
        return None  # a directory has no content in git; what is in it has its own entries
    if st.type != "file":
        return f"is a {st.type}"
    try:
        r = await sandbox.read(path, max_bytes=max_bytes)
    except PathNotFoundError:
        return None
    except AgentError as e:
        return f"cannot be read: {e}"
    if r.sha256 is None:
        return f"is over {max_bytes} bytes"
    return Side("file", r.data, _executable(st.mode))


async def collect(cl: Changelog, sandbox: Sandbox, *, strict: bool = True) -> Changes:
    """The net changes of every recorded path. ``strict``: a path whose state at the
    start or now cannot be known raises HandoffError (a patch without it would not give
    the same tree); else it is named in ``skipped``. Raises HandoffError,
    ChangelogStorageError, sandbox infrastructure errors."""
    entries = await cl.log()
    out = Changes()
    for e in entries:
        if e.tree_files is not None and e.state == "applied" and not e.reverted and not in_git_dir(e.path):
            what = "made whole" if e.is_tree else "tracked by stat only"
            out.skipped.append(f"{e.path}/ ({e.describe()}, {what}: not included)")
    files = [
        e
        for e in entries
        if e.tree_files is None and "dir" not in (e.before_kind, e.after_kind) and e.before_kind != "other"
    ]
    firsts = first_before(files)
    renames: dict[str, str] = {}  # old path -> new path, recorded renames
    for e in files:
        if e.op == "rename" and e.new_path and e.state == "applied" and not e.reverted:
            renames[e.path] = e.new_path
    limit = cl.limits.max_file_bytes
    states: dict[str, tuple[Side | None, Side | None]] = {}
    problems: list[str] = []
    for path, e in sorted(firsts.items()):
        if in_git_dir(path) or ignored_root(path, cl.limits.ignored_dirs) is not None:
            continue
        old = await _old(cl, e, path)
        new = await current(sandbox, path, limit)
        if isinstance(old, str) or isinstance(new, str):
            why = old if isinstance(old, str) else new
            problems.append(f"{path}: {why}")
            continue
        if old != new:
            states[path] = (old, new)
    if problems and strict:
        raise HandoffError("cannot say how these paths changed: " + "; ".join(problems))
    out.skipped.extend(problems)
    used: set[str] = set()
    for a, b in renames.items():
        sa, sb = states.get(a), states.get(b)
        # A rename is kept as one only when its net effect is one: a gone, b new.
        if sa and sb and sa[1] is None and sb[0] is None and sa[0] and sb[1] and sa[0].kind == sb[1].kind:
            out.changes.append(Change(a, b, sa[0], sb[1]))
            used.update((a, b))
    for path, (old, new) in states.items():
        if path not in used:
            out.changes.append(Change(path, path, old, new))
    out.changes.sort(key=lambda c: c.new_path if c.new is not None else c.old_path)
    return out
