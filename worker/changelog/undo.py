"""Undo: revert entries in reverse order, through the sandbox, recording each revert.

The whole request is planned first against the files' current state (lstat + hash through
the sandbox), simulating each revert in order; if any file changed since its entry the
request is refused, with the list of conflicts, before anything is written (``force``
overrides). Each revert is then an ordinary recorded change whose agent write carries the
precondition "content is still what the plan saw", so nothing that changes underneath is
overwritten silently. Undo entries (``origin='undo'``) are never picked by call, subtask,
``to`` or ``all`` selections, which is what makes reverting twice a no-op; naming one by
``entry`` id reverts the undo (a redo).
"""

from __future__ import annotations

from typing import Literal

from sandbox.base import Sandbox
from sandbox.errors import AgentError, PathNotFoundError

from .diff import Content, read_now, unified
from .errors import EntryNotFoundError, UndoConflictError, UndoRefusedError
from .model import Entry, UndoResult, UndoStep
from .paths import is_safe_relpath
from .recorder import ChangelogCore, Current, _finish_in

State = tuple[str | None, str | None]
_MAX_ID = (1 << 63) - 1  # (kind or None when absent, sha256 for files)


def select(
    core: ChangelogCore,
    *,
    entry: int | None,
    call_id: str | None,
    subtask_id: str | None,
    to: int | None,
    everything: bool,
) -> list[Entry]:
    """The entries a request names, newest first (blocking; db thread).

    Raises EntryNotFoundError when nothing matches at all, ValueError when not exactly one
    selector is given.
    """
    given = [x is not None for x in (entry, call_id, subtask_id, to)] + [everything]
    if sum(given) != 1:
        raise ValueError("give exactly one of entry, call_id, subtask_id, to, all")
    # SQLite integers are 64-bit signed: a larger id cannot exist (and would overflow the
    # query); past the top, "after entry N" is simply nothing.
    if entry is not None and not 0 <= entry <= _MAX_ID:
        raise EntryNotFoundError(f"no changelog entry matches id {entry}")
    if to is not None:
        to = max(-1, min(to, _MAX_ID))
    params: list[object]
    if entry is not None:
        where, params = "id = ?", [entry]
    elif call_id is not None:
        where, params = "call_id = ? AND origin != 'undo'", [call_id]
    elif subtask_id is not None:
        where, params = "subtask_id = ? AND origin != 'undo'", [subtask_id]
    elif to is not None:
        where, params = "id > ? AND origin != 'undo'", [to]
    else:
        where, params = "origin != 'undo'", []
    found = core.store.entries(where, params, order="id DESC")
    if not found and (entry is not None or call_id is not None or subtask_id is not None):
        raise EntryNotFoundError(
            "no changelog entry matches "
            + (
                f"id {entry}"
                if entry is not None
                else f"call {call_id}"
                if call_id is not None
                else f"subtask {subtask_id}"
            )
        )
    return found


def _expected_after(e: Entry) -> State:
    return (e.after_kind, e.after_hash if e.after_kind == "file" else None)


def _before(e: Entry) -> State:
    return (e.before_kind, e.before_hash if e.before_kind == "file" else None)


async def _states(sandbox: Sandbox, paths: list[str]) -> dict[str, State]:
    out: dict[str, State] = {}
    files = []
    for p in paths:
        try:
            st = await sandbox.stat(p)
        except PathNotFoundError:
            out[p] = (None, None)
            continue
        except AgentError:
            out[p] = ("unreachable", None)
            continue
        out[p] = (st.type if st.type in ("file", "symlink", "dir") else "other", None)
        if st.type == "file":
            files.append(p)
    if files:
        for p, h in (await sandbox.hash(files)).items():
            out[p] = ("file", h)
    return out


def _describe(state: State) -> str:
    kind, sha = state
    if kind is None:
        return "absent"
    return f"a file with sha256 {sha[:12]}" if kind == "file" and sha else f"a {kind}"


async def undo(
    core: ChangelogCore,
    sandbox: Sandbox,
    targets: list[Entry],
    *,
    dry_run: bool,
    force: bool,
    undo_call_id: str | None,
) -> UndoResult:
    """Revert ``targets`` (newest first). Caller holds the lock and has run recovery.

    Raises UndoRefusedError (tampered path), UndoConflictError (changed files, not forced),
    sandbox infrastructure errors. Per-entry agent refusals are reported as failed steps.
    """
    for e in targets:
        if not is_safe_relpath(e.path) or (e.new_path is not None and not is_safe_relpath(e.new_path)):
            raise UndoRefusedError(
                f"entry {e.id} names a path outside the workspace ({e.path!r}); "
                "the changelog was tampered with, refusing to undo"
            )
    live = [e for e in targets if e.state == "applied" and not e.reverted]
    paths = sorted({p for e in live for p in (e.path, e.new_path) if p})
    initial = await _states(sandbox, paths)
    state = dict(initial)
    steps: list[UndoStep] = []
    plan: list[Entry] = []
    conflicts: list[str] = []
    for e in targets:
        if e.state != "applied" or e.reverted:
            why = "already reverted" if e.reverted else f"entry is {e.state}; nothing to revert"
            steps.append(UndoStep(entry_id=e.id, path=e.path, action="skip", status="already_reverted", message=why))
            continue
        if not e.restorable or (e.op != "create" and e.before_kind == "file" and e.before_hash is None):
            steps.append(
                UndoStep(
                    entry_id=e.id,
                    path=e.path,
                    action="skip",
                    status="not_restorable",
                    message=e.note or "before-image not kept",
                )
            )
            continue
        if e.op == "rename" and e.new_path:
            want = {e.path: (None, None), e.new_path: _expected_after(e)}
            after = {e.path: _before(e), e.new_path: (None, None)}
        else:
            want = {e.path: _expected_after(e)}
            after = {e.path: _before(e)}
        for p, w in want.items():
            if state[p] != w:
                conflicts.append(f"{p}: entry {e.id} left it {_describe(w)}, it is now {_describe(state[p])}")
        state.update(after)
        plan.append(e)
    if conflicts and not force:
        raise UndoConflictError(
            "refusing to undo: " + str(len(conflicts)) + " file(s) changed since the change was recorded "
            "(use force to overwrite):\n  " + "\n  ".join(conflicts),
            conflicts,
        )
    diff = await _net_diff(core, sandbox, initial, state)
    if dry_run:
        steps += [UndoStep(entry_id=e.id, path=e.path, action=_action(e), status="would_revert") for e in plan]
        return UndoResult(dry_run=True, steps=sorted(steps, key=lambda s: -s.entry_id), diff=diff)
    for e in plan:
        steps.append(await _revert(core, sandbox, e, force=force, undo_call_id=undo_call_id))
    return UndoResult(dry_run=False, steps=sorted(steps, key=lambda s: -s.entry_id), diff=diff)


def _action(e: Entry) -> Literal["restore", "remove", "rename_back"]:
    return "rename_back" if e.op == "rename" else ("remove" if e.op == "create" else "restore")


async def _content(core: ChangelogCore, sandbox: Sandbox, path: str, st: State, *, now: bool) -> Content:
    kind, sha = st
    if kind is None:
        return None
    if kind != "file":
        return f"({kind})"
    if sha:
        blob = await core.db(core.store.get_blob, sha)
        if blob is not None:
            return blob
    if now:
        return await read_now(sandbox, path, core.limits.max_file_bytes)
    return "(content not kept)"


async def _net_diff(core: ChangelogCore, sandbox: Sandbox, initial: dict[str, State], final: dict[str, State]) -> str:
    parts = []
    for p in sorted(initial):
        if initial[p] == final[p] or "dir" in (initial[p][0], final[p][0]):
            continue  # directories have no content to show
        old = await _content(core, sandbox, p, initial[p], now=True)
        new = await _content(core, sandbox, p, final[p], now=False)
        parts.append(unified(p, old, new))
    return "".join(parts)


async def _revert(
    core: ChangelogCore, sandbox: Sandbox, e: Entry, *, force: bool, undo_call_id: str | None
) -> UndoStep:
    action = _action(e)
    if "dir" in (e.before_kind, e.after_kind) and e.op in ("create", "delete"):
        return await _revert_dir(core, sandbox, e, undo_call_id=undo_call_id)
    try:
        before = None
        if e.before_kind == "file" and e.before_hash:
            before = await core.db(core.store.get_blob, e.before_hash)
            if before is None:
                raise UndoRefusedError(f"entry {e.id}: before-image {e.before_hash[:12]} is missing or corrupt")
        if e.op == "rename" and e.new_path:
            await core.change(
                sandbox,
                e.path,
                before,
                Current(None),
                expect_sha256=None,
                expect_absent=True,
                note=f"undo of entry {e.id} (rename back)",
                tool="undo",
                call_id=undo_call_id,
                subtask_id=None,
                origin="undo",
                mode=e.before_mode,
            )
            target_path = e.new_path
        else:
            target_path = e.path
        # A symlink or special file is not read (reading would follow the link).
        cur = await core.current(sandbox, target_path) if e.after_kind in ("file", None) else Current(e.after_kind)
        expect = cur.sha if force or cur.kind != "file" else e.after_hash
        data = None if e.op in ("create", "rename") else before
        if data is None and cur.kind is None:
            # Already absent (forced past a conflict): nothing to remove, mark it reverted.
            await core.db(_mark, core, e.id)
            return UndoStep(entry_id=e.id, path=e.path, action=action, status="reverted")
        uid, _ = await core.change(
            sandbox,
            target_path,
            data,
            cur,
            expect_sha256=expect if cur.kind is not None else None,
            expect_absent=cur.kind is None,
            reverts=e.id,
            note=f"undo of entry {e.id}",
            tool="undo",
            call_id=undo_call_id,
            subtask_id=None,
            origin="undo",
            mode=e.before_mode if cur.kind is None else None,
        )
        return UndoStep(entry_id=e.id, path=e.path, action=action, status="reverted", undo_entry_id=uid)
    except (AgentError, UndoRefusedError) as err:
        return UndoStep(entry_id=e.id, path=e.path, action=action, status="failed", message=str(err))


async def _revert_dir(core: ChangelogCore, sandbox: Sandbox, e: Entry, *, undo_call_id: str | None) -> UndoStep:
    """Undo a directory a command made (removed only when empty: whatever is still in it
    was not put there by the changes being undone) or removed (made again, empty; the
    undo of its files' deletions fills it). Recorded before it is done, like a write."""
    make = e.op == "delete"
    action: Literal["restore", "remove"] = "restore" if make else "remove"
    try:
        st = await sandbox.stat(e.path)
        now = st.type
    except PathNotFoundError:
        now = None
    if now is not None and now != "dir":
        why = f"{e.path} is now a {now}; left as it is"
        return UndoStep(entry_id=e.id, path=e.path, action=action, status="failed", message=why)
    if (now == "dir") == make:  # already as the undo would leave it (forced past a conflict)
        await core.db(_mark, core, e.id)
        return UndoStep(entry_id=e.id, path=e.path, action=action, status="reverted")
    fields, _blobs, _after = core.entry(
        e.path,
        None,
        Current(None if make else "dir"),
        tool="undo",
        call_id=undo_call_id,
        subtask_id=None,
        origin="undo",
        reverts=e.id,
        note=f"undo of entry {e.id}",
    )
    fields.update(op="create" if make else "delete", after_kind="dir" if make else None, restorable=1)
    uid = await core.db(core._begin_tx, fields, [], settled=True)
    assert uid is not None
    try:
        if make:
            await sandbox.mkdir(e.path)
        else:
            await sandbox.remove(e.path)  # refused unless empty
    except AgentError as err:
        await core.db(core._finish_tx, uid, "failed", None, None)
        why = str(err)
        if not make and "not empty" in why.lower():
            why = f"directory {e.path} is not empty (it holds files the undone changes did not make); left in place"
        return UndoStep(entry_id=e.id, path=e.path, action=action, status="failed", message=why)
    await core.db(_dir_done, core, uid, e.id, e.path, make)
    return UndoStep(entry_id=e.id, path=e.path, action=action, status="reverted", undo_entry_id=uid)


def _dir_done(core: ChangelogCore, uid: int, reverts: int, path: str, made: bool) -> None:
    """Step 5 of a directory's undo: the entry applied, the baseline in step."""
    with core.store.tx(durable=False) as db:
        _finish_in(db, uid, "applied", None, reverts)
        if made:
            db.execute(
                "INSERT OR IGNORE INTO baseline(path, type, size, mtime_ns, ino, mode, sha256, target, status, "
                "racy) VALUES (?, 'dir', 0, 0, 0, 0, NULL, NULL, 'dir', 0)",
                (path,),
            )
        else:
            db.execute("DELETE FROM baseline WHERE path = ?", (path,))


def _mark(core: ChangelogCore, entry_id: int) -> None:
    with core.store.tx() as db:
        db.execute("UPDATE entries SET reverted_by = ? WHERE id = ?", (entry_id, entry_id))
