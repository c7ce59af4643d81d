"""Every way out of the workspace is refused by all five file tools, and nothing outside
is read, created or changed. The lexical forms are refused on the host; the link forms
by the in-container agent."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from worker import ToolRegistry

SECRET = "top secret outside the workspace\n"


@pytest.fixture
def outside(workspace: Path) -> Iterator[Path]:
    """A directory beside the workspace whose name shares its prefix (``ws`` / ``ws-evil``)."""
    d = Path(str(workspace) + "-evil")
    d.mkdir()
    (d / "secret.txt").write_text(SECRET)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _link(target: Path | str, at: Path) -> None:
    if not os.path.lexists(at):  # (two forms use the same link)
        os.symlink(target, at)


def _escape_path(form: str, workspace: Path, outside: Path) -> str:
    """Set up ``form`` in the workspace (each form's link has a name of its own, so every
    form can be set up in one workspace); return the path argument that tries to leave."""
    if form == "dotdot":
        return "../" + outside.name + "/secret.txt"
    if form == "bare_dotdot":
        return ".."
    if form == "absolute_outside":
        return str(outside / "secret.txt")
    if form == "etc":
        return "/etc/passwd"
    if form == "newdir_dotdot":
        return "newdir/../../" + outside.name + "/secret.txt"
    if form == "sibling_prefix":
        return str(outside / "secret.txt")  # /tmp/loom-ws-x-evil is not inside /tmp/loom-ws-x
    if form == "symlink_file":
        _link(outside / "secret.txt", workspace / "link.txt")
        return "link.txt"
    if form == "symlink_relative":
        _link("../" + outside.name + "/secret.txt", workspace / "rel.txt")
        return "rel.txt"
    if form == "symlinked_dir":
        _link(outside, workspace / "linkdir")
        return "linkdir/secret.txt"
    if form == "symlinked_dir_itself":
        _link(outside, workspace / "linkdir")
        return "linkdir"
    if form == "dangling":
        _link(outside / "created-by-escape.txt", workspace / "dangling.txt")
        return "dangling.txt"
    raise AssertionError(form)


FORMS = [
    "dotdot",
    "bare_dotdot",
    "absolute_outside",
    "etc",
    "newdir_dotdot",
    "sibling_prefix",
    "symlink_file",
    "symlink_relative",
    "symlinked_dir",
    "symlinked_dir_itself",
    "dangling",
]


def _args(tool: str, path: str) -> dict[str, Any]:
    if tool == "write_file":
        return {"path": path, "content": "pwned\n"}
    if tool == "edit_file":
        return {"path": path, "old_str": "top secret", "new_str": "pwned"}
    if tool == "search_files":
        return {"pattern": "secret", "path": path}
    return {"path": path}


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file", "search_files", "list_directory"])
async def test_escape_is_refused(registry: ToolRegistry, workspace: Path, outside: Path, tool: str) -> None:
    """Every form, one after another in one sandbox (a sandbox per form and backend was
    most of this suite's time): each refused as a safety violation, nothing outside read,
    made or changed; every form that was not is named."""
    failed = []
    for form in FORMS:
        before = _snapshot(outside)
        path = _escape_path(form, workspace, outside)
        r = await registry.execute(tool, _args(tool, path), workspace)
        if r.success:
            failed.append(f"{form} {path!r} succeeded: {r.output[:300]}")
        elif r.error is None or "Safety violation" not in r.error:
            failed.append(f"{form} {path!r} failed for another reason: {r.error}")
        if "top secret" in r.output or "top secret" in r.to_json():
            failed.append(f"{form} {path!r} showed the secret")
        if _snapshot(outside) != before or (outside / "secret.txt").read_text() != SECRET:
            failed.append(f"{form} {path!r} changed what is outside")
        if (outside / "created-by-escape.txt").exists():
            failed.append(f"{form} {path!r} made a file outside")
    assert not failed, f"{tool}: " + "; ".join(failed)


async def test_edit_empty_old_str_through_dangling_link_creates_nothing(
    registry: ToolRegistry, workspace: Path, outside: Path
) -> None:
    os.symlink(outside / "created-by-escape.txt", workspace / "dangling.txt")
    r = await registry.execute("edit_file", {"path": "dangling.txt", "old_str": "", "new_str": "x"}, workspace)
    assert not r.success and r.error is not None and "Safety violation" in r.error
    assert not (outside / "created-by-escape.txt").exists()


async def test_symlink_inside_workspace_is_followed(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "real" / "f.txt").write_text("inside\n")
    os.symlink("real", workspace / "alias")
    r = await registry.execute("read_file", {"path": "alias/f.txt"}, workspace)
    assert r.success and r.output == "inside\n"


async def test_search_does_not_follow_links_out(registry: ToolRegistry, workspace: Path, outside: Path) -> None:
    os.symlink(outside, workspace / "linkdir")
    os.symlink(outside / "secret.txt", workspace / "link.txt")
    (workspace / "own.txt").write_text("my secret is safe\n")
    r = await registry.execute("search_files", {"pattern": "secret"}, workspace)
    assert r.success, r.error
    assert r.data is not None and [m["path"] for m in r.data["matches"]] == ["own.txt"]
    assert "top secret" not in r.output


async def test_shell_cwd_escape_is_refused(registry: ToolRegistry, workspace: Path, outside: Path) -> None:
    os.symlink(outside, workspace / "linkdir")
    for cwd in ("..", str(outside), "linkdir"):
        r = await registry.execute("shell_execute", {"command": "touch pwned", "cwd": cwd}, workspace)
        assert not r.success and r.error is not None and "Safety violation" in r.error, (cwd, r.error)
    assert not (outside / "pwned").exists()
