"""File names that are not plain text (local and Docker).

A file name is bytes: a command can create one that is not UTF-8, or that holds a
newline, a double quote or a terminal escape. Every tool shows such a name quoted as git
does (``"bad\\377.txt"``), so a listing cannot be forged by a name and every result
encodes as UTF-8 JSON; every tool takes the quoted form back as a path; the changelog
records, shows and undoes such files.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from worker import ToolRegistry
from worker.changelog import Changelog
from worker.quoting import quote_path, unquote_path
from worker.result import ToolResult

NAMES = {
    b"bad\xff\xfe.txt": '"bad\\377\\376.txt"',
    b"new\nline.txt": '"new\\nline.txt"',
    b'say "hi".txt': '"say \\"hi\\".txt"',
    b"esc\x1b[31mred.txt": '"esc\\033[31mred.txt"',
    "caf\u00e9.txt".encode(): "caf\u00e9.txt",  # UTF-8 stays readable
}


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def any_backend(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture
async def recording(any_backend: Any, tmp_path: Path) -> AsyncIterator[tuple[ToolRegistry, list[Changelog]]]:
    """A ToolRegistry that records through the real changelog, and the changelogs it opened."""
    backend = any_backend
    opened: list[Changelog] = []

    def factory(root: Path) -> Changelog:
        cl = Changelog.open(tmp_path / "data", root)
        opened.append(cl)
        return cl

    yield ToolRegistry(backend=backend, recorder_factory=factory), opened
    for cl in opened:
        await cl.aclose()


def _encodes(r: ToolResult) -> dict[str, Any]:
    """The result as every surface sends it: strict UTF-8 JSON."""
    out: dict[str, Any] = json.loads(r.to_json().encode("utf-8"))
    return out


def _make(workspace: Path, name: bytes, content: bytes = b"needle\n") -> None:
    with open(os.path.join(os.fsencode(workspace), name), "wb") as f:
        f.write(content)


def _clear(workspace: Path) -> None:
    """Remove what one name's turn made (the next name's turn starts from an empty workspace)."""
    shutil.rmtree(os.path.join(os.fsencode(workspace), b"sub"), ignore_errors=True)
    for entry in os.listdir(os.fsencode(workspace)):
        os.unlink(os.path.join(os.fsencode(workspace), entry))


# Each test takes every name in turn in one sandbox (a sandbox per name and backend was
# most of this file's time), the workspace emptied between names.


async def test_listing_and_search_show_odd_names_quoted(registry: ToolRegistry, workspace: Path) -> None:
    for name, shown in NAMES.items():
        _make(workspace, name)
        _make(workspace, b"plain.txt", b"nothing\n")
        r = await registry.execute("list_directory", {"path": "."}, workspace)
        assert r.success, (name, r.error)
        expected = ["./", *(f"  {n}" for n in sorted([shown, "plain.txt"], key=unquote_path))]
        assert r.output.splitlines() == expected, name
        assert shown in [e["path"] for e in _encodes(r)["data"]["entries"]], name
        r = await registry.execute("search_files", {"pattern": "needle"}, workspace)
        assert r.success, (name, r.error)
        assert r.output == f"{shown}:1: needle", name
        assert _encodes(r)["data"]["matches"][0]["path"] == shown, name
        _clear(workspace)


async def test_the_shown_name_works_as_a_path(registry: ToolRegistry, workspace: Path) -> None:
    for name, shown in NAMES.items():
        _make(workspace, name, b"a = 1\n")
        r = await registry.execute("read_file", {"path": shown}, workspace)
        assert r.success, (name, r.error)
        assert "a = 1" in r.output and _encodes(r)["data"]["path"] == shown, name
        r = await registry.execute("edit_file", {"path": shown, "old_str": "a = 1", "new_str": "a = 2"}, workspace)
        assert r.success, (name, r.error)
        assert _encodes(r)["files_changed"] == [shown], name
        with open(os.path.join(os.fsencode(workspace), name), "rb") as f:  # noqa: ASYNC230 - test check
            assert f.read() == b"a = 2\n", name
        # In a directory, as list_directory shows it: dir/"name"
        os.mkdir(os.path.join(os.fsencode(workspace), b"sub"))
        _make(workspace / "sub", name, b"in sub\n")
        r = await registry.execute("read_file", {"path": f"sub/{shown}"}, workspace)
        assert r.success and "in sub" in r.output, (name, r.error)
        r = await registry.execute("write_file", {"path": f"sub/{shown}", "content": "rewritten\n"}, workspace)
        assert r.success, (name, r.error)
        assert (workspace / "sub" / os.fsdecode(name)).read_bytes() == b"rewritten\n", name
        _clear(workspace)


async def test_a_newline_in_a_name_cannot_forge_a_listing(registry: ToolRegistry, workspace: Path) -> None:
    _make(workspace, b"readme.txt\n  secrets.txt\n  passwords.txt")
    r = await registry.execute("list_directory", {"path": "."}, workspace)
    assert r.success, r.error
    assert r.output.splitlines() == ["./", '  "readme.txt\\n  secrets.txt\\n  passwords.txt"']


async def test_a_quoted_name_holding_a_slash_or_nul_is_refused(registry: ToolRegistry, workspace: Path) -> None:
    for bad in ['sub/"a\\057b"', 'sub/"a\\000b"', '"\\000"']:
        r = await registry.execute("read_file", {"path": bad}, workspace)
        assert not r.success and r.error


async def test_a_literal_quote_that_is_not_a_quoted_path_is_a_name(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("write_file", {"path": '"odd"name"', "content": "x"}, workspace)
    assert r.success, r.error
    assert (workspace / '"odd"name"').read_text() == "x"


@pytest.mark.parametrize("name", list(NAMES), ids=repr)
async def test_shell_changes_to_odd_names_are_recorded_shown_and_undone(
    recording: tuple[ToolRegistry, list[Changelog]], workspace: Path, name: bytes
) -> None:
    reg, opened = recording
    shown = NAMES[name]
    _make(workspace, b"seed", name)
    r = await reg.execute("shell_execute", {"command": "true"}, workspace)  # the baseline
    assert r.success, r.error
    r = await reg.execute("shell_execute", {"command": 'printf one > "$(cat seed)"'}, workspace)
    assert r.success, r.error
    assert _encodes(r)["files_changed"] == [shown]
    r = await reg.execute("shell_execute", {"command": "echo still works > x.txt"}, workspace)
    assert r.success and r.files_changed == ["x.txt"], r.error
    assert os.path.exists(os.path.join(os.fsencode(workspace), name))
    (cl,) = opened
    assert reg.backend is not None
    box = await reg.backend.get(workspace)
    diff = await cl.diff(box)
    assert f"+++ {quote_path('b/' + os.fsdecode(name))}" in diff.splitlines()
    await cl.undo(box, all=True)
    assert sorted(os.listdir(workspace)) == ["seed"]


def test_quoting_round_trips_every_byte() -> None:
    for b in range(1, 256):
        if b == ord("/"):
            continue
        name = os.fsdecode(b"x" + bytes([b]) + b"y")
        shown = quote_path(name)
        assert unquote_path(shown) == name, (b, shown)
        shown.encode("utf-8")  # always valid text
        assert "\n" not in shown and "\x1b" not in shown
