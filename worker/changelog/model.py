"""What the changelog stores and returns (Loom Spec 11 entries, extended).

An :class:`Entry` is one change to one path. ``before_hash`` names the before-image in the
blob store (None for a create); ``after_hash`` the content after the change (None for a
delete). ``state`` is ``pending`` from the moment the entry is durably recorded until the
change is known to have happened (``applied``) or not (``failed``); a crash leaves it
``pending`` and the next user of the changelog resolves it by hashing the file through the
sandbox. ``restorable`` is False when the before-image could not be kept (a file over the
size cap, an ignored directory, a symlink or special file); ``note`` says why.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..quoting import quote_path
from ..result import safe_text

Op = Literal["create", "modify", "delete", "rename"]
State = Literal["pending", "applied", "failed"]
Origin = Literal["tool", "shell", "undo"]
#: What a recorded change survives: "full" = a power cut (fsync of the changelog's commit
#: and of the new content before the file is replaced; the directory's fsync follows the
#: answer by a fraction of a millisecond, see ``sandbox/agent/write.py:_put_in_place``: a rename
#: lost to a power cut leaves the old file, which recovery or the next scan records as
#: such); "process" = the death (SIGKILL) of the
#: worker, the agent or the container, not a power cut (no fsync; SQLite
#: ``synchronous=NORMAL`` in WAL mode, the file written to a temp file and renamed).
Durability = Literal["full", "process"]
#: What a path was before/after: a regular file, a symlink, something else, or absent (None).
Kind = Literal["file", "symlink", "dir", "other"]


class Entry(BaseModel):
    """One recorded change to one workspace path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int
    ts: float
    call_id: str | None
    subtask_id: str | None
    tool: str
    op: Op
    path: str
    new_path: str | None = None
    before_hash: str | None = None
    after_hash: str | None = None
    before_kind: Kind | None = None
    after_kind: Kind | None = None
    before_mode: int | None = None
    state: State = "applied"
    origin: Origin = "tool"
    restorable: bool = True
    note: str | None = None
    reverts: int | None = None  # for undo entries: the entry this one reverted
    reverted_by: int | None = None  # the undo entry that reverted this one
    #: The permission bits after the change (a ``chmod`` is a ``modify`` whose hashes match).
    after_mode: int | None = None
    #: A *tree* or *group* entry stands for many paths at once, so that a command making
    #: 50,000 files in ``node_modules`` is one entry, not 50,000: a directory tree a
    #: command made (``op='create'``, ``after_kind='dir'``: undo removes it with
    #: everything in it), or the paths a command created or changed under an ignored
    #: directory (``path`` is that directory; the paths are the entry's *members*). These
    #: count the files (links and other non-directories included) and their bytes.
    tree_files: int | None = None
    tree_bytes: int | None = None
    #: As the CLI and the HTTP API show an entry (:meth:`shown`): :meth:`describe`.
    detail: str | None = None

    def describe(self) -> str:
        """A few words for what a tree, group, mode or link entry stands for ('' for a
        plain file change), as ``log`` shows it."""
        if self.tree_files is not None:
            n, kind = self.tree_files, "tree" if self.is_tree else "group"
            return f"{kind}: {n} file{'' if n == 1 else 's'}, {size_text(self.tree_bytes or 0)}"
        if (
            self.op == "modify"
            and self.before_kind == self.after_kind
            and self.before_hash == self.after_hash
            and self.before_mode
            and self.after_mode
        ):
            return f"mode {self.before_mode & 0o7777:o} -> {self.after_mode & 0o7777:o}"
        if self.before_kind != self.after_kind and self.before_kind and self.after_kind:
            return f"{self.before_kind} -> {self.after_kind}"
        if "symlink" in (self.before_kind, self.after_kind):
            return "symlink"
        return ""

    @property
    def is_group(self) -> bool:
        """Whether this entry's paths are its members (not ``path`` itself)."""
        return self.tree_files is not None and self.after_kind == "dir" and self.before_kind == "dir"

    @property
    def is_tree(self) -> bool:
        """A directory made together with everything in it (undo removes the whole tree)."""
        return self.tree_files is not None and self.op == "create" and self.after_kind == "dir" and not self.before_kind

    @property
    def reverted(self) -> bool:
        return self.reverted_by is not None

    def shown(self) -> Entry:
        """This entry as the CLI and the HTTP API show it: paths that are not plain text
        quoted (:func:`~worker.quoting.quote_path`), the note safe for any UTF-8 stream."""
        return self.model_copy(
            update={
                "path": quote_path(self.path),
                "new_path": None if self.new_path is None else quote_path(self.new_path),
                "note": None if self.note is None else safe_text(self.note),
                "call_id": None if self.call_id is None else safe_text(self.call_id),
                "subtask_id": None if self.subtask_id is None else safe_text(self.subtask_id),
                "detail": self.describe() or None,
            }
        )


class UndoStep(BaseModel):
    """What undo did (or, in a dry run, would do) for one entry."""

    model_config = ConfigDict(extra="forbid")

    entry_id: int
    path: str
    action: Literal["restore", "remove", "rename_back", "skip"]
    #: ``kept``: a directory made whose undo leaves it, because something else is in it
    #: (the message says what, and which change put it there); its entry stays, so a later
    #: undo that empties it removes it.
    status: Literal["reverted", "would_revert", "already_reverted", "not_restorable", "failed", "kept"]
    undo_entry_id: int | None = None
    message: str | None = None
    #: For a not-restorable step of a group entry: every path it could not put back.
    paths: list[str] = []


class UndoResult(BaseModel):
    """The outcome of one undo request; ``diff`` is the unified diff it applies (or would)."""

    model_config = ConfigDict(extra="forbid")

    dry_run: bool
    steps: list[UndoStep]
    diff: str

    @property
    def reverted(self) -> list[int]:
        return [s.entry_id for s in self.steps if s.status in ("reverted", "would_revert")]

    def shown(self) -> UndoResult:
        """As :meth:`Entry.shown`: quoted paths, safe messages and diff."""
        steps = [
            s.model_copy(
                update={
                    "path": quote_path(s.path),
                    "message": None if s.message is None else safe_text(s.message),
                    "paths": [quote_path(p) for p in s.paths],
                }
            )
            for s in self.steps
        ]
        return self.model_copy(update={"steps": steps, "diff": safe_text(self.diff)})

    @property
    def failed(self) -> list[UndoStep]:
        return [s for s in self.steps if s.status in ("failed", "not_restorable")]


class Summary(BaseModel):
    """Net effect of the recorded (not reverted) changes, per path."""

    model_config = ConfigDict(extra="forbid")

    created: list[str]
    modified: list[str]
    deleted: list[str]
    renamed: list[tuple[str, str]]
    not_restorable: list[str]

    def shown(self) -> Summary:
        """As :meth:`Entry.shown`: paths that are not plain text quoted."""
        q = quote_path
        return Summary(
            created=[q(p) for p in self.created],
            modified=[q(p) for p in self.modified],
            deleted=[q(p) for p in self.deleted],
            renamed=[(q(a), q(b)) for a, b in self.renamed],
            not_restorable=[q(p) for p in self.not_restorable],
        )


class Limits(BaseModel):
    """What the shell-change baseline keeps. Outside these, changes are still recorded,
    as ``restorable=False`` entries with a note, never dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: A file larger than this has no before-image (the agent reads at most 16 MiB at once).
    max_file_bytes: int = 16 << 20
    #: Total content kept in the baseline; files beyond it are tracked by stat only.
    max_total_bytes: int = 1 << 30
    #: Files walked by a scan; a larger workspace is reported as truncated.
    max_files: int = 200_000
    #: See :data:`Durability`. "process" removes both fsyncs from every recorded write
    #: (about 1 ms each on an SSD, far more on a busy disk) and keeps every guarantee
    #: except surviving a power loss: record-before-write, whole-old-or-whole-new files.
    durability: Durability = "full"
    #: Free bytes the data directory must have before a command or write starts (the
    #: room to record what it changes); below it the call is refused as a limit, the
    #: workspace untouched. 0 turns the check off.
    reserve_bytes: int = Field(64 << 20, ge=0)
    #: Directory names whose files are tracked by stat only: what a command makes there
    #: is recorded (one entry per tree, or per such directory and command) and undone by
    #: removing it; a file that was there before and changes cannot be restored. ``.git``
    #: is not among them: its object store alone is stat-only (objects are only ever
    #: added), its small files (HEAD, refs, index, config, logs) keep their content.
    ignored_dirs: tuple[str, ...] = (
        "node_modules",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
    )


def size_text(n: int) -> str:
    """``n`` bytes, readably (``45 bytes``, ``1.5 KiB``, ``20.0 MiB``)."""
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"
