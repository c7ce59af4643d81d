"""Whether a session changed what git on the host would run: hooks, config, attributes
naming filters, where git finds its repository.

Read from the changelog, which recorded every change the session made, so a change that
was made and then taken back (by undo, or by the host's guard disabling a planted hook)
still counts: the repository is not trusted once a session tried.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..changelog import Entry

#: Inside a ``.git``: what git itself writes while an agent inits, commits, branches,
#: merges and fetches, and which names no program. Any other change there is refused.
GIT_DATA_DIRS = ("objects", "refs", "logs", "lfs", "rr-cache", "rebase-merge", "rebase-apply")
GIT_DATA_FILES = frozenset(
    """HEAD ORIG_HEAD FETCH_HEAD MERGE_HEAD MERGE_MSG MERGE_MODE CHERRY_PICK_HEAD REVERT_HEAD
    AUTO_MERGE COMMIT_EDITMSG TAG_EDITMSG index packed-refs description shallow
    info/exclude info/refs info/sparse-checkout""".split()
)
#: Attributes naming a driver the repository's config maps to a program.
DRIVER_ATTRIBUTES = ("filter", "diff", "merge", "textconv")


def _git_part(path: str) -> tuple[str, str] | None:
    """(the repository directory, the path inside its ``.git``) for a path in a ``.git``."""
    parts = path.split("/")
    if ".git" not in parts:
        return None
    i = len(parts) - 1 - parts[::-1].index(".git")  # the innermost .git
    return "/".join(parts[:i]) or ".", "/".join(parts[i + 1 :])


def _git_internal_allowed(inner: str) -> bool:
    if inner in GIT_DATA_FILES:
        return True
    top = inner.split("/", 1)[0]
    if top in GIT_DATA_DIRS:
        return inner != "objects/info/alternates"  # objects read from anywhere
    if top in ("modules", "worktrees"):  # a submodule's or linked worktree's git dir
        rest = inner.split("/", 2)
        return len(rest) == 3 and _git_internal_allowed(rest[2]) and rest[2] not in ("commondir", "gitdir")
    return False


def _paths(e: Entry) -> Iterable[str]:
    yield e.path
    if e.new_path:
        yield e.new_path


def tampering(entries: Iterable[Entry], attributes: dict[str, bytes | None] | None = None) -> list[str]:
    """What the recorded ``entries`` changed that git on the host would act on, one line
    each ([]: nothing). ``attributes``: the content now of the ``.gitattributes`` files
    the entries touched (None: absent), to tell a driver from a plain attribute."""
    found: dict[str, str] = {}
    for e in entries:
        if e.state == "failed":
            continue  # refused by the sandbox: nothing changed
        for path in _paths(e):
            name = path.rsplit("/", 1)[-1]
            part = _git_part(path)
            if part is not None:
                _repo, inner = part
                if inner == "":
                    # A .git made, moved, replaced or a ``gitdir:`` file: where git finds
                    # its repository (only a directory's permission bits are left alone).
                    if e.tree_files is not None or (e.before_kind, e.after_kind) != ("dir", "dir"):
                        found[path] = f"{path} was made, moved, removed or rewritten (entry {e.id}, {e.tool})"
                elif not _git_internal_allowed(inner):
                    found[path] = f"{path} changed (entry {e.id}, {e.tool})"
                elif e.tree_files is not None and inner.split("/", 1)[0] in ("modules", "worktrees"):
                    found[path] = f"{path} changed (entry {e.id}, {e.tool}: a whole directory)"
            elif name == ".gitattributes" or path.endswith("/info/attributes"):
                text = (attributes or {}).get(path, b"") or b""
                if any(f"{d}=".encode() in text or f"{d} ".encode() in text for d in DRIVER_ATTRIBUTES):
                    found[path] = f"{path} names a filter or diff/merge driver (entry {e.id}, {e.tool})"
    return [found[p] for p in sorted(found)]
