"""Trees a command makes that the change scan once could not take (issue 38): far deeper
than Python's recursion limit and than PATH_MAX, 100,000 entries in one directory, names
of 255 bytes, names that are not UTF-8, loops of links. Each call answers as the command
did, ``log`` shows the changes and ``undo --all`` gives back the tree there was; under
runc and gVisor (whose scans run on the host, ``sandbox.hostscan``)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
from pathlib import Path

import pytest

from tests.docker.conftest import own_registry

pytestmark = pytest.mark.docker


def remove_all_in(root: Path) -> None:
    subprocess.run(["rm", "-rf", "--one-file-system", *[str(p) for p in root.iterdir()]], check=False)


def tree_state(root: Path) -> set[bytes]:
    """Every path below ``root`` with its kind, mode, size and link target, as GNU find
    prints them: find walks any depth by descriptors, and its bytes are the names' own."""
    out = subprocess.run(
        ["find", ".", "-mindepth", "1", "-printf", r"%y %#m %s %P -> %l\0"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return set(out.split(b"\0")) - {b""}


def _py(body: str) -> str:
    """A shell command running Python ``body`` (quoted for no shell: sent in base64)."""
    return f"echo {base64.b64encode(('import os' + chr(10) + body).encode()).decode()} | base64 -d | python3"


CASES = {
    "depth_1000": _py(
        "os.mkdir('deep'); os.chdir('deep')\n"
        "for i in range(1000):\n    os.mkdir('d'); os.chdir('d')\n"
        "open('bottom.txt', 'w').write('down here\\n')"
    ),
    "depth_5000": _py(
        "os.mkdir('deep'); os.chdir('deep')\n"
        "for i in range(5000):\n    os.mkdir('d'); os.chdir('d')\n"
        "open('bottom.txt', 'w').write('down here\\n')"
    ),
    "wide_100000": _py(
        "os.mkdir('wide')\nfor i in range(100000):\n    os.close(os.open('wide/f%06d' % i, os.O_CREAT | os.O_WRONLY))"
    ),
    # 15 levels of 255-byte names and a 255-byte file: a path of 4,095 bytes (PATH_MAX is
    # 4,096 with its NUL); then 20 levels, past PATH_MAX.
    "long_names_near_path_max": _py(
        "n = 'n' * 255\nos.mkdir('long'); os.chdir('long')\n"
        "for i in range(14):\n    os.mkdir(n); os.chdir(n)\n"
        "open('f' * 255, 'w').write('x')\nos.symlink('l' * 255, 'k' * 250)"
    ),
    "past_path_max": _py(
        "n = 'p' * 255\nos.mkdir('past'); os.chdir('past')\n"
        "for i in range(20):\n    os.mkdir(n); os.chdir(n)\n"
        "open('f' * 255, 'w').write('x')"
    ),
    "not_utf8": _py(
        "os.mkdir(b'bad\\xff\\xfe')\n"
        "open(b'bad\\xff\\xfe/f\\x80\\x81.txt', 'w').write('latin\\n')\n"
        "open(b'top\\xe9.txt', 'w').write('e\\n')\n"
        "os.symlink(b'top\\xe9.txt', b'link\\xc3')"
    ),
    "symlink_loops": (
        "mkdir -p loops/sub && cd loops && ln -s self self && ln -s a b && ln -s b a"
        " && ln -s . dot && ln -s .. up && ln -s ../.. sub/upup && ln -s ../sub sub/again && echo made"
    ),
}


SLOW = {"depth_5000", "wide_100000"}  # ~5-8 s each runtime; ~20 s (runc only)
#: Under gVisor, 100,000 entries in one directory take 105 s and prove nothing runc's
#: run does not (the scan and undo are the same code; gVisor only makes each file
#: slower): gVisor keeps the deep and odd trees.
RUNSC_SKIPS = {"wide_100000"}


@pytest.mark.parametrize(
    ("runtime", "case"),
    [
        pytest.param(r, c, marks=pytest.mark.slow) if c in SLOW else (r, c)
        for r in ("runc", "runsc")
        for c in sorted(CASES)
        if not (r == "runsc" and c in RUNSC_SKIPS)
    ],
)
async def test_a_command_makes_an_odd_tree(
    docker_ready: None, user_workspace: Path, tmp_path: Path, runtime: str, case: str
) -> None:
    (user_workspace / "keep.txt").write_text("kept\n")
    try:
        async with own_registry(tmp_path, runtime) as reg:
            before = tree_state(user_workspace)
            result = await reg.execute(
                "shell_execute",
                {"command": CASES[case] + " && echo done", "timeout": 600},
                workspace=user_workspace,
                call_id="make",
            )
            assert result.success, (result.error, result.output[-2000:])
            assert "done" in result.output
            made = tree_state(user_workspace) - before
            assert made
            ws = await reg.workspace(user_workspace)
            entries = await ws.recorder.log(call_id="make")
            assert entries, "log shows no change"
            assert all(e.tool == "shell_execute" for e in entries)
            # Every new top-level name is in the log, itself or as the tree it is in.
            tops = {p.split(b" -> ")[0].split(b" ", 3)[3].split(b"/")[0] for p in made}
            logged = {e.path.encode("utf-8", "surrogateescape").split(b"/")[0] for e in entries}
            assert tops <= logged, (tops - logged, [e.path for e in entries][:20])

            done = await ws.recorder.undo(ws.sandbox, all=True)
            bad = [s for s in done.steps if s.status not in ("reverted", "already_reverted")]
            assert not bad, bad
            assert tree_state(user_workspace) == before
            # And the next call still answers, with nothing left to report.
            again = await reg.execute("shell_execute", {"command": "echo again"}, workspace=user_workspace)
            assert again.success and "again" in again.output
    finally:
        # shutil.rmtree (the fixture's cleanup) recurses per level: what a failed run
        # left goes first, by rm.
        await asyncio.to_thread(remove_all_in, user_workspace)


def _make_on_host(root: Path) -> None:
    """Before any call: 1,000 levels with a file at each tenth, and 20 levels of 255-byte
    names (past PATH_MAX) with a non-UTF-8 file at the bottom; all made from descriptors."""
    for top, name, depth in ((b"deep", b"d", 1000), (b"long", b"n" * 255, 20)):
        cur = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        os.mkdir(top, dir_fd=cur)
        nxt = os.open(top, os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
        os.close(cur)
        cur = nxt
        for i in range(depth):
            if i % 10 == 0:
                fd = os.open(b"f\xff%d" % i, os.O_WRONLY | os.O_CREAT, 0o640, dir_fd=cur)
                os.write(fd, b"level %d\n" % i)
                os.close(fd)
            os.mkdir(name, dir_fd=cur)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        os.symlink(b"../" * 3, b"loop", dir_fd=cur)
        os.close(cur)
    subprocess.run(["chown", "-R", "1000:1000", str(root)], check=True)


@pytest.mark.slow  # undo makes each directory again from the root: ~45 s under gVisor
@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_a_command_removes_a_deep_tree_and_undo_puts_it_back(
    docker_ready: None, user_workspace: Path, tmp_path: Path, runtime: str
) -> None:
    _make_on_host(user_workspace)
    before = tree_state(user_workspace)
    try:
        async with own_registry(tmp_path, runtime) as reg:
            first = await reg.execute("shell_execute", {"command": "true"}, workspace=user_workspace)
            assert first.success, first.output
            gone = await reg.execute(
                "shell_execute", {"command": "rm -rf deep long", "timeout": 600}, workspace=user_workspace, call_id="rm"
            )
            assert gone.success, gone.output
            assert not (user_workspace / "deep").exists()
            ws = await reg.workspace(user_workspace)
            assert await ws.recorder.log(call_id="rm")
            done = await ws.recorder.undo(ws.sandbox, all=True)
            bad = [s for s in done.steps if s.status not in ("reverted", "already_reverted")]
            assert not bad, bad[:5]
            assert tree_state(user_workspace) == before
    finally:
        await asyncio.to_thread(remove_all_in, user_workspace)
