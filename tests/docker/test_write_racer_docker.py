"""A process in the sandbox racing the file tools' staged writes (issue 38).

Under runc a racer that swapped the staging temporary for a symlink out of the workspace
made a ``write_file`` report success while leaving the target as that link. Here a racer
in the sandbox swaps the temporaries, the target's directory or the targets themselves
for symlinks (out of the workspace) and hard links (to another file of the workspace)
while 1,000 writes and edits run: every call either puts exactly the file it was asked
to write in place, as a regular file, or fails; nothing outside the workspace is read or
written; the hard-linked file never changes. Under runc and gVisor.
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import own_registry

pytestmark = pytest.mark.docker

CALLS = 1000
FILES = 4
SECRET = "SECRET-" + os.urandom(6).hex()
OTHER = b"OTHER content, hard-linked by the racer\n"

RACER = r"""
import os, random, re, sys
mode = sys.argv[1]
W = "/workspace/w"
OUT = "/tmp/outside"
TMP = re.compile(r"^\..*\.loom-[0-9a-f]+\.tmp$")


def swap(path):
    x = os.path.join(os.path.dirname(path), ".racer")
    try:
        if random.random() < 0.5:
            os.symlink(OUT + "/secret", x)
        else:
            os.link(W + "/other.txt", x)
        os.rename(x, path)
        return 1
    except OSError:
        try:
            os.unlink(x)
        except OSError:
            pass
        return 0


n = 0
print("racing", flush=True)
while not os.path.exists("/tmp/racer.stop"):
    if mode == "tmp":
        for d in (W, W + "/d"):
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for name in names:
                if TMP.match(name):
                    n += swap(d + "/" + name)
    elif mode == "dir":
        try:
            os.rename(W + "/d", W + "/d.old")
            os.symlink(OUT, W + "/d")
            os.listdir(W)
            os.unlink(W + "/d")
            os.rename(W + "/d.old", W + "/d")
            n += 1
        except OSError:
            pass
    else:
        n += swap(W + "/d/f%d.txt" % random.randrange(4))
print("swaps", n, flush=True)
"""


def _all_text(result: Any) -> str:
    return f"{result.output} {result.error} {result.data}"


def _regular(dir_fd: int, name: str) -> bytes | None:
    """The content of regular file ``name`` in ``dir_fd``, None when absent; fails the
    test for anything else there (a link, a directory)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    assert stat.S_ISREG(st.st_mode), f"{name} is not a regular file: {oct(st.st_mode)}"
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def _in_dir_now(parent: Path, name: str) -> bytes | None:
    """``d/name`` under ``parent`` if ``d`` is a directory (not a link) now."""
    try:
        d = os.open(parent / "d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return _regular(d, name)
    finally:
        os.close(d)


@pytest.mark.parametrize("mode", ["tmp", "dir", "target"])
@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_writes_and_edits_against_a_racer(
    docker_ready: None, user_workspace: Path, tmp_path: Path, runtime: str, mode: str
) -> None:
    ws = user_workspace
    (ws / "w" / "d").mkdir(parents=True)
    (ws / "w" / "other.txt").write_bytes(OTHER)
    for i in range(FILES):
        (ws / "w" / "d" / f"f{i}.txt").write_text("content 0\n")
    for p in [ws / "w", ws / "w" / "d", *(ws / "w").rglob("*")]:
        os.lchown(p, 1000, 1000)
    # The real directory, wherever the racer renames it.
    real = os.open(ws / "w" / "d", os.O_RDONLY | os.O_DIRECTORY)
    async with own_registry(tmp_path, runtime) as reg:

        async def call(tool: str, **args: Any) -> Any:
            result = await reg.execute(tool, args, workspace=ws)
            assert SECRET not in _all_text(result), (tool, args)  # nothing outside was read
            return result

        setup = await call(
            "shell_execute",
            command=f"mkdir -p /tmp/outside && printf %s {SECRET} > /tmp/outside/secret"
            f" && echo {base64.b64encode(RACER.encode()).decode()} | base64 -d > /tmp/racer.py",
        )
        assert setup.success, setup.output
        racer = await call("shell_execute", command=f"exec python3 /tmp/racer.py {mode}", background=True)
        assert racer.success, racer.output
        expected = {i: b"content 0\n" for i in range(FILES)}
        outcomes = {"ok": 0, "failed": 0}
        try:
            for n in range(1, CALLS + 1):
                i = n % FILES
                name = f"f{i}.txt"
                new = f"content {n}\n".encode()
                old = expected[i]
                if n % 2 and old is not None and mode != "target":
                    result = await call(
                        "edit_file", path=f"w/d/{name}", old_str=old.decode().strip(), new_str=new.decode().strip()
                    )
                else:
                    result = await call("write_file", path=f"w/d/{name}", content=new.decode())
                outcomes["ok" if result.success else "failed"] += 1
                if mode == "target":
                    continue  # the racer replaces the targets themselves: checked below
                now = _regular(real, name)
                if result.success:
                    # In place, as a regular file, with exactly what was written: in the
                    # directory the racer moves about, or in the one the write made at
                    # w/d when the racer had left no directory there.
                    assert new in (now, _in_dir_now(ws / "w", name)), (n, result.output, now)
                else:
                    # Failed: the file as it was, or (the racer's object having been put
                    # there by the rename and removed) gone; in "dir" mode the write may
                    # have landed in the directory that was moved.
                    assert now in ((old, None, new) if mode == "dir" else (old, None)), (n, result.output, now)
                expected[i] = now
        finally:
            stop = await call("shell_execute", command="touch /tmp/racer.stop")
            assert stop.success
            out = await call("process_output", process_id=racer.data["process_id"], wait_ms=5000)
            os.close(real)
        print(mode, runtime, outcomes, out.output.strip()[-200:])
        assert "swaps" in out.output and "swaps 0" not in out.output, out.output  # it raced
        assert outcomes["ok"] > 0
        # Nothing outside the workspace was written: the outside directory holds its one
        # file, unchanged; the hard-linked file is as it was.
        seen = await reg.execute("shell_execute", {"command": "ls -A /tmp/outside && cat /tmp/outside/secret"}, ws)
        assert seen.success and seen.output.split() == ["secret", SECRET], seen.output
        assert (ws / "w" / "other.txt").read_bytes() == OTHER
        # Back to quiet: a last write of every file lands as a regular file.
        if (ws / "w" / "d").is_symlink():
            (ws / "w" / "d").unlink()
            (ws / "w" / "d.old").rename(ws / "w" / "d")
        for p in (ws / "w" / "d").iterdir():
            if p.is_symlink() or p.stat().st_nlink > 1:
                p.unlink()  # what the racer left in place of a target
        for i in range(FILES):
            result = await call("write_file", path=f"w/d/f{i}.txt", content="last\n")
            assert result.success, result.output
            assert (ws / "w" / "d" / f"f{i}.txt").read_bytes() == b"last\n"
            assert not (ws / "w" / "d" / f"f{i}.txt").is_symlink()
