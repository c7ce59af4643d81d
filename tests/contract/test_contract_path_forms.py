"""Path forms in the file tools mean what they mean to the shell in the same sandbox
(issue 38): a trailing slash on a file or a directory, ``.`` and ``..`` segments (``..``
after a link is the parent of its target; after a file, Not a directory), doubled
slashes, the empty path. For every form, ``read_file``, ``write_file`` and ``edit_file``
give the answer ``cat``, ``tee`` and ``cat && sed -i`` give in the sandbox: the same file, or the
same error as the tool's error (never an internal one)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass
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
    r = await registry.execute("shell_execute", {"command": command, "timeout": 300}, workspace=str(ws))
    assert r.data is not None and "exit_code" in r.data, r.output
    return r.data


def _in_shell(path: str) -> str:
    """``path`` for the shell, whose cwd is the workspace: ``/workspace/...`` as is (the
    local backend has no /workspace: there it is made relative)."""
    return shlex.quote(path)


@dataclass
class _ShellSays:
    """What the shell's version of one call did, on a copy of the tree."""

    ok: bool
    first_line: str
    stderr: str
    tree: dict[str, str]  # "./path" -> md5 of every regular file (find -type f)


async def _shell_answers(registry: ToolRegistry, ws: Path, shells: list[str]) -> list[_ShellSays]:
    """Every form's shell version, each on its own copy of the tree, in one command (a
    command per form started ~10 processes, each ~20 ms under gVisor)."""
    lines = ["top=$PWD", "rm -rf /tmp/forms && mkdir /tmp/forms || exit 99"]
    for i, shell in enumerate(shells):
        lines.append(
            f"cp -a . /tmp/forms/{i} && cd /tmp/forms/{i} && {{ {shell}; }} >/tmp/forms/{i}.out 2>/tmp/forms/{i}.err; "
            f'echo "rc {i} $?"; cd "$top" || exit 99'
        )
    lines.append("cd /tmp/forms && find . -type f -exec md5sum {} + && grep -H '' ./*.out ./*.err; true")
    out = (await _sh(registry, ws, "\n".join(lines)))["stdout"]
    rcs: dict[int, int] = {}
    trees: dict[int, dict[str, str]] = {i: {} for i in range(len(shells))}
    texts: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("rc "):
            _, i, rc = line.split()
            rcs[int(i)] = int(rc)
        elif m := re.match(r"(\./\d+\.(?:out|err)):(.*)", line):
            texts.setdefault(m[1], []).append(m[2])
        else:
            digest, _, path = line.partition("  ")
            top, _, rel = path[2:].partition("/")
            if top.isdigit():
                trees[int(top)]["./" + rel] = digest
    assert sorted(rcs) == list(range(len(shells))), out
    return [
        _ShellSays(rcs[i] == 0, (texts.get(f"./{i}.out") or [""])[0], "\n".join(texts.get(f"./{i}.err", [])), trees[i])
        for i in range(len(shells))
    ]


def _tree(ws: Path) -> dict[str, str]:
    """``find . -type f -exec md5sum {} +`` of ``ws``, on the host."""
    out = {}
    for d, _dirs, files in os.walk(ws):
        for name in files:
            p = Path(d, name)
            if p.is_file() and not p.is_symlink():
                out["./" + str(p.relative_to(ws))] = hashlib.md5(p.read_bytes()).hexdigest()
    return out


async def _check(registry: ToolRegistry, ws: Path, tool: str, path: str, said: _ShellSays) -> None:
    """The tool on the workspace against the shell's version on a copy: same success, same
    error, same resulting tree."""
    args: dict[str, Any] = {"path": path}
    if tool == "write_file":
        args["content"] = "X\n"
    elif tool == "edit_file":
        args.update(old_str="a", new_str="A")
    r = await registry.execute(tool, args, workspace=str(ws))
    assert r.data is None or r.data.get("error_kind") != "infrastructure", (tool, path, r.output)
    if said.ok:
        assert r.success, (tool, path, r.output, said)
        if tool == "read_file":
            assert r.output.startswith(said.first_line), (path, r.output, said)
    else:
        phrase = _shell_error(said.stderr)
        assert phrase is not None, (tool, path, said)
        assert not r.success, (tool, path, r.output, said.stderr)
        assert any(p in r.output.lower() for p in ERRORS[phrase]), (tool, path, r.output, said.stderr)
    if tool != "read_file":
        assert _tree(ws) == said.tree, (tool, path, r.output, said)


@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file"])
async def test_path_forms_mean_what_they_mean_to_the_shell(registry: ToolRegistry, workspace: Path, tool: str) -> None:
    _setup(workspace)
    local = (await registry.execute("shell_execute", {"command": "test -d /workspace"}, workspace=str(workspace))).data
    calls: list[tuple[str, str]] = []  # (the tool's path, the shell's command)
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
        calls.append((path, shell))
    # (the shell's versions first, on copies of the tree as it is now: each call below
    # is followed by a reset to it)
    answers = await _shell_answers(registry, workspace, [shell for _, shell in calls])
    for (path, _shell), said in zip(calls, answers, strict=True):
        await _check(registry, workspace, tool, path, said)
        _reset(workspace)


def _reset(ws: Path) -> None:
    for p in list(ws.iterdir()):
        if p.is_symlink() or p.is_file():
            p.unlink()
        else:
            import shutil

            shutil.rmtree(p)
    _setup(ws)
