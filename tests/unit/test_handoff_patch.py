"""The patch formats of :mod:`worker.handoff.gitpatch`, applied by the host's real git:
every kind of change ``git am`` and ``git apply`` must take, and the tree they give."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from worker.handoff.gitpatch import blob_id, diff_body, mail
from worker.handoff.state import Change, Side

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "LC_ALL": "C",
}

PNG = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)) * 3


def f(data: bytes, x: bool = False) -> Side:
    return Side("file", data, x)


def link(target: str) -> Side:
    return Side("symlink", target.encode())


#: path -> content at the start (Side) and the changes to it.
START = {
    "a.txt": f(b"one\ntwo\nthree\n"),
    "gone.txt": f(b"bye\n"),
    "old name.txt": f(b"moved\nunchanged\n"),
    "moved-edit.py": f(b"".join(b"line %d\n" % i for i in range(30))),
    "run.sh": f(b"#!/bin/sh\necho hi\n"),
    "img.bin": f(PNG),
    "crlf.txt": f(b"a\r\nb\r\n"),
    "nonl.txt": f(b"no newline"),
    "latin1.txt": f(b"caf\xe9\n"),
    "ln": link("a.txt"),
    "becomes-link": f(b"was a file\n"),
}

CHANGES = [
    Change("a.txt", "a.txt", START["a.txt"], f(b"one\n2\nthree\nfour\n")),
    Change("gone.txt", "gone.txt", START["gone.txt"], None),
    Change("new/dir/n.txt", "new/dir/n.txt", None, f(b"new\n")),
    Change("empty", "empty", None, f(b"")),
    Change("old name.txt", "new name.txt", START["old name.txt"], START["old name.txt"]),
    Change(
        "moved-edit.py",
        "pkg/moved.py",
        START["moved-edit.py"],
        f(START["moved-edit.py"].data.replace(b"line 5\n", b"LINE FIVE\n")),
    ),
    Change("run.sh", "run.sh", START["run.sh"], f(START["run.sh"].data, True)),
    Change("img.bin", "img.bin", START["img.bin"], f(PNG[::-1] + b"\0more")),
    Change("new.bin", "new.bin", None, f(b"\0\1\2" * 100, True)),
    Change("crlf.txt", "crlf.txt", START["crlf.txt"], f(b"a\r\nB\r\nc\r\n")),
    Change("nonl.txt", "nonl.txt", START["nonl.txt"], f(b"no newline\nnow two")),
    Change("latin1.txt", "latin1.txt", START["latin1.txt"], f(b"caf\xe9 cr\xe8me\n")),
    Change("ln", "ln", START["ln"], link("nonl.txt")),
    Change("newlink", "newlink", None, link("../outside")),
    Change("becomes-link", "becomes-link", START["becomes-link"], link("a.txt")),
]


def git(cwd: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, input=data, capture_output=True, check=True).stdout


def put(root: Path, path: str, side: Side) -> None:
    p = root / path
    p.parent.mkdir(parents=True, exist_ok=True)
    if side.kind == "symlink":
        os.symlink(side.data.decode(), p)
    else:
        p.write_bytes(side.data)
        p.chmod(0o755 if side.executable else 0o644)


def repo(tmp: Path, name: str) -> Path:
    root = tmp / name
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "core.autocrlf", "false")
    for path, side in START.items():
        put(root, path, side)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "start")
    return root


def expected(tmp: Path) -> str:
    """The tree the changes should give, made with git from the files themselves."""
    root = repo(tmp, "expected")
    for c in CHANGES:
        p = root / c.old_path
        if c.old is not None:
            p.unlink()
    for c in CHANGES:
        if c.new is not None:
            put(root, c.new_path, c.new)
    git(root, "add", "-A")
    return git(root, "write-tree").decode().strip()


def test_git_am_and_git_apply_give_the_same_tree(tmp_path: Path) -> None:
    want = expected(tmp_path)
    patch = mail(CHANGES, subject="Agent's work", body="What it did:\n- edit a.txt\n", author="Bot <bot@example.com>")
    data = patch.encode("utf-8", "surrogateescape")
    assert data.startswith(b"From ") and b"Subject: [PATCH] Agent's work\n" in data

    am = repo(tmp_path, "am")
    git(am, "am", "-q", data=data)
    assert git(am, "rev-parse", "HEAD^{tree}").decode().strip() == want
    log = git(am, "log", "-1", "--format=%an <%ae>%n%s%n%b").decode()
    assert log.startswith("Bot <bot@example.com>\nAgent's work\n") and "- edit a.txt" in log
    assert git(am, "status", "--porcelain") == b""

    applied = repo(tmp_path, "apply")
    git(applied, "apply", "--index", data=diff_body(CHANGES).encode("utf-8", "surrogateescape"))
    assert git(applied, "write-tree").decode().strip() == want
    assert os.access(applied / "run.sh", os.X_OK) and os.readlink(applied / "becomes-link") == "a.txt"


def test_blob_id_is_gits() -> None:
    assert blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_an_empty_session_is_a_patch_git_am_refuses_clearly(tmp_path: Path) -> None:
    # Nothing changed: the mail has no diff (git am says the patch is empty), and the
    # diffstat says 0 files.
    text = mail([], subject="nothing")
    assert " 0 files changed" in text and "diff --git" not in text
