"""``recorded_write``: the ``ChangeRecorder.write`` of the changelog (the protocol and the
crash-safety argument are in :mod:`worker.changelog.recorder`).

Two ways to find the before-image. The general one reads it through the sandbox, beside
a ``stat`` that canonicalizes the path. The fast one serves the common edit: the caller
read the file and passes its hash, and that content is already stored (the previous
entry's after-image), so the entry is recorded while the agent stages the new content
(written and fsync'd beside the file, path and hash checked), and the agent then puts it
in place only if the file still has exactly that hash: the before-image is true or
nothing is written. A whole-file write of a file this worker last wrote or read takes the
fast path with that content's hash as a *guess* (not a precondition): when the file no
longer has it, nothing was written and the general path takes over.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from sandbox.base import Sandbox, StagedWrite, WriteResult, staged_writes
from sandbox.errors import AgentError, ConflictError, IsADirError, NotAFileError, PathNotFoundError

from .errors import ChangelogStorageError
from .madedirs import made_entries, settle_made
from .paths import canonical_new
from .recorder import ChangelogCore, Current


async def recorded_write(
    core: ChangelogCore,
    sandbox: Sandbox,
    path: str,
    data: bytes,
    *,
    expect_sha256: str | None,
    expect_absent: bool,
    tool: str,
    call_id: str | None,
    subtask_id: str | None,
    guess_sha256: str | None = None,
) -> WriteResult:
    """The ``ChangeRecorder.write`` implementation (see the module docstring for the order).
    ``guess_sha256``: what the file probably holds (the caller's last sight of it), tried
    first, never required.

    Raises the sandbox's errors unchanged (ConflictError when the caller's precondition
    does not hold, NotAFileError, PathEscapeError, ...), ChangelogStorageError.
    """
    async with core.lock:
        precondition = expect_sha256 is not None and not expect_absent
        known = expect_sha256 if precondition else (None if expect_absent else guess_sha256)
        if known is not None:
            result = await _write_known_before(
                core,
                sandbox,
                path,
                data,
                known,
                tool=tool,
                call_id=call_id,
                subtask_id=subtask_id,
                precondition=precondition,
            )
            if result is not None:
                return result
        # Two independent round trips at once (the agent serves requests concurrently).
        # Entries a crashed writer left pending are settled by ``change`` when it finds any.
        canon, first = await asyncio.gather(
            canonical_new(sandbox, path), core.current(sandbox, path), return_exceptions=True
        )
        if isinstance(canon, BaseException):
            raise canon
        rel, st, dirs = canon
        if st is not None and st.type == "dir":
            raise IsADirError(f"Not a file: {path} is a directory", code="is_a_directory")
        cur = first if rel == path and not isinstance(first, BaseException) else await core.current(sandbox, rel)
        if st is not None:
            cur.mode = st.mode
        if expect_absent and cur.kind is not None:
            raise ConflictError(f"Conflict: {path} already exists", code="conflict")
        if expect_sha256 is not None and cur.sha != expect_sha256:
            what = "changed since it was read" if cur.kind is not None else "no longer exists"
            raise ConflictError(f"Conflict: {path} {what}", code="conflict")
        if cur.kind is not None and cur.sha is None:
            raise ChangelogStorageError(f"cannot record {path}: its content could not be hashed")
        # (``core.change``, with the entries of the directories the write makes in its transaction)
        fields, blobs, after = core.entry(
            rel, data, cur, tool=tool, call_id=call_id, subtask_id=subtask_id, origin="tool"
        )
        made = made_entries(fields, dirs)
        if made:
            fields["_made"] = made
        try:
            _, result = await core._staged_change(
                sandbox, rel, data, fields, blobs, after, cur.sha, cur.kind is None, None
            )
        except BaseException:
            await settle_made(core, sandbox, made, written=False)
            raise
        await settle_made(core, sandbox, made, written=True)
        assert result is not None
        return result


async def _write_known_before(
    core: ChangelogCore,
    sandbox: Sandbox,
    path: str,
    data: bytes,
    expect_sha256: str,
    *,
    tool: str,
    call_id: str | None,
    subtask_id: str | None,
    precondition: bool = True,
) -> WriteResult | None:
    """The fast path of an edit: the caller read the file (``expect_sha256``) and that
    content is already stored (typically the previous entry's after-image), so there is
    no before-image to read. Without ``precondition`` the hash is only a guess: a file
    that no longer holds it is left to the general path (None) instead of a conflict.

    Two things happen at once: the entry is committed (durably) on the database thread,
    and the agent *stages* the new content (temp file written and fsync'd beside the
    target, resolving and checking the path and the expected hash). Only when both are
    done does the agent put the file in place (``commit_write``: hash checked again,
    rename, directory fsync). So the entry is durable before the file changes, as in
    the general path, but its fsync and the file's overlap instead of adding up.

    Returns None, with nothing recorded or written, when the path is not canonical or
    not a regular file, the content is not stored or entries are pending: the general
    path then takes over. Caller holds the lock. Raises like ``recorded_write``.
    """
    guess = Current("file", expect_sha256, None)
    fields, blobs, after = core.entry(
        path, data, guess, tool=tool, call_id=call_id, subtask_id=subtask_id, origin="tool", before_stored=True
    )
    # Our own token, so the commit can follow the entry's commit at once, queued in the
    # agent behind the staging, with no wait for the staging's answer.
    token = secrets.token_hex(8)
    intent = core.stage_intent(path, token)
    try:
        return await _stage_and_commit(
            core, sandbox, path, data, expect_sha256, token, fields, blobs, after, precondition
        )
    finally:
        core.intents.end(intent)


async def _stage_and_commit(
    core: ChangelogCore,
    sandbox: Sandbox,
    path: str,
    data: bytes,
    expect_sha256: str,
    token: str,
    fields: dict[str, Any],
    blobs: list[tuple[str, bytes]],
    after: str | None,
    precondition: bool,
) -> WriteResult | None:
    """``_write_known_before`` once its staging's intent is open."""
    box = staged_writes(sandbox)
    stage = asyncio.ensure_future(
        # The file is there (or the guess is wrong): never make directories on this path,
        # where nothing would record them (the general path does).
        box.stage_write(path, data, expect_sha256=expect_sha256, fsync=core.fsync, token=token, mkdirs=False)
    )
    try:
        # Let the staging request go out before the database thread starts: both need
        # the GIL, so a thread started first waits for the send anyway, and the entry's
        # commit is the longer of the two paths (measured: 0.01-0.05 ms off the p50).
        await asyncio.sleep(0)
        entry_id = await core.db(core._begin_tx, fields, blobs, settled=False, require_blob=expect_sha256)
    except BaseException:
        await _abort(sandbox, stage, token)
        raise
    if entry_id is None:  # not stored, or entries pending: the general path decides
        await _abort(sandbox, stage, token)
        return None
    committed = asyncio.ensure_future(box.commit_write(token, expect_path=path, snapshot=core.snapshot_key))
    staged_err: BaseException | None = None
    try:
        staged = await stage
    except Exception as e:  # refused at staging: the commit then finds nothing staged
        staged_err = e
        staged = None
    try:
        result = await committed
    except ConflictError as e:
        await core.db(core._drop_tx, entry_id)  # refused before anything was written
        if isinstance(staged_err, (NotAFileError, PathNotFoundError)):
            return None
        if not precondition and (staged_err is None or isinstance(staged_err, ConflictError)):
            return None  # the guess was wrong (or the path is a link): the general path decides
        if staged_err is not None:
            raise staged_err from None
        if staged is not None and staged.path != path:
            return None  # not canonical (a link): the general path records the real path
        raise e
    except AgentError:
        await core.db(core._drop_tx, entry_id)  # nothing staged, so nothing written
        if isinstance(staged_err, (NotAFileError, PathNotFoundError)):
            return None  # (its directory is gone: the general path decides)
        if not precondition and isinstance(staged_err, ConflictError):
            return None
        if staged_err is not None:
            raise staged_err from None
        raise
    assert staged is not None
    core._finish_later(entry_id, (path, after, result.stat), None, staged.mode)
    return result


async def _abort(sandbox: Sandbox, stage: asyncio.Future[StagedWrite], token: str) -> None:
    """Drop a staging that will not be committed (waiting for it first, so the abort
    cannot overtake it)."""
    try:
        await stage
    except Exception:
        return  # refused or lost: nothing staged
    await staged_writes(sandbox).abort_write(token)
