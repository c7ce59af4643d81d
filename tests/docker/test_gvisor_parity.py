"""gVisor behaves like Linux for everyday commands: each command of the table runs in a
fresh sandbox under runc and under runsc, on the same files, and must give the same exit
code and the same output once what legitimately differs (inode numbers, timestamps,
directory sizes, link counts of directories) is normalised. This is what caught
bookworm's runsc refusing statx() with AT_NO_AUTOMOUNT, so `ls -l` and `stat` failed on
every file (scripts/setup now installs a runsc that does not).

One difference is left, and asserted to be the only one: this gVisor (20240729, the newest
Debian packages) answers lgetxattr() on a symlink with EBADF and on an unreadable directory
with EACCES (gVisor issue #11049, fixed later), so `ls -l` prints one stderr line per such
entry; its listing is the same."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import own_backend, require_runtime
from worker import ToolRegistry

pytestmark = pytest.mark.docker

GIT = "git -c user.name=a -c user.email=a@b -c init.defaultBranch=main"
COMMANDS = {
    "ls -la": "ls -la --time-style=+T src",
    "stat": "stat -c '%n %s %a %F' src/a.txt src src/link",
    "cp -a": "cp -a src copy && ls -la --time-style=+T copy && cmp src/a.txt copy/a.txt && echo same",
    "mv": "mv src/b.txt src/c.txt && ls src",
    "tar": "tar -cf t.tar src && mkdir out && tar -xf t.tar -C out && find out | sort",
    "find -newer": "touch -d '2001-01-01' old && touch new && find . -maxdepth 1 -newer old -name 'new' | sort",
    "du": "du -s --apparent-size --block-size=1 src/a.txt",
    "git": f"{GIT} init -q r && cp src/a.txt r/ && cd r && {GIT} add a.txt && {GIT} commit -qm one"
    f" && echo more >> a.txt && {GIT} status --short && {GIT} diff --stat | tail -1",
    "python3 -m venv": "python3 -m venv v && ls v/bin | sort | head -3",
    "pip --version": "pip --version | cut -d' ' -f1-2",
    "sort": "printf 'b\\na\\nc\\n' | sort",
    "sed -i": "sed -i 's/hello/bye/' src/a.txt && cat src/a.txt",
    "chmod": "chmod 751 src/a.txt && stat -c '%a' src/a.txt",
    "ln -s": "ln -s a.txt src/l2 && readlink src/l2 && cat src/l2",
    "touch -d": "touch -d '2020-02-02 02:02:02' src/a.txt && date -r src/a.txt +%F",
    "mkfifo": "mkfifo p && stat -c '%F' p",
    "cc": "printf 'int main(void){return 7;}' > m.c && cc -o m m.c; ./m; echo rc=$?",
    "ls -l /": "ls -l / >/dev/null && echo ok",
}


def _seed(ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "a.txt").write_text("hello\n")
    (ws / "src" / "b.txt").write_text("b\n")
    (ws / "src" / "link").symlink_to("a.txt")


#: The stderr lines of the one known difference (see the module docstring).
GVISOR_XATTR = re.compile(r"^ls: [^\n]*: (Bad file descriptor|Permission denied)$", re.M)


def _normalise(text: str) -> str:
    text = re.sub(r"^total \d+$", "total N", text, flags=re.M)
    # ls -l of a directory: its link count and size are the filesystem's, not the command's
    text = re.sub(r"^(d\S+)\s+\d+(\s+\S+\s+\S+)\s+\d+", r"\1 N\2 N", text, flags=re.M)
    return re.sub(r"\s+", " ", text).strip()


async def _run(runtime: str, ws: Path, command: str) -> tuple[bool, str]:
    async with own_backend(runtime, image=SANDBOX_IMAGE) as backend:
        r = await ToolRegistry(backend=backend).execute("shell_execute", {"command": command}, ws)
        return r.success, _normalise(r.output)


@pytest.mark.parametrize("name", list(COMMANDS))
async def test_everyday_commands_behave_the_same_under_gvisor(docker_ready: None, tmp_path: Path, name: str) -> None:
    require_runtime("runsc")
    results = {}
    for runtime in ("runc", "runsc"):
        ws = tmp_path / runtime
        ws.mkdir()
        shutil.chown(ws, 1000, 1000)
        _seed(ws)
        for p in ws.rglob("*"):
            shutil.chown(p, 1000, 1000) if not p.is_symlink() else None
        results[runtime] = await _run(runtime, ws, COMMANDS[name])
    assert results["runc"][0], results["runc"]  # the command itself works on Linux
    ok, out = results["runsc"]
    raw = out
    out = re.sub(r"\s+", " ", GVISOR_XATTR.sub("", raw.replace(" ls: ", "\nls: "))).replace(" [stderr]", "").strip()
    want = results["runc"][1].replace(" [stderr]", "").strip()
    assert (ok, out) == (True, want), raw
