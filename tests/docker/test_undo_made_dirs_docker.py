"""Directories the tools and commands made are undone, on the real engine (runc and gVisor).

A session that makes nested directories every way an agent does: ``write_file`` and
``edit_file`` (a new file in new directories, beside existing ones with their own modes),
a command's ``mkdir -p`` (and a ``chmod`` of what it made), and OpenAI's ``apply_patch``
(a file added under new directories, a file moved into them). ``undo --all`` must give
back the exact tree there was: paths, kinds, permission bits, bytes. And a directory
whose undo finds something else still in it is kept, with the reason.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import own_registry
from tests.treehash import tree_diff, tree_state
from worker.native import apply_envelope, run_openai

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.gvisor)]

ENVELOPE = """*** Begin Patch
*** Add File: patched/a/b/notes.md
+# Notes
*** Update File: src/a.py
*** Move to: moved/deep/a.py
@@
-A = 1
+A = 2
*** End Patch
"""


@pytest.fixture(params=RUNTIMES)
async def env(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[tuple[Any, Path]]:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("A = 1\n")
    (ws / "keep.txt").write_text("keep\n")
    (ws / "empty").mkdir()
    for p in [ws, *ws.rglob("*")]:
        os.lchown(p, 1000, 1000)
    # Modes that differ from what a tool or a command would make, so the check has teeth.
    (ws / "src").chmod(0o750)
    (ws / "src" / "a.py").chmod(0o640)
    (ws / "keep.txt").chmod(0o600)
    (ws / "empty").chmod(0o700)
    async with own_registry(tmp_path, request.param) as registry:
        yield registry, ws


async def _call(registry: Any, ws: Path, tool: str, args: dict[str, Any], call_id: str) -> None:
    r = await registry.execute(tool, args, ws, call_id=call_id)
    assert r.success, (tool, r.error, r.output)


async def test_a_session_that_made_nested_directories_is_undone_to_the_exact_tree(env: tuple[Any, Path]) -> None:
    registry, ws = env
    before = tree_state(ws)
    await _call(registry, ws, "write_file", {"path": "new/deep/f.txt", "content": "one\n"}, "write")
    await _call(registry, ws, "write_file", {"path": "src/pkg/sub/mod.py", "content": "X = 1\n"}, "write-in-src")
    await _call(
        registry, ws, "edit_file", {"path": "new/deep/f.txt", "edits": [{"old_str": "one", "new_str": "two"}]}, "edit"
    )
    await _call(
        registry, ws, "edit_file", {"path": "edits/x/e.txt", "edits": [{"old_str": "", "new_str": "e\n"}]}, "edit-new"
    )
    await _call(
        registry,
        ws,
        "shell_execute",
        {"command": "mkdir -p build/x/y empty/in && printf o > build/x/y/out.o && chmod 700 build/x"},
        "mkdir",
    )
    out = await run_openai(
        registry,
        {
            "type": "apply_patch_call",
            "id": "apc_1",
            "call_id": "patch-op",
            "status": "completed",
            "operation": {"type": "create_file", "path": "op/one/two/x.txt", "diff": "+x\n"},
        },
        workspace=ws,
    )
    assert out["status"] == "completed", out
    result = await apply_envelope(registry, ENVELOPE, workspace=ws, call_id="patch")
    assert result.success, result.error
    # A command after the tools records nothing of the directories they made.
    await _call(registry, ws, "shell_execute", {"command": "true"}, "after")
    w = await registry.workspace(ws)
    entries = await w.recorder.log()
    made = sorted(e.path for e in entries if e.op == "create" and e.after_kind == "dir")
    assert made == [
        "build",
        "build/x",
        "build/x/y",
        "edits",
        "edits/x",
        "empty/in",
        "moved",
        "moved/deep",
        "new",
        "new/deep",
        "op",
        "op/one",
        "op/one/two",
        "patched",
        "patched/a",
        "patched/a/b",
        "src/pkg",
        "src/pkg/sub",
    ]
    assert not [e for e in entries if e.call_id == "after"], entries
    preview = await w.recorder.undo(w.sandbox, all=True, dry_run=True)
    assert {s.status for s in preview.steps} == {"would_revert"}, preview.steps
    undone = await w.recorder.undo(w.sandbox, all=True)
    assert {s.status for s in undone.steps} == {"reverted"}, undone.steps
    assert tree_state(ws) == before, tree_diff(before, tree_state(ws))


async def test_a_made_directory_with_a_later_file_in_it_is_kept_with_the_reason(env: tuple[Any, Path]) -> None:
    registry, ws = env
    before = tree_state(ws)
    await _call(registry, ws, "write_file", {"path": "new/deep/f.txt", "content": "one\n"}, "write")
    await _call(registry, ws, "shell_execute", {"command": "printf x > new/deep/x.txt"}, "later")
    w = await registry.workspace(ws)
    later = next(e.id for e in await w.recorder.log() if e.path == "new/deep/x.txt")
    why = f"kept new/deep/: not empty (new/deep/x.txt was added by a later change, entry {later}, call later)"
    preview = await w.recorder.undo(w.sandbox, call_id="write", dry_run=True)
    kept = [("new/deep", why), ("new", "kept new/: not empty (new/deep/ stays, not empty)")]
    assert [(s.path, s.message) for s in preview.steps if s.status == "kept"] == kept, preview.steps
    result = await w.recorder.undo(w.sandbox, call_id="write")
    assert [(s.path, s.message) for s in result.steps if s.status == "kept"] == kept, result.steps
    assert not (ws / "new/deep/f.txt").exists() and (ws / "new/deep/x.txt").read_bytes() == b"x"
    await w.recorder.undo(w.sandbox, all=True)
    assert tree_state(ws) == before, tree_diff(before, tree_state(ws))
