"""The parts of E2B's files API that need no sandbox: E2B's paths, envd's description of
an entry (Go's mode string), the errors' mapping to Connect codes and statuses, and an
upload's body (gzip of several members, its size bounded while it inflates)."""

from __future__ import annotations

import asyncio
import gzip
import stat
from collections.abc import AsyncIterator

import pytest
from connectrpc.code import Code
from e2b.envd.filesystem import filesystem_pb as pb

from sandbox.errors import (
    AgentError,
    IsADirError,
    PathNotFoundError,
    PermissionDeniedError,
    SandboxLostError,
    TooLargeError,
    UserUnsupportedError,
)
from sandbox.results import PathEntry
from worker.integrations.e2b import uploads
from worker.integrations.e2b.entries import entry_info, go_mode_string, upload_entry
from worker.integrations.e2b.errors import EnvdInvalid, UnknownUser, e2b_words, failure
from worker.integrations.e2b.files import _accepts_gzip
from worker.integrations.e2b.sandboxfs import e2b_path
from worker.integrations.e2b.target import SandboxNotFound


def test_e2b_paths() -> None:
    assert e2b_path("") == "/home/user"
    assert e2b_path("a/../b.txt") == "/home/user/b.txt"
    assert e2b_path("~") == "/home/user"
    assert e2b_path("~/x") == "/home/user/x"
    assert e2b_path("/tmp//y/") == "/tmp/y"
    with pytest.raises(EnvdInvalid, match="user-specific"):
        e2b_path("~root/x")
    with pytest.raises(EnvdInvalid):
        e2b_path("a\x00b")


def test_go_mode_strings() -> None:
    assert go_mode_string(stat.S_IFREG | 0o644) == "-rw-r--r--"
    assert go_mode_string(stat.S_IFDIR | 0o755) == "drwxr-xr-x"
    assert go_mode_string(stat.S_IFLNK | 0o777) == "Lrwxrwxrwx"
    assert go_mode_string(stat.S_IFDIR | stat.S_ISVTX | 0o777) == "dtrwxrwxrwx"
    assert go_mode_string(stat.S_IFREG | stat.S_ISUID | 0o755) == "urwxr-xr-x"
    assert go_mode_string(stat.S_IFCHR | 0o666) == "Dcrw-rw-rw-"
    assert go_mode_string(stat.S_IFIFO | 0o600) == "prw-------"


def test_entry_info_of_a_link() -> None:
    link = PathEntry(
        path="/workspace/l",
        name="l",
        type="dir",
        size=11,
        mode=stat.S_IFLNK | 0o777,
        perm=0o755,
        uid=1000,
        gid=1000,
        owner="sandbox",
        group="sandbox",
        mtime_ns=1_700_000_000_123_456_789,
        symlink=True,
        target="/workspace/real",
    )
    info = entry_info(link, "/home/user/l")
    assert (info.type, info.is_symlink, info.symlink_target) == (pb.FileType.DIRECTORY, True, "/home/user/real")
    assert (info.mode, info.permissions, info.size) == (0o755, "Lrwxrwxrwx", 11)
    assert info.modified_time is not None and info.modified_time.nanos == 123_456_789
    plain = entry_info(PathEntry("/p", "p", "other", 0, stat.S_IFSOCK, 0, 0, 0, "r", "r", 0), "/p")
    assert plain.type == pb.FileType.UNSPECIFIED and not plain.has_field("symlink_target")
    assert upload_entry("/home/user/a/b.txt") == {"path": "/home/user/a/b.txt", "name": "b.txt", "type": "file"}


@pytest.mark.parametrize(
    ("error", "code", "status"),
    [
        (PathNotFoundError("No such file: /workspace/x"), Code.NOT_FOUND, 404),
        (PermissionDeniedError("Permission denied"), Code.PERMISSION_DENIED, 403),
        (UserUnsupportedError("no root here"), Code.PERMISSION_DENIED, 403),
        (IsADirError("Is a directory"), Code.INVALID_ARGUMENT, 400),
        (AgentError("directory already exists", code="exists"), Code.ALREADY_EXISTS, 409),
        (AgentError("No space left", code="no_space"), Code.RESOURCE_EXHAUSTED, 507),
        (TooLargeError("too many entries"), Code.FAILED_PRECONDITION, 413),
        (AgentError("odd", code="os_error"), Code.FAILED_PRECONDITION, 400),
        (UnknownUser("invalid username: 'x'"), Code.UNAUTHENTICATED, 401),
        (SandboxNotFound("sandbox 'i1' not found"), Code.UNAVAILABLE, 502),
        (SandboxLostError("agent died"), Code.UNAVAILABLE, 503),
    ],
)
def test_errors_as_envd_answers_them(error: Exception, code: Code, status: int) -> None:
    f = failure(error)
    assert f is not None and (f.code, f.status) == (code, status)
    assert "/workspace" not in f.message
    if isinstance(error, SandboxNotFound):
        assert "was not found" in f.message  # E2B's SDKs read a sandbox gone from these words


def test_unknown_errors_are_not_ours_and_paths_are_e2b_words() -> None:
    assert failure(RuntimeError("a bug")) is None
    assert e2b_words("No such file: /workspace/x, '/workspace'; /workspaces /a/workspace") == (
        "No such file: /home/user/x, '/home/user'; /workspaces /a/workspace"
    )


def test_accept_encoding() -> None:
    assert _accepts_gzip("gzip, deflate")
    assert _accepts_gzip("br;q=1.0, GZIP;q=0.5")
    assert _accepts_gzip("*")
    assert not _accepts_gzip("gzip;q=0")
    assert not _accepts_gzip("identity")
    assert not _accepts_gzip("")


class _Body:
    """What :func:`uploads.body` reads of a request: its headers and its stream."""

    def __init__(self, data: bytes, encoding: str | None) -> None:
        self.data = data
        self.headers = {"content-encoding": encoding} if encoding else {}

    async def stream(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self.data), 65536):
            yield self.data[i : i + 65536]


def _read(data: bytes, encoding: str | None) -> bytes:
    async def go() -> bytes:
        return b"".join([c async for c in uploads.body(_Body(data, encoding))])  # type: ignore[arg-type]

    return asyncio.run(go())


def test_upload_body_inflates_in_bounded_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = bytes(range(256)) * 20000
    two_members = gzip.compress(payload[:1000]) + gzip.compress(payload[1000:])
    assert _read(two_members, "gzip") == payload
    assert _read(payload, None) == payload
    with pytest.raises(EnvdInvalid, match="unexpected EOF"):
        _read(two_members[:-20], "gzip")
    with pytest.raises(EnvdInvalid, match="Content-Encoding"):
        _read(payload, "br")
    monkeypatch.setattr(uploads, "MAX_UPLOAD", 1 << 20)
    sizes: list[int] = []

    async def bomb() -> None:
        async for c in uploads.body(_Body(gzip.compress(b"\0" * (64 << 20)), "gzip")):  # type: ignore[arg-type]
            sizes.append(len(c))

    with pytest.raises(TooLargeError):
        asyncio.run(bomb())
    assert sizes and max(sizes) <= uploads.INFLATE_PIECE  # never more than a piece at once
    assert sum(sizes) <= 1 << 20


def test_spooled_upload_reads_back_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads, "READ_PIECE", 1000)

    async def go() -> tuple[int, list[int], bytes]:
        async def source() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"x" * 700_000

        f, size = await uploads.spool(source())
        u = uploads.Upload("p", size, f)
        pieces = [len(p) async for p in u.pieces()]
        whole = await u.read()
        f.close()
        return size, pieces, whole

    size, pieces, whole = asyncio.run(go())
    assert size == 3_500_000 and sum(pieces) == size and max(pieces) == 1000 and whole == b"x" * size
