"""``edit_file`` with an empty ``old_str`` (issue 24, item 3): it creates a missing file, and
is refused on an existing one (also inside ``edits``, with and without ``replace_all``) with
nothing changed: neither the file nor the changelog. The same on the real engine:
tests/contract/test_contract_edit_issue24.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from worker.changelog import Changelog
from worker.registry import ToolRegistry

REFUSALS: list[dict[str, Any]] = [
    {"old_str": "", "new_str": "X"},
    {"edits": [{"old_str": "", "new_str": "X"}]},
    {"edits": [{"old_str": "", "new_str": "X", "replace_all": True}]},
    {"edits": [{"old_str": "", "new_str": "X", "replace_all": False}]},
    {"edits": [{"old_str": "a", "new_str": "A"}, {"old_str": "", "new_str": "X"}]},
    {"edits": [{"old_str": "b", "new_str": "B"}, {"old_str": "", "new_str": "X", "replace_all": True}]},
]


@pytest.fixture
async def recorded(local_backend: Any, tmp_path: Path) -> AsyncIterator[tuple[ToolRegistry, list[Changelog]]]:
    logs: list[Changelog] = []

    def factory(root: Path) -> Changelog:
        logs.append(Changelog.open(tmp_path / "data", root))
        return logs[-1]

    reg = ToolRegistry(backend=local_backend, recorder_factory=factory)
    yield reg, logs
    await reg.aclose()
    for cl in logs:
        await cl.aclose()


async def test_refused_on_an_existing_file_and_nothing_changes(
    recorded: tuple[ToolRegistry, list[Changelog]], workspace: Path
) -> None:
    reg, logs = recorded
    ws = await reg.workspace(workspace)
    for content in ("abc", ""):
        for remembered in (False, True):  # the edit reads the file / starts from memory
            for args in REFUSALS:
                r = await reg.execute("write_file", {"path": "a.txt", "content": content}, workspace)
                assert r.success, r.error
                if not remembered:
                    ws.forget(None)
                before = await logs[0].log()
                r = await reg.execute("edit_file", {"path": "a.txt", **args}, workspace)
                case = (content, remembered, args)
                assert not r.success and r.error is not None, case
                assert "old_str is empty" in r.error and "a.txt already exists" in r.error, (case, r.error)
                assert "non-empty old_str" in r.error and "write_file" in r.error, r.error
                assert "Nothing was changed" in r.error and r.files_changed == []
                assert (workspace / "a.txt").read_text() == content, case
                assert await logs[0].log() == before, case


async def test_creates_a_missing_file(recorded: tuple[ToolRegistry, list[Changelog]], workspace: Path) -> None:
    reg, logs = recorded
    r = await reg.execute("edit_file", {"path": "d/new.txt", "old_str": "", "new_str": "one\n"}, workspace)
    assert r.success and r.data is not None and r.data["created"] is True and r.files_changed == ["d/new.txt"]
    assert (workspace / "d/new.txt").read_text() == "one\n"
    # In edits: the first one creates the file, the next ones edit what it created.
    edits = [{"old_str": "", "new_str": "abc\n"}, {"old_str": "b", "new_str": "B"}]
    r = await reg.execute("edit_file", {"path": "e.txt", "edits": edits}, workspace)
    assert r.success and (workspace / "e.txt").read_text() == "aBc\n"
    made = [("d", "create"), ("d/new.txt", "create"), ("e.txt", "create")]  # d: made for d/new.txt
    assert [(e.path, e.op) for e in await logs[0].log()] == made


async def test_a_second_empty_old_str_on_a_missing_file_is_refused(
    recorded: tuple[ToolRegistry, list[Changelog]], workspace: Path
) -> None:
    reg, logs = recorded
    edits = [{"old_str": "", "new_str": "abc"}, {"old_str": "", "new_str": "X"}]
    r = await reg.execute("edit_file", {"path": "n.txt", "edits": edits}, workspace)
    assert not r.success and r.error is not None and r.error.startswith("edit 2: old_str is empty"), r.error
    assert not (workspace / "n.txt").exists()
    assert logs == [] or await logs[0].log() == []


async def test_the_schema_says_so(local_backend: Any) -> None:
    tool = ToolRegistry(backend=local_backend).get("edit_file")
    assert tool is not None
    params = tool.parameters()["properties"]
    assert "refused for an existing one" in params["old_str"]["description"]
    assert "Empty only in the first edit" in params["edits"]["items"]["properties"]["old_str"]["description"]
    assert "refused for an existing one" in tool.description
