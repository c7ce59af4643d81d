"""A gVisor warm sandbox's claim (sandbox.docker.slots.move_into_place): its slot's
directory takes an empty workspace's place atomically, keeping its owner and mode, and
the claim record names it by inode; anything else is declined with the slot as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.docker import slots


def _slot(root: Path) -> tuple[Path, dict[str, str]]:
    slot = root / "0123456789abcdef"
    root.mkdir(parents=True, exist_ok=True)
    os.close(slots.make(slot, 1000, 1000))
    return slot, {slots.LABEL_SLOT: str(slot)}


def test_an_empty_workspace_is_replaced_by_the_slots_directory(tmp_path: Path) -> None:
    slot, labels = _slot(tmp_path / "pool-runsc")
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o750)
    os.chown(ws, 1234, 1235)
    served = os.stat(slot / "ws").st_ino
    assert slots.is_empty_dir(ws)
    slots.move_into_place(slot, ws)
    st = ws.stat()
    assert st.st_ino == served and not (slot / "ws").exists()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 1235, 0o750)
    assert slots.workspace_of(labels) == str(ws)
    # Another directory at the workspace's path later: the record matches nothing.
    ws.rename(tmp_path / "moved-away")
    ws.mkdir()
    assert slots.workspace_of(labels) is None
    # Released: the slot goes, the workspace (where the slot's directory now is) stays.
    (tmp_path / "moved-away" / "kept.txt").write_text("k")
    slots.release(labels)
    assert not slot.exists() and (tmp_path / "moved-away" / "kept.txt").exists()


def test_a_record_written_before_a_crash_matches_nothing(tmp_path: Path) -> None:
    slot, labels = _slot(tmp_path / "pool-runsc")
    ws = tmp_path / "ws"
    ws.mkdir()
    inode = os.stat(slot / "ws")
    (slot / slots.CLAIM_FILE).write_text(f"{ws}\n{inode.st_dev}:{inode.st_ino}\n")  # the rename never ran
    assert slots.workspace_of(labels) is None


def test_a_workspace_with_anything_in_it_is_declined_and_the_slot_kept(tmp_path: Path) -> None:
    slot, labels = _slot(tmp_path / "pool-runsc")
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o700)
    (ws / ".git").mkdir()
    assert not slots.is_empty_dir(ws)
    with pytest.raises(slots.Declined, match="cannot be replaced"):
        slots.move_into_place(slot, ws)
    st = os.stat(slot / "ws")
    assert (st.st_uid, st.st_mode & 0o7777) == (1000, 0o755)  # as it was made
    assert not (slot / slots.CLAIM_FILE).exists() and slots.workspace_of(labels) is None
    assert (ws / ".git").is_dir()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(slots.Declined, match="not a directory"):
        slots.move_into_place(slot, not_a_dir)
    with pytest.raises(slots.Declined, match="cannot be looked at"):
        slots.move_into_place(slot, tmp_path / "missing")


def _other_filesystem() -> Path | None:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.stat(shm).st_dev != os.stat("/tmp").st_dev:
        return shm
    return None


def test_a_workspace_on_another_filesystem_is_declined(tmp_path: Path) -> None:
    other = _other_filesystem()
    if other is None:
        pytest.skip("no second filesystem (/dev/shm) on this host")
    slot, _labels = _slot(tmp_path / "pool-runsc")
    ws = Path(subprocess.check_output(["mktemp", "-d", "-p", str(other)], text=True).strip())
    try:
        with pytest.raises(slots.Declined, match="cross-device"):
            slots.move_into_place(slot, ws)
        assert (slot / "ws").is_dir() and ws.is_dir()
    finally:
        ws.rmdir()


def test_a_workspace_a_peer_already_moved_its_slot_to_is_declined(tmp_path: Path) -> None:
    """Two processes claiming one new workspace: the second finds it empty, but it is the
    first's sandbox's directory now; replacing it would leave that sandbox serving a
    directory outside the workspace."""
    root = tmp_path / "pool-runsc"
    first, first_labels = _slot(root)
    second = root / "fedcba9876543210"
    os.close(slots.make(second, 1000, 1000))
    ws = tmp_path / "ws"
    ws.mkdir()
    slots.move_into_place(first, ws)
    served = ws.stat().st_ino
    with pytest.raises(slots.Declined, match="already another warm sandbox"):
        slots.move_into_place(second, ws)
    assert ws.stat().st_ino == served and slots.workspace_of(first_labels) == str(ws)
    assert (second / "ws").is_dir() and not (second / slots.CLAIM_FILE).exists()


class _Container:
    def __init__(self, labels: dict[str, str], mounts: list[dict[str, str]]) -> None:
        self.labels = labels
        self.attrs = {"Mounts": mounts}


def test_a_removed_slots_channel_directory_goes_and_a_workspaces_own_stays(tmp_path: Path) -> None:
    from sandbox.identity import workspace_key
    from sandbox.spec import CHANNEL_MOUNT

    channels = tmp_path / "channels"
    theirs = channels / workspace_key(tmp_path / "a-workspace")
    theirs.mkdir(parents=True)
    mount = {"Type": "bind", "Destination": CHANNEL_MOUNT}
    # A container whose channel mount is a workspace's own: never the pool's to remove.
    slot, labels = _slot(tmp_path / "pool")
    slots.release_container(_Container(dict(labels), [{**mount, "Source": str(theirs)}]))
    assert theirs.is_dir() and not slot.exists()
    # The slot's own (every _slot here has the same name, so the same key): removed when
    # empty, left alone otherwise.
    slot, labels = _slot(tmp_path / "pool")
    own = channels / workspace_key(slot / "ws")
    own.mkdir()
    (own / "left.sock").write_text("")
    slots.release_container(_Container(dict(labels), [{**mount, "Source": str(own)}]))
    assert own.is_dir() and not slot.exists()
    (own / "left.sock").unlink()
    slot, labels = _slot(tmp_path / "pool")
    slots.release_container(_Container(dict(labels), [{**mount, "Source": str(own)}]))
    assert not own.exists() and not slot.exists() and theirs.is_dir()


def test_a_slot_is_orphaned_only_once_the_process_holding_it_is_gone(tmp_path: Path) -> None:
    """A frozen warm sandbox cannot see its worker end; the worker's hold on its slot
    (an flock, released by the kernel when the process dies, kill -9 included) tells a
    later worker. Held here or by a live process: not orphaned."""
    root = tmp_path / "pool-runsc"
    root.mkdir()
    slot = root / "0123456789abcdef"
    fd = slots.make(slot, 1000, 1000)
    assert not slots.orphaned(slot)  # (another open of the lock, in this same process)
    os.close(fd)
    assert slots.orphaned(slot)
    # Held by another process, then that process killed.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from sandbox.docker import slots; from pathlib import Path;"
            "slots.hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
            str(slot),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert not slots.orphaned(slot)
        with pytest.raises(OSError):
            slots.hold(slot)  # (one holder at a time)
    finally:
        holder.kill()
        holder.wait()
    assert slots.orphaned(slot)
    # A slot of an earlier version has no lock file: it cannot be told, so never taken.
    (slot / slots.OWNER_LOCK).unlink()
    assert not slots.orphaned(slot)
    # Released: the lock file goes with the slot.
    fd = slots.hold(slot)
    slots.release({slots.LABEL_SLOT: str(slot)})
    os.close(fd)
    assert not slot.exists()
