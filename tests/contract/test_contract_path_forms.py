"""Path forms in the file tools mean what they mean to the shell in the same sandbox
(issue 38): a trailing slash on a file or a directory, ``.`` and ``..`` segments (``..``
after a link is the parent of its target; after a file, Not a directory), doubled
slashes, the empty path. For every form, ``read_file``, ``write_file`` and ``edit_file``
give the answer ``cat``, ``tee`` and ``cat && sed -i`` give in the sandbox: the same file, or the
same error as the tool's error (never an internal one)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from worker import ToolRegistry

pytestmark = pytest.mark.asyncio

FORMS = [
    "a.txt",
    "a.txt/",
    "a.txt/.",
    "a.txt/..",
    "a.txt/../b.txt",
    "dir",
    "dir/",
    "dir/.",
    "dir/..",
    "dir/../a.txt",
    "dir/./c.txt",
    "dir//c.txt",
    ".//dir///c.txt",
    "./a.txt",
    "missing/../a.txt",
    "link/../a.txt",  # link -> sub/deep: sub/a.txt, not a.txt
    "link/c.txt",
    "link/",
    "/workspace/a.txt/",
    "/workspace/dir/../a.txt",
    "",
    "new.txt/",
    "dir/../new1.txt",
    "link/../new2.txt",
    "a.txt/../new3.txt",
    "missing/../new4.txt",
]

ERRORS = {  # what the shell says, and what the tool's error may say for it
    "Not a directory": ("not a directory",),
    "Is a directory": ("is a directory",),
    "No such file or directory": ("no such file", "not found"),
}


def _setup(ws: Path) -> None:
    (ws / "a.txt").write_text("top a\n")
    (ws / "b.txt").write_text("top b, a\n")
    (ws / "dir").mkdir()
    (ws / "dir" / "c.txt").write_text("dir c, a\n")
    (ws / "sub" / "deep").mkdir(parents=True)
    (ws / "sub" / "a.txt").write_text("sub a\n")
    (ws / "sub" / "deep" / "c.txt").write_text("deep c, a\n")
    (ws / "link").symlink_to("sub/deep")


def _shell_error(stderr: str) -> str | None:
    for phrase in ERRORS:
        if phrase.lower() in stderr.lower():
            return phrase
    return None


async def _sh(registry: ToolRegistry, ws: Path, command: str) -> dict[str, Any]:
    r = await registry.execute("shell_execute", {"command": command}, workspace=str(ws))
    assert r.data is not None and "exit_code" in r.data, r.output
    return r.data


def _in_shell(path: str) -> str:
    """``path`` for the shell, whose cwd is the workspace: ``/workspace/...`` as is (the
    local backend has no /workspace: there it is made relative)."""
    return shlex.quote(path)


async def _check(registry: ToolRegistry, ws: Path, tool: str, path: str, shell: str) -> None:
    """Run ``shell`` (the shell's version of the call, on a copy of the tree) and the
    tool on the workspace: same success, same error, same resulting tree."""
    copy = await _sh(
        registry,
        ws,
        "rm -rf /tmp/forms && mkdir /tmp/forms && cp -a . /tmp/forms/ws && cd /tmp/forms/ws && "
        f'{shell}; echo "rc=$?"; find . -type f -exec cat {{}} + | sort | md5sum',
    )
    out = copy["stdout"]
    ok = "rc=0" in out
    args: dict[str, Any] = {"path": path}
    if tool == "write_file":
        args["content"] = "X\n"
    elif tool == "edit_file":
        args.update(old_str="a", new_str="A")
    r = await registry.execute(tool, args, workspace=str(ws))
    assert r.data is None or r.data.get("error_kind") != "infrastructure", (tool, path, r.output)
    if ok:
        assert r.success, (tool, path, r.output, copy)
        if tool == "read_file":
            assert r.output.startswith(out.split("rc=")[0].split("\n")[0]), (path, r.output, out)
    else:
        phrase = _shell_error(copy["stderr"])
        assert phrase is not None, (tool, path, copy)
        assert not r.success, (tool, path, r.output, copy["stderr"])
        assert any(p in r.output.lower() for p in ERRORS[phrase]), (tool, path, r.output, copy["stderr"])
    if tool != "read_file":
        tree = await _sh(registry, ws, "find . -type f -exec cat {} + | sort | md5sum")
        assert tree["stdout"] == out.split("\n")[-2] + "\n", (tool, path, r.output, copy)


@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file"])
async def test_path_forms_mean_what_they_mean_to_the_shell(registry: ToolRegistry, workspace: Path, tool: str) -> None:
    _setup(workspace)
    local = (await registry.execute("shell_execute", {"command": "test -d /workspace"}, workspace=str(workspace))).data
    for form in FORMS:
        path = form
        if form.startswith("/workspace") and local and local["exit_code"] != 0:
            path = str(workspace) + form[len("/workspace") :]  # the local backend: the host's path
        if tool == "read_file" and "new" in form:
            continue
        shell_path = path
        shell = {
            "read_file": f"cat {_in_shell(shell_path)}",
            "write_file": f"printf 'X\\n' | tee {_in_shell(shell_path)} >/dev/null",
            # edit_file reads the file first, as cat does (busybox's sed -i of a
            # directory reads it as empty and fails on the rename instead).
            "edit_file": f"cat {_in_shell(shell_path)} >/dev/null && sed -i 's/a/A/' {_in_shell(shell_path)}",
        }[tool]
        if path.startswith("/"):
            # The shell's absolute path is the workspace's own; on the copy, the copy's.
            rel = path[len(str(workspace)) + 1 :] if path.startswith(str(workspace)) else path[len("/workspace/") :]
            shell = shell.replace(_in_shell(path), _in_shell(rel))
        await _check(registry, workspace, tool, path, shell)
        _reset(workspace)


def _reset(ws: Path) -> None:
    for p in list(ws.iterdir()):
        if p.is_symlink() or p.is_file():
            p.unlink()
        else:
            import shutil

            shutil.rmtree(p)
    _setup(ws)
