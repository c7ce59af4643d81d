"""The host-side scan of a gVisor sandbox's workspace (sandbox/hostscan.py): metadata
only, never through a link, event-driven between scans."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.hostscan import HostScanner


def _paths(result: dict) -> list[str]:
    return sorted(e[0] for e in result["entries"])


def test_scans_the_workspace_and_nothing_a_link_points_to(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "src").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("s")
    (ws / "src" / "a.py").write_text("a")
    (ws / "to_outside").symlink_to(outside)  # a directory link out of the workspace
    (ws / "src" / "to_secret").symlink_to(outside / "secret")
    os.mkfifo(ws / "fifo")  # listed, never opened
    scanner = HostScanner(ws)
    try:
        first = scanner.scan({"path": ".", "snapshot": "k", "max_files": 1000})
        assert first["full"] and not first["watched"]  # never sent along with a command
        assert _paths(first) == ["fifo", "src", "src/a.py", "src/to_secret", "to_outside"]
        kinds = {e[0]: e[1] for e in first["entries"]}
        assert kinds["to_outside"] == "symlink" and kinds["src/to_secret"] == "symlink"
        assert kinds["src"] == "dir"  # directories are listed (existence only), never entered through a link
        # A directory swapped for a link out of the workspace between scans: not followed.
        (ws / "src" / "a.py").unlink()
        (ws / "src" / "to_secret").unlink()
        (ws / "src").rmdir()
        (ws / "src").symlink_to(outside)
        second = scanner.scan({"path": ".", "snapshot": "k", "max_files": 1000, "since": first["generation"]})
        assert "secret" not in str(second["entries"])
        assert {"src/a.py", "src/to_secret"} <= set(second["removed"])
        assert {e[0]: e[1] for e in second["entries"]}.get("src") == "symlink"
    finally:
        scanner.close()


def test_second_scan_comes_from_events(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for i in range(30):
        d = ws / f"d{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_text("x")
    scanner = HostScanner(ws)
    try:
        first = scanner.scan({"path": ".", "snapshot": "k", "max_files": 1000})
        assert len(first["entries"]) == 33  # 30 files and their 3 directories
        (ws / "d1" / "f1").write_text("changed")
        (ws / "d2" / "new").write_text("n")
        (ws / "d0" / "f0").unlink()
        second = scanner.scan({"path": ".", "snapshot": "k", "max_files": 1000, "since": first["generation"]})
        assert second["from_events"] and not second["full"]
        assert _paths(second) == ["d1/f1", "d2/new"] and second["removed"] == ["d0/f0"]
        # Asking without the right generation gives a full answer again.
        third = scanner.scan({"path": ".", "snapshot": "k", "max_files": 1000, "since": "stale"})
        assert third["full"] and len(third["entries"]) == 33
    finally:
        scanner.close()


def test_host_removal_of_a_tree_never_follows_a_link(tmp_path: Path) -> None:
    """The undo of a tree a command made, run on the host for gVisor: links inside are
    removed as links (what they point to outside is untouched), a path through a link or
    with '..' is refused (the agent answers then)."""
    from sandbox.hostscan import HostScanner

    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "node_modules" / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (outside / "precious.txt").write_text("keep")
    (ws / "node_modules" / "a" / "b" / "f.js").write_text("x" * 10)
    (ws / "node_modules" / "out").symlink_to(outside)
    (ws / "node_modules" / "a" / "ro").mkdir()
    (ws / "node_modules" / "a" / "ro" / "g.js").write_text("y")
    (ws / "node_modules" / "a" / "ro").chmod(0o555)  # as Go's module cache leaves it
    (ws / "via").symlink_to(ws / "node_modules")
    scanner = HostScanner(ws)
    for bad in ("../outside", "", "/etc", "via/a", "node_modules/../x"):
        with pytest.raises(ValueError):
            scanner.remove_tree(bad)
    removed, (files, dirs, size) = scanner.remove_tree("node_modules")
    assert removed and (files, dirs, size) == (3, 4, 11)
    assert not (ws / "node_modules").exists() and (outside / "precious.txt").read_text() == "keep"
    assert scanner.remove_tree("node_modules") == (False, [0, 0, 0])


def test_a_mount_root_is_never_scanned_bare(tmp_path: Path) -> None:
    """A fork's overlay (``mounted``) whose sandbox is stopped is a bare directory: the host
    refuses to scan it or remove from it (the agent answers, starting the sandbox, which has
    the engine mount it), never reporting the empty directory under the mount as the tree."""
    import errno

    ws = tmp_path / "volumes" / "loom-fork-0" / "_data"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_text("under the mount")
    scanner = HostScanner(ws, mounted=True)
    try:
        for call in (
            lambda: scanner.scan({"path": ".", "snapshot": "k", "max_files": 1000}),
            lambda: scanner.remove_tree("d"),
        ):
            with pytest.raises(OSError) as e:
                call()
            assert e.value.errno == errno.ENOTCONN
        assert (ws / "d" / "f").read_text() == "under the mount"
    finally:
        scanner.close()


def test_another_directory_at_the_roots_path_is_scanned_afresh(tmp_path: Path) -> None:
    """A gVisor warm sandbox's directory moved over an empty workspace (sandbox.docker.slots):
    the old directory's watches see nothing of the new one, so they are not asked."""
    ws, other = tmp_path / "ws", tmp_path / "slot-ws"
    ws.mkdir()
    other.mkdir()
    scanner = HostScanner(ws)
    try:
        first = scanner.scan({"path": ".", "snapshot": "k", "max_files": 1000})
        assert first["entries"] == []
        os.rename(other, ws)  # over the empty directory, as the claim does
        (ws / "made").write_text("x")
        second = scanner.scan({"path": ".", "snapshot": "k", "max_files": 1000, "since": first["generation"]})
        assert second["full"] and _paths(second) == ["made"]
    finally:
        scanner.close()


def _req(since: str | None = None, **extra: object) -> dict:
    return {"path": ".", "snapshot": "k", "max_files": 1000, "since": since, **extra}


def test_a_quiet_scan_answers_on_the_spot_and_anything_else_goes_to_the_full_scan(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "a").write_text("a")
    scanner = HostScanner(ws)
    try:
        assert scanner.scan_if_quiet(_req()) is None  # no snapshot yet
        gen = scanner.scan(_req())["generation"]
        assert scanner.scan_if_quiet(_req("another generation")) is None
        assert scanner.scan_if_quiet(_req(gen, walk=True)) is None  # a walk is asked for
        quiet = scanner.scan_if_quiet(_req(gen))
        assert quiet is not None
        assert quiet["entries"] == [] and quiet["removed"] == [] and quiet["from_events"]
        assert not quiet["watched"] and quiet["generation"] != gen  # the next one starts from here
        gen = quiet["generation"]
        # Anything queued: not quiet, and the full scan (in a thread) reports it.
        (ws / "d" / "a").write_text("changed")
        (ws / "d" / "b").write_text("b")
        assert scanner.scan_if_quiet(_req(gen)) is None
        after = scanner.scan(_req(gen))
        assert _paths(after) == ["d/a", "d/b"]
        gen = after["generation"]
        assert scanner.scan_if_quiet(_req(gen)) is not None
    finally:
        scanner.close()


def test_a_quiet_scan_never_waits_for_another(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    scanner = HostScanner(ws)
    try:
        gen = scanner.scan(_req())["generation"]
        with scanner._lock:  # a scan under way in a thread
            assert scanner.scan_if_quiet(_req(gen)) is None
        assert scanner.scan_if_quiet(_req(gen)) is not None
    finally:
        scanner.close()


def test_many_hard_links_or_another_root_are_left_to_the_full_scan(tmp_path: Path) -> None:
    from sandbox.hostscan import QUIET_MULTI_MAX

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("x")
    for i in range(QUIET_MULTI_MAX + 1):
        os.link(ws / "f", ws / f"link{i}")  # each re-stat'ed at every scan
    scanner = HostScanner(ws)
    try:
        gen = scanner.scan(_req())["generation"]
        assert scanner.scan_if_quiet(_req(gen)) is None
        for i in range(QUIET_MULTI_MAX + 1):
            (ws / f"link{i}").unlink()
        gen = scanner.scan(_req(gen))["generation"]
        assert scanner.scan_if_quiet(_req(gen)) is not None
        # Another directory moved in at the root's path: its watches saw nothing of it.
        ws.rename(tmp_path / "old")
        ws.mkdir()
        (ws / "new").write_text("n")
        assert scanner.scan_if_quiet(_req(gen)) is None
        assert "new" in _paths(scanner.scan(_req(gen)))
    finally:
        scanner.close()


def test_a_quiet_scan_works_with_descriptors_numbered_past_select(tmp_path: Path) -> None:
    # A service with many workspaces open: its inotify descriptors pass 1024 (select's limit).
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    ws = tmp_path / "ws"
    ws.mkdir()
    scanner = HostScanner(ws)
    try:
        gen = scanner.scan(_req())["generation"]
        assert scanner._snapshots["k"].fd > 1024
        assert scanner.scan_if_quiet(_req(gen)) is not None
    finally:
        scanner.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
