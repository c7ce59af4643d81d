"""Undo: revert entries in reverse order, through the sandbox, recording each revert.

The whole request is planned first against the files' current state (lstat + hash through
the sandbox), simulating each revert in order; if any file changed since its entry the
request is refused, with the list of conflicts, before anything is written (``force``
overrides). Each revert is then an ordinary recorded change whose agent write carries the
precondition "content is still what the plan saw", so nothing that changes underneath is
overwritten silently. Undo entries (``origin='undo'``) are never picked by call, subtask,
``to`` or ``all`` (reverting twice is a no-op); naming one by ``entry`` id is a redo.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from sandbox.base import FileStat, Sandbox, TreeRemoval
from sandbox.errors import AgentError, ConflictError, NotADirError, PathNotFoundError

from ..quoting import quote_path
from .diff import Content, read_now, unified
from .errors import EntryNotFoundError, UndoConflictError, UndoRefusedError
from .finish import finish_in
from .madedirs import State, children, kept_dirs, made_dir, why_kept
from .model import Entry, UndoResult, UndoStep
from .paths import inside as _inside
from .paths import is_safe_relpath
from .recorder import ChangelogCore, Current
from .shellrows import symlink_digest

_MAX_ID = (1 << 63) - 1


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
    return (e.after_kind, e.after_hash if e.after_kind in ("file", "symlink") else None)


def _before(e: Entry) -> State:
    return (e.before_kind, e.before_hash if e.before_kind in ("file", "symlink") else None)


async def _states(sandbox: Sandbox, paths: list[str]) -> dict[str, State]:
    out: dict[str, State] = {}
    files = []
    for p in paths:
        try:
            st = await sandbox.stat(p)
        except (PathNotFoundError, NotADirError):  # (a parent that is a file: no such path)
            out[p] = (None, None)
            continue
        except AgentError:
            out[p] = ("unreachable", None)
            continue
        kind = st.type if st.type in ("file", "symlink", "dir") else "other"
        out[p] = (kind, symlink_digest(st.target) if kind == "symlink" and st.target is not None else None)
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
    if kind == "file" and sha:
        return f"a file with sha256 {sha[:12]}"
    return f"a {kind}"


def _removes(e: Entry, members: dict[int, list[tuple[str, str]]]) -> list[str]:
    """The paths undoing ``e`` removes with everything in them (a creation), else [] (a
    directory made is removed only when empty: :func:`.madedirs.made_dir`)."""
    if e.op != "create" or not e.restorable or made_dir(e):
        return []
    if e.is_group:
        return [p for p, _t in members.get(e.id, [])]
    return [e.path] if e.before_kind is None else []


def _covered_by(e: Entry, members: dict[int, list[tuple[str, str]]], plan: list[tuple[int, list[str]]]) -> int | None:
    """The older entry of this undo whose removal takes every path of the not-restorable
    entry ``e`` with it (a file made by one command and rewritten by a later one needs no
    before-image when the undo removes it anyway), or None."""
    paths = [p for p, _t in members[e.id]] if e.is_group else [e.path]
    by = None
    for p in paths:
        hit = next((cid for cid, roots in plan if cid < e.id and any(_inside(p, r) for r in roots)), None)
        if hit is None:
            return None
        by = hit if by is None else max(by, hit)
    return by


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
    live = [e for e in targets if e.state == "applied" and not e.reverted]
    members = {e.id: await core.db(core.store.members, e.id) for e in live if e.is_group}
    for e in targets:
        inner = [p for p, _t in members.get(e.id, [])]
        if (
            not is_safe_relpath(e.path)
            or (e.new_path is not None and not is_safe_relpath(e.new_path))
            or any(not is_safe_relpath(p) or not _inside(p, e.path) for p in inner)
        ):
            raise UndoRefusedError(
                f"entry {e.id} names a path outside the workspace ({e.path!r}); "
                "the changelog was tampered with, refusing to undo"
            )
    removals = [(e.id, r) for e in live if (r := _removes(e, members))]
    paths = sorted({p for e in live if not e.is_group for p in (e.path, e.new_path) if p})
    initial = await _states(sandbox, paths)
    state = dict(initial)
    steps: list[UndoStep] = []
    plan: list[Entry] = []
    covered: list[tuple[Entry, int]] = []
    conflicts: list[str] = []
    for e in targets:
        if e.state != "applied" or e.reverted:
            why = "already reverted" if e.reverted else f"entry is {e.state}; nothing to revert"
            steps.append(UndoStep(entry_id=e.id, path=e.path, action="skip", status="already_reverted", message=why))
            continue
        if not e.restorable or (e.op != "create" and e.before_kind == "file" and e.before_hash is None):
            by = _covered_by(e, members, removals)
            if by is not None:
                covered.append((e, by))
                continue
            lost = [p for p, _t in members[e.id]] if e.is_group else []
            steps.append(
                UndoStep(
                    entry_id=e.id,
                    path=e.path,
                    action="skip",
                    status="not_restorable",
                    message=e.note or "before-image not kept",
                    paths=lost,
                )
            )
            continue
        if e.is_group:
            plan.append(e)  # its members are removed, whatever they hold now
            continue
        if e.op == "rename" and e.new_path:
            want = {e.path: (None, None), e.new_path: _expected_after(e)}
            after = {e.path: _before(e), e.new_path: (None, None)}
        else:
            want = {e.path: _expected_after(e)}
            after = {e.path: _before(e)}
        for p, w in want.items():
            if state[p] != w:
                # quoted: the list reaches the HTTP API and the dashboard (a name may hold a newline)
                conflicts.append(
                    f"{quote_path(p)}: entry {e.id} left it {_describe(w)}, it is now {_describe(state[p])}"
                )
        state.update(after)
        plan.append(e)
    if conflicts and not force:
        raise UndoConflictError(
            "refusing to undo: " + str(len(conflicts)) + " file(s) changed since the change was recorded "
            "(use force to overwrite):\n  " + "\n  ".join(conflicts),
            conflicts,
        )
    diff = await _net_diff(core, sandbox, initial, state)
    done = "would_revert" if dry_run else "reverted"
    for e, by in covered:
        if not dry_run:
            await core.db(_mark, core, e.id)
        why = f"no before-image, but undoing entry {by} removes what it changed"
        steps.append(UndoStep(entry_id=e.id, path=e.path, action="skip", status=done, message=why))
    if dry_run:
        kept = await kept_dirs(core, sandbox, plan, state, removals)
        steps += [
            UndoStep(entry_id=e.id, path=e.path, action="remove", status="kept", message=kept[e.id])
            if e.id in kept
            else UndoStep(entry_id=e.id, path=e.path, action=_action(e), status="would_revert", message=_preview(e))
            for e in plan
        ]
        return UndoResult(dry_run=True, steps=sorted(steps, key=lambda s: -s.entry_id), diff=diff)
    for e in plan:
        steps.append(await _revert(core, sandbox, e, members.get(e.id, []), force=force, undo_call_id=undo_call_id))
    return UndoResult(dry_run=False, steps=sorted(steps, key=lambda s: -s.entry_id), diff=diff)


def _action(e: Entry) -> Literal["restore", "remove", "rename_back"]:
    if e.op == "rename":
        return "rename_back"
    return "remove" if e.op == "create" else "restore"


def _preview(e: Entry) -> str | None:
    """What a dry run says of a step that removes more than one path."""
    if e.is_group:
        return f"removes what entry {e.id} made under {e.path}: {e.note or ''}".rstrip(": ")
    if e.is_tree:
        return f"removes directory {e.path} with everything still in it"
    return None


async def _content(core: ChangelogCore, sandbox: Sandbox, path: str, st: State, *, now: bool) -> Content:
    kind, sha = st
    if kind is None:
        return None
    if kind == "symlink" and sha:
        target = await core.db(core.store.get_blob, sha)
        return f"(symlink -> {target.decode('utf-8', 'surrogateescape')})" if target is not None else "(symlink)"
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


def _content_only(e: Entry) -> bool:
    """A change between file contents (or a file and nothing), same permission bits: the
    recorded-write path (``ChangelogCore.change``) reverts it."""
    if e.before_kind not in ("file", None) or e.after_kind not in ("file", None):
        return False
    if e.op == "modify" and e.before_hash == e.after_hash:
        return False  # a chmod
    return not (e.op == "modify" and e.before_mode and e.after_mode and e.before_mode != e.after_mode)


async def _revert(
    core: ChangelogCore,
    sandbox: Sandbox,
    e: Entry,
    members: list[tuple[str, str]],
    *,
    force: bool,
    undo_call_id: str | None,
) -> UndoStep:
    action = _action(e)
    if e.is_group:
        return await _revert_group(core, sandbox, e, members, undo_call_id=undo_call_id)
    if e.op != "rename" and not _content_only(e):
        return await _revert_path(core, sandbox, e, undo_call_id=undo_call_id)
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


async def _record(core: ChangelogCore, fields: dict[str, Any], blobs: list[tuple[str, bytes]]) -> int:
    uid = await core.db(core._begin_tx, fields, blobs, settled=True)
    assert uid is not None
    return uid


def _undo_fields(e: Entry, undo_call_id: str | None, **kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": time.time(),
        "call_id": undo_call_id,
        "subtask_id": None,
        "tool": "undo",
        "path": e.path,
        "before_hash": None,
        "after_hash": None,
        "before_kind": None,
        "after_kind": None,
        "before_mode": None,
        "after_mode": None,
        "state": "pending",
        "origin": "undo",
        "restorable": 1,
        "note": f"undo of entry {e.id}",
        "reverts": e.id,
    }
    fields.update(kw)
    return fields


async def _revert_path(core: ChangelogCore, sandbox: Sandbox, e: Entry, *, undo_call_id: str | None) -> UndoStep:
    """Put ``e.path`` back as it was before ``e`` when more than a file's content is
    involved: a directory made (removed with everything in it) or removed (made again,
    with its mode; the undo of its files' deletions fills it), a symlink made, removed or
    retargeted, a change of kind (a file that became a link or a directory...), or
    permission bits. Recorded before it is done, like a write."""
    action = _action(e)
    path = e.path
    try:
        try:
            st: FileStat | None = await sandbox.stat(path)
        except PathNotFoundError:
            st = None
        now = None if st is None else (st.type if st.type in ("file", "symlink", "dir") else "other")
        if now is None and e.before_kind is None:
            # Already absent (forced past a conflict): nothing to remove, mark it reverted.
            await core.db(_mark, core, e.id)
            return UndoStep(entry_id=e.id, path=path, action=action, status="reverted")
        if now == e.before_kind == e.after_kind and e.before_hash == e.after_hash:
            return await _revert_mode(core, sandbox, e, st, undo_call_id=undo_call_id)
        if made_dir(e) and now == "dir" and st is not None:
            return await _revertmade_dir(core, sandbox, e, st, undo_call_id=undo_call_id)
        target = None
        if e.before_kind == "symlink":
            blob = await core.db(core.store.get_blob, e.before_hash) if e.before_hash else None
            if blob is None:
                raise UndoRefusedError(f"entry {e.id}: the link's target was not kept")
            target = blob.decode("utf-8", "surrogateescape")
        data = None
        if e.before_kind == "file":
            data = await core.db(core.store.get_blob, e.before_hash) if e.before_hash else None
            if data is None:
                raise UndoRefusedError(f"entry {e.id}: before-image is missing or corrupt")
        cur_hash = None
        if now == "symlink" and st is not None and st.target is not None:
            cur_hash = symlink_digest(st.target)
        elif now == "file":
            cur_hash = (await sandbox.hash([path])).get(path)
        fields = _undo_fields(
            e,
            undo_call_id,
            op="create" if now is None else ("delete" if e.before_kind is None else "modify"),
            before_kind=now,
            before_hash=cur_hash,
            before_mode=st.mode if st is not None else None,
            after_kind=e.before_kind,
            after_hash=e.before_hash,
            after_mode=e.before_mode,
        )
        uid = await _record(core, fields, [])
    except (AgentError, UndoRefusedError) as err:
        return UndoStep(entry_id=e.id, path=path, action=action, status="failed", message=str(err))
    removed = None
    try:
        if now is not None and not (now == "dir" == e.before_kind):
            removed = await sandbox.remove_tree(path)
        if e.before_kind == "dir":
            if now != "dir":
                await sandbox.mkdir(path, mode=e.before_mode)
            elif e.before_mode:
                await sandbox.chmod(path, e.before_mode & 0o7777)
        elif e.before_kind == "symlink" and target is not None:
            await sandbox.symlink(path, target)
        elif e.before_kind == "file" and data is not None:
            await sandbox.write(
                path,
                data,
                expect_absent=True,
                fsync=core.fsync,
                mode=None if e.before_mode is None else e.before_mode & 0o7777,
            )
    except AgentError as err:
        await core.db(core._finish_tx, uid, "failed", None, None)
        return UndoStep(entry_id=e.id, path=path, action=action, status="failed", message=str(err))
    await core.db(_path_done, core, uid, e, removed)
    message = None
    if removed is not None and removed.files + removed.dirs > 1:
        message = f"removed {path} with {removed.files} file(s) and {max(removed.dirs - 1, 0)} directories in it"
    return UndoStep(entry_id=e.id, path=path, action=action, status="reverted", undo_entry_id=uid, message=message)


async def _revertmade_dir(
    core: ChangelogCore, sandbox: Sandbox, e: Entry, st: FileStat, *, undo_call_id: str | None
) -> UndoStep:
    """Undo the making of a directory: removed when empty (what this undo reverted before
    it, newest first, is gone by now), kept otherwise, with the reason. Recorded before
    it is done; the record is dropped when the directory stays."""
    fields = _undo_fields(e, undo_call_id, op="delete", before_kind="dir", before_mode=st.mode)
    uid = await _record(core, fields, [])
    try:
        await sandbox.remove(e.path)
    except ConflictError:  # not empty
        await core.db(core._drop_tx, uid)
        try:
            why = await why_kept(core, e, await children(sandbox, e.path))
        except AgentError:
            why = f"kept {quote_path(e.path)}/: not empty"
        return UndoStep(entry_id=e.id, path=e.path, action="remove", status="kept", message=why)
    except AgentError as err:
        await core.db(core._finish_tx, uid, "failed", None, None)
        return UndoStep(entry_id=e.id, path=e.path, action="remove", status="failed", message=str(err))
    await core.db(_path_done, core, uid, e, None)
    return UndoStep(entry_id=e.id, path=e.path, action="remove", status="reverted", undo_entry_id=uid)


async def _revert_mode(
    core: ChangelogCore, sandbox: Sandbox, e: Entry, st: FileStat | None, *, undo_call_id: str | None
) -> UndoStep:
    """Undo a ``chmod``: the permission bits as they were."""
    if st is None or not e.before_mode:
        return UndoStep(entry_id=e.id, path=e.path, action="restore", status="failed", message="mode not recorded")
    fields = _undo_fields(
        e,
        undo_call_id,
        op="modify",
        before_kind=e.after_kind,
        after_kind=e.before_kind,
        before_hash=e.after_hash,
        after_hash=e.before_hash,
        before_mode=st.mode,
        after_mode=e.before_mode,
    )
    uid = await _record(core, fields, [])
    try:
        await sandbox.chmod(e.path, e.before_mode & 0o7777)
    except AgentError as err:
        await core.db(core._finish_tx, uid, "failed", None, None)
        return UndoStep(entry_id=e.id, path=e.path, action="restore", status="failed", message=str(err))
    await core.db(_path_done, core, uid, e, None)
    return UndoStep(entry_id=e.id, path=e.path, action="restore", status="reverted", undo_entry_id=uid)


async def _revert_group(
    core: ChangelogCore, sandbox: Sandbox, e: Entry, members: list[tuple[str, str]], *, undo_call_id: str | None
) -> UndoStep:
    """Undo what one command made under a stat-only directory: each of its topmost new
    paths goes, with everything in it (later calls' files included)."""
    fields = _undo_fields(
        e,
        undo_call_id,
        op="modify",
        before_kind="dir",
        after_kind="dir",
        restorable=0,
        tree_files=e.tree_files,
        tree_bytes=e.tree_bytes,
        note=f"undo of entry {e.id}: removed what it made under {e.path} (not kept, cannot be redone)",
    )
    uid = await _record(core, fields, [])
    files = dirs = 0
    try:
        for p, _t in members:
            r = await sandbox.remove_tree(p)
            files, dirs = files + r.files, dirs + r.dirs
            await core.db(_forget_tree, core, p)
    except AgentError as err:
        await core.db(core._finish_tx, uid, "failed", None, None)
        return UndoStep(entry_id=e.id, path=e.path, action="remove", status="failed", message=str(err))
    await core.db(core._finish_tx, uid, "applied", None, e.id)
    msg = f"removed {files} file(s) and {dirs} director{'y' if dirs == 1 else 'ies'} made under {e.path}"
    return UndoStep(entry_id=e.id, path=e.path, action="remove", status="reverted", undo_entry_id=uid, message=msg)


def _forget_tree(core: ChangelogCore, path: str) -> None:
    with core.store.tx(durable=False) as db:
        _forget_in(db, path)


def _forget_in(db: Any, path: str) -> None:
    """Drop ``path`` and everything under it from the shell baseline ('/' sorts just
    before '0', so the range is exactly the paths that start with ``path/``)."""
    db.execute("DELETE FROM baseline WHERE path = ? OR (path >= ? AND path < ?)", (path, path + "/", path + "0"))


def _path_done(core: ChangelogCore, uid: int, e: Entry, removed: TreeRemoval | None) -> None:
    """Step 5 of :func:`_revert_path`: the entry applied, the baseline in step. The stat
    is left unknown (-1, mode 0) so the next scan re-reads the path and only refreshes it."""
    with core.store.tx(durable=False) as db:
        finish_in(db, uid, "applied", None, e.id)
        if removed is not None:
            db.execute(
                "UPDATE entries SET tree_files = ?, tree_bytes = ? WHERE id = ?", (removed.files, removed.bytes, uid)
            )
        if e.before_kind is None or removed is not None:
            _forget_in(db, e.path)
        if e.before_kind is None:
            return
        if e.before_kind == "file":
            kept = db.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (e.before_hash,)).fetchone() is not None
            status, target = ("ok" if kept else "too_large"), None
        elif e.before_kind == "symlink":
            blob = db.execute("SELECT data FROM blobs WHERE sha256 = ?", (e.before_hash,)).fetchone()
            status, target = "symlink", bytes(blob[0]).decode("utf-8", "surrogateescape") if blob else None
        else:
            status, target = "dir", None
        db.execute(
            "INSERT OR REPLACE INTO baseline(path, type, size, mtime_ns, ino, mode, sha256, target, status, "
            "racy) VALUES (?, ?, -1, -1, 0, 0, ?, ?, ?, 0)",
            (e.path, e.before_kind, e.before_hash if e.before_kind != "dir" else None, target, status),
        )


def _mark(core: ChangelogCore, entry_id: int) -> None:
    with core.store.tx() as db:
        db.execute("UPDATE entries SET reverted_by = ? WHERE id = ?", (entry_id, entry_id))
