"""Every agent primitive refuses, or stays inside the workspace, for every planted link."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import ExecRequest, Sandbox
from sandbox.docker import DockerBackend
from sandbox.errors import AgentError, NotAFileError, PathEscapeError, PathNotFoundError

pytestmark = pytest.mark.docker

Primitive = Callable[[Sandbox, str], Awaitable[Any]]

PRIMITIVES: dict[str, Primitive] = {
    "read": lambda b, p: b.read(p),
    "write": lambda b, p: b.write(p, b"pwned"),
    "write_below": lambda b, p: b.write(p + "/x", b"pwned"),
    "remove": lambda b, p: b.remove(p + "/x"),
    "list": lambda b, p: b.list(p),
    "search": lambda b, p: b.search("root", path=p),
    "scan": lambda b, p: b.scan(p),
    "exec_cwd": lambda b, p: b.exec(ExecRequest("pwd; cat /etc/hostname", cwd=p)),
}


@pytest.fixture
def planted(user_workspace: Path) -> Path:
    ws = user_workspace
    sibling = Path(str(ws) + "-evil")
    sibling.mkdir()
    (sibling / "secret").write_text("sibling secret")
    (ws / "to_root").symlink_to("/")
    (ws / "to_passwd").symlink_to("/etc/passwd")
    (ws / "to_environ").symlink_to("/proc/self/environ")
    (ws / "mid").symlink_to("/etc")
    (ws / "dangling").symlink_to("/nonexistent/target")
    (ws / "relative_out").symlink_to("../" + ws.name + "-evil")
    (ws / "sub").mkdir()
    (ws / "sub" / "up").symlink_to("../..")
    os.mkfifo(ws / "fifo")
    (ws / "inside.txt").write_text("root of all good\n")
    os.chown(ws / "inside.txt", 1000, 1000)  # the user's own file (a tool writes only what its user may)
    (ws / "link_inside").symlink_to("inside.txt")
    yield ws
    for p in sibling.iterdir():
        p.unlink()
    sibling.rmdir()


ESCAPES = [
    "to_root",
    "to_root/etc",
    "to_passwd",
    "to_environ",
    "mid",
    "mid/passwd",
    "dangling",
    "relative_out",
    "relative_out/secret",
    "sub/up",
    "sub/up/etc/passwd",
    "../x",
    "newdir/../../x",
    "/etc/passwd",
    "/workspace/../etc/passwd",
]


@pytest.mark.parametrize("prim", sorted(PRIMITIVES))
async def test_escapes_are_refused_by_every_primitive(docker_backend: DockerBackend, planted: Path, prim: str) -> None:
    """Every escape, one after another in one sandbox: refused as an escape, a missing
    path or not a file, and nothing made or changed on the host side; each one that was
    not is named."""
    box = await docker_backend.get(planted)
    before = sorted(p.name for p in planted.iterdir())
    failed = []
    for path in ESCAPES:
        try:
            result = await PRIMITIVES[prim](box, path)
        except (PathEscapeError, PathNotFoundError, NotAFileError) as e:
            if "pwned" in str(e):
                failed.append(f"{path!r}: the refusal shows what is outside: {e}")
        except AgentError as e:
            failed.append(f"{path!r} failed with an unexpected refusal {e.code}: {e}")
        else:
            failed.append(f"{path!r} was not refused: {result!r}"[:500])
        # nothing was created or changed anywhere on the host side
        if sorted(p.name for p in planted.iterdir()) != before:
            failed.append(f"{path!r} changed the workspace")
        if (Path(str(planted) + "-evil") / "secret").read_text() != "sibling secret":
            failed.append(f"{path!r} changed the secret beside the workspace")
        if (Path(str(planted) + "-evil") / "x").exists():
            failed.append(f"{path!r} made a file beside the workspace")
    assert not failed, f"{prim}: " + "; ".join(failed)


async def test_fifo_is_refused_without_blocking(docker_backend: DockerBackend, planted: Path) -> None:
    box = await docker_backend.get(planted)
    with pytest.raises(NotAFileError, match="FIFO"):
        await box.read("fifo")
    with pytest.raises(NotAFileError, match="FIFO"):
        await box.write("fifo", b"x")
    assert (await box.hash(["fifo"])) == {"fifo": None}
    listing = await box.list(".")
    assert {e.path: e.type for e in listing.entries}["fifo"] == "other"
    result = await box.search("root")  # must not hang on the FIFO
    assert [m.path for m in result.matches] == ["inside.txt"]


async def test_links_inside_the_workspace_are_followed(docker_backend: DockerBackend, planted: Path) -> None:
    box = await docker_backend.get(planted)
    assert (await box.read("link_inside")).data == b"root of all good\n"
    await box.write("link_inside", b"changed\n")
    assert (planted / "inside.txt").read_text() == "changed\n"
    assert (planted / "link_inside").is_symlink()
    st = await box.stat("link_inside")
    assert st.type == "symlink" and st.target == "inside.txt"


async def test_symlink_swap_after_resolution_cannot_redirect_writes(
    docker_backend: DockerBackend, user_workspace: Path
) -> None:
    """A command swaps a directory for a link while writes keep arriving: none lands outside."""
    box = await docker_backend.get(user_workspace)
    await box.write("d/f.txt", b"0")
    swapper = "for i in $(seq 1 300); do rm -rf d; ln -s /tmp d; sleep 0.001; rm -f d; mkdir d; done; rm -rf d; mkdir d"
    import asyncio

    async def writes() -> int:
        done = 0
        for i in range(300):
            try:
                await box.write("d/f.txt", str(i).encode(), mkdirs=False)
                done += 1
            except AgentError:
                pass
        return done

    shell = asyncio.create_task(box.exec(ExecRequest(swapper, timeout=60)))
    await writes()
    await shell
    r = await box.exec(ExecRequest("ls -A /tmp | grep -v '^.loom-activity$' || true"))
    assert r.stdout == b"", r.stdout
