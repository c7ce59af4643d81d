"""``recorded_write``: the ``ChangeRecorder.write`` of the changelog (the protocol and the
crash-safety argument are in :mod:`worker.changelog.recorder`).

Two ways to find the before-image. The general one reads it through the sandbox, beside
a ``stat`` that canonicalizes the path. The fast one serves the common edit: the caller
read the file and passes its hash, and that content is already stored (the previous
entry's after-image), so the entry is recorded while the path is checked, and the
agent's write, conditional on exactly that hash, makes the before-image true or writes
nothing.
"""

from __future__ import annotations

import asyncio

from sandbox.base import Sandbox, WriteResult
from sandbox.errors import ConflictError, NotAFileError

from .errors import ChangelogStorageError
from .paths import canonical
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
) -> WriteResult:
    """The ``ChangeRecorder.write`` implementation (see the module docstring for the order).

    Raises the sandbox's errors unchanged (ConflictError when the caller's precondition
    does not hold, NotAFileError, PathEscapeError, ...), ChangelogStorageError.
    """
    async with core.lock:
        if expect_sha256 is not None and not expect_absent:
            result = await _write_known_before(
                core, sandbox, path, data, expect_sha256, tool=tool, call_id=call_id, subtask_id=subtask_id
            )
            if result is not None:
                return result
        # Two independent round trips at once (the agent serves requests concurrently).
        # Entries a crashed writer left pending are settled by ``change`` when it finds any.
        canon, first = await asyncio.gather(
            canonical(sandbox, path), core.current(sandbox, path), return_exceptions=True
        )
        if isinstance(canon, BaseException):
            raise canon
        rel, st = canon
        if st is not None and st.type == "dir":
            raise NotAFileError(f"Not a file: {path} is a directory", code="not_a_file")
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
        _, result = await core.change(
            sandbox,
            rel,
            data,
            cur,
            expect_sha256=cur.sha,
            expect_absent=cur.kind is None,
            tool=tool,
            call_id=call_id,
            subtask_id=subtask_id,
            origin="tool",
        )
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
) -> WriteResult | None:
    """The fast path of an edit: the caller read the file (``expect_sha256``) and that
    content is already stored (typically the previous entry's after-image), so there is
    no before-image to read. The entry is recorded *while* the path is checked, and the
    agent's write is conditional on exactly ``expect_sha256``, so the entry's before-image
    is what the write replaces, or nothing is written.

    Returns None, with nothing recorded, when the path is not canonical, not a regular
    file, the content is not stored or entries are pending: the general path then takes
    over. Caller holds the lock. Raises like ``recorded_write``.
    """
    guess = Current("file", expect_sha256, None)
    fields, blobs, after = core.entry(
        path, data, guess, tool=tool, call_id=call_id, subtask_id=subtask_id, origin="tool", before_stored=True
    )
    canon, entry_id = await asyncio.gather(
        canonical(sandbox, path),
        core.db(core._begin_tx, fields, blobs, settled=False, require_blob=expect_sha256),
        return_exceptions=True,
    )
    if isinstance(entry_id, BaseException):
        raise entry_id
    if entry_id is None:
        return None
    if isinstance(canon, BaseException) or canon[0] != path or canon[1] is None or canon[1].type != "file":
        await core.db(core._drop_tx, entry_id)  # never attempted: the general path decides
        if isinstance(canon, BaseException):
            raise canon
        return None
    result = await core.apply(
        sandbox,
        entry_id,
        path,
        data,
        after,
        expect_sha256=expect_sha256,
        expect_absent=False,
        reverts=None,
        mode=canon[1].mode,
        drop_on_conflict=True,
    )
    assert result is not None
    return result
