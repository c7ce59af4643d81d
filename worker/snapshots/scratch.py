"""``--with-scratch``: the sandbox's own writable places (``/tmp``, ``$HOME``), which vanish
with its container, carried as a tar archive.

Both are tmpfs inside the container, which the engine's ``docker cp`` cannot read (it
copies from the container's root filesystem, not its mounts), so the sandbox's own ``tar``
writes the archive to its stdout, streamed to the host byte for byte; a fork's sandbox
unpacks it from the standard input of a background process. The agent's private
entries (its sockets, its background processes' state, its activity clock) are left out.
The image needs ``tar`` (every Debian-based and busybox image has it).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

from sandbox.base import ExecRequest, Sandbox
from sandbox.capabilities import background
from sandbox.errors import ConflictError
from sandbox.spec import HOME_DIR

from .errors import ScratchError, ScratchLimitError, SnapshotError

#: What the agent keeps in /tmp for itself: never carried to another sandbox.
_PRIVATE = ("./tmp/.loom-*", "./tmp/loom-*")
#: A command's outcomes that are the sandbox's limits, and what each says.
_LIMITS = {
    "timeout": "it took longer than the archive may",
    "output_limit": "the archive is larger than a snapshot may carry",
    "disk_limit": "the sandbox's disk limit",
    "oom": "the sandbox's memory limit",
}
#: What a shell says when no process could start (the pids limit, EAGAIN on fork).
_NO_PROCESS = ("cannot fork", "resource temporarily unavailable", "fork: retry")
#: The sandbox's /tmp and $HOME are tmpfs of 256 and 128 MiB by default.
MAX_BYTES = 1 << 30
_CHUNK = 1 << 20


async def capture(sandbox: Sandbox, timeout: float = 120.0) -> bytes:
    """A tar archive of the sandbox's ``/tmp`` and ``$HOME``. Raises ScratchLimitError when
    the sandbox's limits stop it (its process limit reached: no process could start; the
    timeout; the archive's size), ScratchError when ``tar`` fails otherwise (none in the
    image), SnapshotError when the command ended another way (a signal, the sandbox lost),
    sandbox errors."""
    parts: list[bytes] = []

    def take(stream: str, data: bytes) -> None:
        if stream == "stdout":
            parts.append(data)

    # What is *in* them, not the two directories (their owner and mode are the container's).
    skip = " ".join(f"! -path '{p}'" for p in _PRIVATE)
    result = await sandbox.exec(
        ExecRequest(
            f"cd / && find ./tmp .{HOME_DIR} -mindepth 1 -maxdepth 1 {skip} -print0 | tar --null -T - -cf -",
            timeout=timeout,
            max_output=64 << 10,
            output_limit=MAX_BYTES,
        ),
        on_output=take,
    )
    # GNU tar exits 1 when a file changed while it was read (a program still writing).
    if result.outcome == "exit" and result.exit_code in (0, 1):
        return b"".join(parts)
    err = result.stderr.decode("utf-8", "replace").strip()[-300:]
    what = f"cannot archive the sandbox's /tmp and $HOME ({result.outcome}"
    if result.outcome in _LIMITS:
        raise ScratchLimitError(f"{what}: {_LIMITS[result.outcome]}){': ' + err if err else ''}")
    if result.outcome == "exit" and any(s in err.lower() for s in _NO_PROCESS):
        raise ScratchLimitError(
            f"{what}): the sandbox is at its process limit (no process could start: {err}); end some of its "
            "processes (process_list, process_kill) and try again"
        )
    if result.outcome == "exit":
        raise ScratchError(f"{what}, exit code {result.exit_code}): {err}")
    raise SnapshotError(f"{what}): {err}")


async def unpack(sandbox: Sandbox, archive: bytes, timeout: float = 120.0) -> None:
    """Unpack ``archive`` (from :func:`capture`) over the sandbox's ``/tmp`` and ``$HOME``.
    Raises ScratchLimitError when the sandbox's own limits stop it (its ``/tmp`` or
    ``$HOME`` full, the time an unpack may take), ScratchError when ``tar`` fails otherwise,
    sandbox errors (the tar that could not start: its process limit reached, the sandbox
    lost)."""
    pid = "proc-scratch-" + secrets.token_hex(4)
    procs = background(sandbox)
    await procs.start_process(pid, "tar -C / --no-overwrite-dir -xf -", timeout=timeout)
    try:
        for i in range(0, len(archive), _CHUNK):
            await procs.process_input(pid, archive[i : i + _CHUNK])
        await procs.process_input(pid, b"", eof=True)
    except ConflictError:
        pass  # tar stops reading at the archive's end marker (or on an error: its exit says)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    err = b""
    while True:
        out = await procs.process_output(pid, wait=1.0)
        err += out.stderr
        if not out.info.running:
            break
        if loop.time() > deadline:
            with contextlib.suppress(Exception):
                await procs.process_kill(pid)
            raise unpack_error("timeout", None, "", timeout)
    if out.info.exit_code != 0:
        raise unpack_error(out.info.outcome, out.info.exit_code, err.decode("utf-8", "replace").strip()[-300:], timeout)


#: What tar says when the place it writes to is full (the fork's tmpfs, its size limit).
_FULL = ("no space left on device", "disk quota exceeded")


def unpack_error(outcome: str | None, exit_code: int | None, err: str, timeout: float) -> SnapshotError:
    """The error for a ``tar`` that could not unpack an archive (its process's ``outcome``,
    exit code and what it said): ScratchLimitError when the sandbox's own limits stopped
    it (``timeout`` seconds passed; the fork's ``/tmp`` or ``$HOME`` filled: a fork made
    with smaller scratch limits than its snapshot's sandbox), ScratchError otherwise."""
    what = "cannot unpack the scratch archive into the fork's /tmp and $HOME"
    low = err.lower()
    if outcome == "timeout":
        return ScratchLimitError(f"{what}: it took longer than the {timeout:g} s an unpack may")
    if any(s in low for s in _FULL):
        return ScratchLimitError(f"{what}: they are too small for it (the sandbox's scratch size limits): {err}")
    return ScratchError(f"{what} (tar's exit code {exit_code}): {err}")
