"""A spawned process's first output can reach the host in the same chunk as the spawn's
answer, before the spawner has registered its handler; it must not be lost."""

from __future__ import annotations

from pathlib import Path

from sandbox.local import LocalProcessBackend


async def test_output_of_a_quick_process_is_never_lost(local_backend: LocalProcessBackend, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    for i in range(40):
        proc = await box.spawn(["sh", "-c", f"echo out{i}; exit 3"])
        assert await proc.read_line() == f"out{i}\n".encode()
        assert await proc.read_line() == b""
        assert proc.returncode == 3


async def test_early_events_are_bounded(local_backend: LocalProcessBackend, workspace: Path) -> None:
    from sandbox import connection

    box = await local_backend.get(workspace)
    conn = await box.connection()  # type: ignore[attr-defined]
    for n in range(2000):  # events for a process nobody will ever claim
        conn._dispatch(
            b'{"event":"stdout","proc":999999,"data":"' + b"A" * 4096 + b'","k":"' + conn._nonce.encode() + b'"}'
        )
        assert conn._early_bytes <= connection._EARLY_EVENT_BYTES, n
