"""E2B's files API on the real engine, through the official SDK (``sbx.files``, the
sandbox's signed URLs): envd's filesystem service and ``/files`` served by loom, under
runc and gVisor for the core cases. Every change made through it is in the workspace's
changelog, and loom's undo takes it back."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.docker.e2b.conftest import E2BServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def _changelog(server: E2BServer, sandbox_id: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{server.url}/v1/workspaces/{sandbox_id}/changelog", headers={"Authorization": f"Bearer {server.token}"}
    )
    r.raise_for_status()
    entries: list[dict[str, Any]] = r.json()
    return entries


def _undo_all(server: E2BServer, sandbox_id: str) -> None:
    r = httpx.post(
        f"{server.url}/v1/workspaces/{sandbox_id}/undo",
        json={"all": True},
        headers={"Authorization": f"Bearer {server.token}"},
    )
    assert r.status_code == 200, r.text
    assert all(s["status"] == "reverted" for s in r.json()["steps"]), r.text


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_files_read_write_list_change_and_undo(e2b_server_runtime: E2BServer) -> None:
    import e2b
    from e2b.sandbox.filesystem.filesystem import FileType

    server = e2b_server_runtime
    sbx = e2b.Sandbox.create()
    try:
        host = server.workspace(sbx.sandbox_id)
        # write: text, bytes, several files (one outside the workspace), a file in new
        # directories, gzip; the answers name E2B's paths
        info = sbx.files.write("notes.txt", "hello")
        assert (info.name, info.path, info.type) == ("notes.txt", "/home/user/notes.txt", FileType.FILE)
        sbx.files.write("/home/user/data.bin", b"\x00\x01\xff")
        many = sbx.files.write_files(
            [{"path": "/tmp/scratch.txt", "data": "tmp"}, {"path": "deep/er/file.txt", "data": b"deep"}]
        )
        assert [w.path for w in many] == ["/tmp/scratch.txt", "/home/user/deep/er/file.txt"]
        sbx.files.write("zipped.txt", "compressed " * 100, gzip=True)
        sbx.files.write("streamed.bin", io.BytesIO(b"s" * 100_000))  # (octet-stream, streamed)

        # read: text, bytes, a stream, gzip; the workspace is the host directory
        assert sbx.files.read("notes.txt") == "hello"
        assert bytes(sbx.files.read("data.bin", format="bytes")) == b"\x00\x01\xff"
        assert b"".join(sbx.files.read("deep/er/file.txt", format="stream")) == b"deep"
        assert sbx.files.read("zipped.txt", gzip=True) == "compressed " * 100
        assert sbx.files.read("/tmp/scratch.txt") == "tmp"
        assert (host / "deep" / "er" / "file.txt").read_bytes() == b"deep"
        assert not (host / "scratch.txt").exists()

        # list (depth), get_info, exists
        top = {e.name: e for e in sbx.files.list("/home/user")}
        assert set(top) == {"notes.txt", "data.bin", "deep", "zipped.txt", "streamed.bin"}
        assert top["deep"].type == FileType.DIR and top["deep"].path == "/home/user/deep"
        assert [e.path for e in sbx.files.list("deep", depth=3)] == [
            "/home/user/deep/er",
            "/home/user/deep/er/file.txt",
        ]
        notes = sbx.files.get_info("~/notes.txt")
        assert (notes.size, notes.type, notes.path) == (5, FileType.FILE, "/home/user/notes.txt")
        assert notes.permissions == "-rw-r--r--" and notes.mode == 0o644 and notes.owner
        assert notes.symlink_target is None
        assert sbx.files.exists("deep/er") and not sbx.files.exists("missing")
        home = sbx.files.get_info("/home/user")
        assert (home.name, home.type, home.path) == ("user", FileType.DIR, "/home/user")

        # make_dir (False when there), rename, remove
        assert sbx.files.make_dir("made/a/b") is True
        assert sbx.files.make_dir("made/a/b") is False
        moved = sbx.files.rename("notes.txt", "made/renamed.txt")
        assert (moved.path, moved.name) == ("/home/user/made/renamed.txt", "renamed.txt")
        sbx.files.rename("/tmp/scratch.txt", "from-tmp.txt")  # from outside into the workspace
        sbx.files.remove("deep")
        sbx.files.remove("missing-is-fine")
        assert _tree(host) == [
            "data.bin",
            "from-tmp.txt",
            "made",
            "made/a",
            "made/a/b",
            "made/renamed.txt",
            "streamed.bin",
            "zipped.txt",
        ]

        # errors as the SDK's exceptions
        with pytest.raises(e2b.FileNotFoundException, match="/home/user/missing"):
            sbx.files.read("missing")
        with pytest.raises(e2b.NotFoundException):
            sbx.files.get_info("missing")
        with pytest.raises(e2b.NotFoundException):
            sbx.files.rename("missing", "elsewhere")
        with pytest.raises(e2b.InvalidArgumentException, match="not a directory"):
            sbx.files.make_dir("data.bin")
        with pytest.raises(e2b.InvalidArgumentException, match="not a directory"):
            sbx.files.list("data.bin")
        with pytest.raises(e2b.InvalidArgumentException, match="is a directory"):
            sbx.files.read("made")
        # users: E2B's default "user" is the workspace's owner; root only where the
        # workspace allows it; a user the image has not is refused as envd refuses it
        assert sbx.files.read("data.bin", format="bytes", user="user") == b"\x00\x01\xff"
        with pytest.raises(e2b.SandboxException, match="root"):
            sbx.files.write("/tmp/as-root", "x", user="root")
        with pytest.raises(e2b.SandboxException, match="root"):
            sbx.files.list("/tmp", user="root")
        with pytest.raises(e2b.AuthenticationException, match="nosuchuser"):
            sbx.files.get_info("/tmp", user="nosuchuser")

        # every change is in the changelog, by the call that made it, and undone
        entries = _changelog(server, sbx.sandbox_id)
        tools = {e["tool"] for e in entries}
        assert {"sandbox.write_file", "e2b.make_dir", "e2b.move", "e2b.remove"} <= tools
        paths = {e["path"] for e in entries}
        assert {"notes.txt", "deep/er/file.txt", "made/a/b", "from-tmp.txt"} <= paths
        _undo_all(server, sbx.sandbox_id)
        assert _tree(host) == []
        assert sbx.files.list("/home/user") == []
    finally:
        sbx.kill()


def _inotify_instances(workspace: Path) -> int:
    """inotify instances the sandbox's processes hold (runc: their descriptors on the host)."""
    client = docker.from_env()
    try:
        (c,) = client.containers.list(filters={"label": f"dev.loom.workspace={workspace.resolve()}"})
        top = c.top()
        col = top["Titles"].index("PID")
        n = 0
        for row in top["Processes"]:
            fds = f"/proc/{row[col]}/fd"
            for fd in os.listdir(fds):
                try:
                    n += os.readlink(f"{fds}/{fd}") == "anon_inode:inotify"
                except OSError:
                    continue
        return n
    finally:
        client.close()


def _settles(count: Any, want: int) -> int:
    """``count()`` once it is ``want``, or its last value after a generous deadline."""
    deadline = time.monotonic() + 20
    got = count()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = count()
    return got


def _events_until(handle: Any, want: set[tuple[str, str]]) -> set[tuple[str, str]]:
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 20
    while not want <= seen and time.monotonic() < deadline:
        seen |= {(e.name, e.type.value) for e in handle.get_new_events()}
        time.sleep(0.05)
    return seen


def test_watch_dir_polling_and_streaming(e2b_server_runtime: E2BServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import e2b
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError
    from e2b.envd.filesystem import filesystem_pb

    server = e2b_server_runtime
    sbx = e2b.Sandbox.create()
    try:
        sbx.files.make_dir("watched/sub")
        host = server.workspace(sbx.sandbox_id)
        runc = server.settings.runtime == "runc"
        before = _inotify_instances(host) if runc else 0

        # the synchronous SDK's polling watcher: recursive, then not
        deep = sbx.files.watch_dir("watched", recursive=True)
        flat = sbx.files.watch_dir("/home/user/watched")
        if runc:
            assert _inotify_instances(host) == before + 2
        sbx.files.write("watched/a.txt", "1")
        sbx.files.write("watched/sub/b.txt", "2")
        sbx.files.make_dir("watched/new/dir")
        sbx.files.write("watched/new/dir/c.txt", "3")
        sbx.files.rename("watched/a.txt", "watched/sub/a2.txt")
        sbx.files.remove("watched/sub/b.txt")
        want = {
            ("a.txt", "create"),
            ("a.txt", "write"),
            ("sub/b.txt", "create"),
            ("new", "create"),
            ("new/dir", "create"),
            ("new/dir/c.txt", "create"),
            ("a.txt", "rename"),
            ("sub/a2.txt", "create"),
            ("sub/b.txt", "remove"),
        }
        seen = _events_until(deep, want)
        assert want <= seen, seen
        assert not any(".loom-" in name for name, _ in seen)  # loom's own temporaries never show
        flat_seen = _events_until(flat, {("a.txt", "create"), ("new", "create")})
        assert {("a.txt", "create"), ("new", "create")} <= flat_seen
        assert not any("/" in name for name, _ in flat_seen)
        wid = deep._watcher_id
        deep.stop()
        flat.stop()
        with pytest.raises(ConnectError) as gone:
            sbx.files._rpc.get_watcher_events(filesystem_pb.GetWatcherEventsRequest(watcher_id=wid))
        assert gone.value.code == Code.NOT_FOUND
        with pytest.raises(e2b.NotFoundException):
            sbx.files.watch_dir("no-such-dir")
        if runc:
            assert _settles(lambda: _inotify_instances(host), before) == before
        # a watcher nobody polls for its idle time is stopped and forgotten
        from worker.integrations.e2b import watchers

        forgotten = sbx.files.watch_dir("watched")
        with monkeypatch.context() as patched, pytest.raises(e2b.NotFoundException):
            patched.setattr(watchers, "IDLE_TTL", 0.0)
            forgotten.get_new_events()
        if runc:
            assert _settles(lambda: _inotify_instances(host), before) == before

        # the asynchronous SDK's stream: events as they come; stopping it ends the watch
        async def stream() -> list[tuple[str, str]]:
            asbx = await e2b.AsyncSandbox.connect(sbx.sandbox_id)
            got: list[tuple[str, str]] = []
            written = asyncio.Event()

            def on_event(e: Any) -> None:
                got.append((e.name, e.type.value))
                if got[-1] == ("streamed.txt", "write"):
                    written.set()

            handle = await asbx.files.watch_dir("watched", on_event)
            await asbx.files.write("watched/streamed.txt", "s")
            await asyncio.wait_for(written.wait(), 20)
            if runc:
                assert _inotify_instances(host) == before + 1
            await handle.stop()
            return got

        got = asyncio.run(stream())
        assert ("streamed.txt", "create") in got and ("streamed.txt", "write") in got
        if runc:
            assert _settles(lambda: _inotify_instances(host), before) == before
    finally:
        sbx.kill()


def test_signed_urls_and_health(e2b_server: E2BServer) -> None:
    import e2b

    server = e2b_server
    sbx = e2b.Sandbox.create()
    try:
        sbx.files.write("shared.txt", "for everyone")
        # a download URL (no header, no token: its signature says which sandbox)
        url = sbx.download_url("shared.txt")
        assert "signature=v1_" in url
        got = httpx.get(url)
        assert (got.status_code, got.text) == (200, "for everyone")
        assert httpx.get(sbx.download_url("/home/user/shared.txt", use_signature_expiration=60)).text == "for everyone"
        # expired, forged, or for another operation: 401 in envd's shape
        expired = httpx.get(sbx.download_url("shared.txt", use_signature_expiration=-10))
        assert expired.status_code == 401 and expired.json()["code"] == 401
        assert httpx.get(url.replace("signature=v1_", "signature=v1_x")).status_code == 401
        assert httpx.get(url.replace("shared.txt", "other.txt")).status_code == 401
        assert httpx.post(url, files={"file": ("x", b"x")}).status_code == 401
        missing = httpx.get(sbx.download_url("missing.txt"))
        assert missing.status_code == 404 and missing.json() == {
            "code": 404,
            "message": "path '/home/user/missing.txt' does not exist",
        }

        # an upload URL: multipart (several files) and octet-stream; recorded
        up = httpx.post(sbx.upload_url("uploaded.txt"), files={"file": ("ignored-name", b"via url")})
        assert up.status_code == 200
        assert up.json() == [{"path": "/home/user/uploaded.txt", "name": "uploaded.txt", "type": "file"}]
        raw = httpx.post(
            sbx.upload_url("raw/bytes.bin", use_signature_expiration=60),
            content=b"\x00raw",
            headers={"Content-Type": "application/octet-stream"},
        )
        assert raw.status_code == 200 and raw.json()[0]["path"] == "/home/user/raw/bytes.bin"
        multi = httpx.post(
            sbx.upload_url(""),
            files=[("file", ("one.txt", b"1")), ("file", ("/tmp/two.txt", b"2"))],
        )
        assert [e["path"] for e in multi.json()] == ["/home/user/one.txt", "/tmp/two.txt"]
        assert sbx.files.read("/tmp/two.txt") == "2"
        host = server.workspace(sbx.sandbox_id)
        assert (host / "uploaded.txt").read_bytes() == b"via url"
        assert (host / "raw" / "bytes.bin").read_bytes() == b"\x00raw"
        assert {"uploaded.txt", "raw/bytes.bin", "one.txt"} <= {e["path"] for e in _changelog(server, sbx.sandbox_id)}
        bad = httpx.post(sbx.upload_url("x.txt"), content=b"x", headers={"Content-Type": "text/plain"})
        assert bad.status_code == 400 and "unsupported content type" in bad.json()["message"]
        meta = httpx.post(
            sbx.upload_url("x.txt"),
            content=b"x",
            headers={"Content-Type": "application/octet-stream", "X-Metadata-Owner": "me"},
        )
        assert meta.status_code == 501 and "metadata" in meta.json()["message"]
        assert not (host / "x.txt").exists()

        # envd's health: 204 for a sandbox that is there, 502 "was not found" (E2B's
        # proxy's words, which the SDK reads as a sandbox gone) for one that is not
        health = {"X-Access-Token": sbx._envd_access_token, "E2b-Sandbox-Id": sbx.sandbox_id}
        assert httpx.get(f"{server.url}/health", headers=health).status_code == 204
        unknown = {"X-API-KEY": server.token, "E2b-Sandbox-Id": "i0000000000000000dead"}
        gone = httpx.get(f"{server.url}/health", headers=unknown)
        assert gone.status_code == 502 and "was not found" in gone.json()["message"]
        stat = httpx.post(f"{server.url}/filesystem.Filesystem/Stat", json={"path": "/"}, headers=unknown)
        assert stat.status_code == 503 and stat.json()["code"] == "unavailable"
        assert "was not found" in stat.json()["message"]
    finally:
        sbx.kill()


def test_large_files_stream_and_are_recorded(e2b_server: E2BServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import e2b

    from worker.integrations.e2b import uploads

    server = e2b_server
    sbx = e2b.Sandbox.create()
    try:
        big = os.urandom(24 << 20)  # more than one recorded write: written in pieces
        sbx.files.write("big.bin", io.BytesIO(big))
        digest = hashlib.sha256()
        for piece in sbx.files.read("big.bin", format="stream"):
            digest.update(piece)
        assert digest.hexdigest() == hashlib.sha256(big).hexdigest()
        assert (server.workspace(sbx.sandbox_id) / "big.bin").stat().st_size == len(big)
        entry = next(e for e in _changelog(server, sbx.sandbox_id) if e["path"] == "big.bin")
        assert entry["tool"] == "e2b.write"
        sbx.files.write("/tmp/big-outside.bin", big)  # outside the workspace: in pieces too
        assert hashlib.sha256(bytes(sbx.files.read("/tmp/big-outside.bin", format="bytes"))).digest() == (
            hashlib.sha256(big).digest()
        )

        # beyond what one upload may carry (the limit made small here): 413, nothing written
        monkeypatch.setattr(uploads, "MAX_UPLOAD", 1 << 20)
        with pytest.raises(e2b.SandboxException, match="413"):
            sbx.files.write("too-big.bin", b"x" * (2 << 20))
        assert not sbx.files.exists("too-big.bin")
        _undo_all(server, sbx.sandbox_id)
        assert not (server.workspace(sbx.sandbox_id) / "big.bin").exists()
    finally:
        sbx.kill()
