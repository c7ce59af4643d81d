"""The agent's directory operations anywhere in the sandbox (``fsops``) and its inotify
watch (``fswatch``), run in this process: a "workspace" (the agent's root) and a
directory outside it under one temporary directory."""

from __future__ import annotations

import os
import queue
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox.agent import channel, fsops, fswatch, state
from sandbox.agent.errors import Refused


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    out = tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    monkeypatch.setattr(state, "ROOT", str(ws))
    return ws, out


def refused(code: str, fn: Any, req: dict[str, Any]) -> str:
    with pytest.raises(Refused) as e:
        fn(req)
    assert e.value.code == code, e.value.message
    return e.value.message


def test_stat_and_list_describe_entries_as_envd(dirs: tuple[Path, Path]) -> None:
    _ws, out = dirs
    (out / "d" / "e").mkdir(parents=True)
    (out / "d" / "e" / "deep.txt").write_text("deep")
    (out / "f.txt").write_text("hello")
    os.chmod(out / "f.txt", 0o640)
    (out / "link").symlink_to(out / "d")
    (out / "dangling").symlink_to(out / "nowhere")

    e = fsops.op_fs_stat({"path": str(out / "f.txt")})["entry"]
    assert (e["name"], e["type"], e["size"], e["perm"]) == ("f.txt", "file", 5, 0o640)
    assert stat.S_ISREG(e["mode"]) and e["owner"] and e["group"] and e["mtime_ns"] > 0
    assert "symlink" not in e

    link = fsops.op_fs_stat({"path": str(out / "link")})["entry"]
    assert link["symlink"] is True and link["type"] == "dir" and link["target"] == str(out / "d")
    assert stat.S_ISLNK(link["mode"])
    assert fsops.op_fs_stat({"path": str(out / "dangling")})["entry"]["type"] == "other"
    refused("not_found", fsops.op_fs_stat, {"path": str(out / "missing")})

    one = [x["rel"] for x in fsops.op_fs_list({"path": str(out), "depth": 1})["entries"]]
    assert one == ["d", "dangling", "f.txt", "link"]
    two = [x["rel"] for x in fsops.op_fs_list({"path": str(out), "depth": 3})["entries"]]
    # depth first, sorted, never entering the linked directory
    assert two == ["d", "d/e", "d/e/deep.txt", "dangling", "f.txt", "link"]
    # a link to a directory is listed as the directory
    assert [x["rel"] for x in fsops.op_fs_list({"path": str(out / "link")})["entries"]] == ["e"]
    refused("not_a_directory", fsops.op_fs_list, {"path": str(out / "f.txt")})
    refused("not_found", fsops.op_fs_list, {"path": str(out / "missing")})
    refused("too_large", fsops.op_fs_list, {"path": str(out), "depth": 3, "limit": 2})


def test_changes_outside_the_workspace(dirs: tuple[Path, Path]) -> None:
    _ws, out = dirs
    made = fsops.op_fs_mkdir({"path": str(out / "a" / "b")})["entry"]
    assert made["type"] == "dir" and (out / "a" / "b").is_dir()
    refused("exists", fsops.op_fs_mkdir, {"path": str(out / "a" / "b")})
    (out / "file").write_text("x")
    refused("invalid", fsops.op_fs_mkdir, {"path": str(out / "file")})
    refused("not_a_directory", fsops.op_fs_mkdir, {"path": str(out / "file" / "sub")})

    moved = fsops.op_fs_move({"source": str(out / "file"), "destination": str(out / "new" / "dir" / "g")})
    assert moved["entry"]["name"] == "g" and (out / "new" / "dir" / "g").read_text() == "x"
    refused("not_found", fsops.op_fs_move, {"source": str(out / "file"), "destination": str(out / "h")})

    assert fsops.op_fs_remove({"path": str(out / "a")}) == {"removed": True}
    assert not (out / "a").exists()
    assert fsops.op_fs_remove({"path": str(out / "a")}) == {"removed": False}
    (out / "l").symlink_to(out / "new")
    fsops.op_fs_remove({"path": str(out / "l")})
    assert (out / "new" / "dir" / "g").exists()  # a link removed, never its target
    refused("invalid", fsops.op_fs_stat, {"path": "relative"})


def test_changes_touching_the_workspace_need_recording(dirs: tuple[Path, Path]) -> None:
    ws, out = dirs
    (out / "into").symlink_to(ws)
    (out / "f").write_text("x")
    refused("in_workspace", fsops.op_fs_mkdir, {"path": str(ws / "d")})
    refused("in_workspace", fsops.op_fs_mkdir, {"path": str(out / "into" / "d")})  # through a link
    refused("in_workspace", fsops.op_fs_move, {"source": str(out / "f"), "destination": str(ws / "f")})
    refused("in_workspace", fsops.op_fs_remove, {"path": str(out / "into" / "x")})
    assert not list(ws.iterdir()) and (out / "f").exists()
    # the link itself is outside: removing it is not a change of the workspace
    assert fsops.op_fs_remove({"path": str(out / "into")}) == {"removed": True}

    fsops.op_fs_mkdir({"path": str(ws / "d"), "recorded": True})
    fsops.op_fs_move({"source": str(out / "f"), "destination": str(ws / "d" / "f"), "recorded": True})
    assert (ws / "d" / "f").read_text() == "x"
    refused("invalid", fsops.op_fs_remove, {"path": str(ws), "recorded": True})
    fsops.op_fs_remove({"path": str(ws / "d"), "recorded": True})
    assert not list(ws.iterdir())


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> queue.Queue[dict[str, Any]]:
    got: queue.Queue[dict[str, Any]] = queue.Queue()
    monkeypatch.setattr(channel, "send", got.put)
    return got


def events_until(sent: queue.Queue[dict[str, Any]], wid: int, want: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The watch's events until every one of ``want`` came (a deadline ends the wait)."""
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 10
    while not want <= seen and time.monotonic() < deadline:
        try:
            msg = sent.get(timeout=0.2)
        except queue.Empty:
            continue
        assert msg["watch"] == wid and "error" not in msg, msg
        seen |= {(n, t) for n, t in msg["events"]}
    return seen


def test_watch_reports_changes_recursively_and_stops(dirs: tuple[Path, Path], sent: queue.Queue) -> None:
    _ws, out = dirs
    (out / "sub").mkdir()
    r = fswatch.op_watch_start({"watch": 7, "path": str(out), "recursive": True})
    r.pop("_after_send")()
    try:
        (out / "a.txt").write_text("1")
        os.chmod(out / "a.txt", 0o600)
        (out / "sub" / "b.txt").write_text("2")
        (out / "new" / "deeper").mkdir(parents=True)
        (out / "new" / "deeper" / "c.txt").write_text("3")
        os.rename(out / "a.txt", out / "sub" / "a2.txt")
        os.unlink(out / "sub" / "b.txt")
        # loom's own atomic write: a temporary renamed onto the name is that name written
        (out / "sub" / ".put.txt.loom-0123abcd.tmp").write_text("4")
        os.rename(out / "sub" / ".put.txt.loom-0123abcd.tmp", out / "sub" / "put.txt")
        want = {
            ("a.txt", "create"),
            ("a.txt", "write"),
            ("a.txt", "chmod"),
            ("sub/b.txt", "create"),
            ("new", "create"),
            ("new/deeper", "create"),
            ("new/deeper/c.txt", "create"),
            ("a.txt", "rename"),
            ("sub/a2.txt", "create"),
            ("sub/b.txt", "remove"),
            ("sub/put.txt", "create"),
            ("sub/put.txt", "write"),
        }
        seen = events_until(sent, 7, want)
        assert want <= seen
        assert not any(".loom-" in name for name, _ in seen)
        refused("conflict", fswatch.op_watch_start, {"watch": 7, "path": str(out)})
    finally:
        fswatch.op_watch_stop({"watch": 7})
    deadline = time.monotonic() + 5
    while any(t.name == "fswatch-7" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "fswatch-7" for t in threading.enumerate()), "the watch's thread did not end"
    while not sent.empty():
        sent.get()
    (out / "after.txt").write_text("x")
    time.sleep(0.2)
    assert sent.empty()  # stopped: nothing more is sent


def test_watch_not_recursive_and_refusals(dirs: tuple[Path, Path], sent: queue.Queue) -> None:
    _ws, out = dirs
    (out / "sub").mkdir()
    (out / "f").write_text("")
    refused("not_found", fswatch.op_watch_start, {"watch": 1, "path": str(out / "missing")})
    refused("not_a_directory", fswatch.op_watch_start, {"watch": 1, "path": str(out / "f")})
    r = fswatch.op_watch_start({"watch": 2, "path": str(out), "recursive": False})
    r.pop("_after_send")()
    try:
        (out / "sub" / "inner").write_text("not seen")
        (out / "top").write_text("seen")
        seen = events_until(sent, 2, {("top", "create")})
        assert ("top", "create") in seen and not any(n.startswith("sub/") for n, _ in seen)
    finally:
        fswatch.stop_all()


def test_watch_takes_a_bounded_share_of_the_kernels_budget(
    dirs: tuple[Path, Path], sent: queue.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.agent import snapshot

    _ws, out = dirs
    (out / "a" / "b").mkdir(parents=True)
    monkeypatch.setattr(snapshot, "_watch_budget", lambda: 2)
    message = refused("limit", fswatch.op_watch_start, {"watch": 3, "path": str(out), "recursive": True})
    assert "smaller tree" in message
    r = fswatch.op_watch_start({"watch": 4, "path": str(out / "a"), "recursive": True})  # two directories: fits
    r.pop("_after_send")()
    try:
        (out / "a" / "c").mkdir()  # a third: the watch ends, saying why
        deadline = time.monotonic() + 10
        msg: dict[str, Any] = {}
        while "error" not in msg and time.monotonic() < deadline:
            try:
                msg = sent.get(timeout=0.2)
            except queue.Empty:
                continue
        assert msg.get("watch") == 4 and "smaller tree" in msg.get("error", "")
    finally:
        fswatch.stop_all()
