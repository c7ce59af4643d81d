"""The vendors' own tools (worker.native) on the real engine, under runc and gVisor.

Anthropic's bash session and text editor, OpenAI's shell and apply_patch, each through
the vendor-block entry points (run_anthropic / run_openai) on a default registry: the
persistent shell's state and its restart, a hung command, the editor's commands and
every error message (from the reference implementation's wording), V4A scenarios, and
the changelog's record and undo of each.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import own_registry
from worker.native import apply_envelope, run_anthropic, run_openai
from worker.native.bash import MAX_OUTPUT

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.gvisor)]
_ids = itertools.count(1)


class Env:
    def __init__(self, registry: Any, ws: Path) -> None:
        self.registry = registry
        self.ws = ws

    async def bash(
        self, command: str | None = None, *, restart: bool = False, timeout: float | None = None
    ) -> tuple[str, bool, str]:
        """(text, is_error, tool_use id)."""
        inp: dict[str, Any] = {} if command is None else {"command": command}
        if restart:
            inp["restart"] = True
        tid = f"toolu_{next(_ids):04d}"
        block = {"type": "tool_use", "id": tid, "name": "bash", "input": inp}
        r = await run_anthropic(self.registry, block, workspace=self.ws, bash_timeout=timeout)
        assert r["type"] == "tool_result" and r["tool_use_id"] == tid
        return "".join(c["text"] for c in r["content"]), r["is_error"], tid

    async def edit(self, **inp: Any) -> tuple[str, bool, str]:
        tid = f"toolu_{next(_ids):04d}"
        block = {"type": "tool_use", "id": tid, "name": "str_replace_based_edit_tool", "input": inp}
        r = await run_anthropic(self.registry, block, workspace=self.ws)
        return "".join(c["text"] for c in r["content"]), r["is_error"], tid

    async def patch_op(self, op: dict[str, Any]) -> dict[str, Any]:
        item = {
            "type": "apply_patch_call",
            "id": "apc_1",
            "call_id": f"call_{next(_ids):04d}",
            "status": "completed",
            "operation": op,
        }
        return await run_openai(self.registry, item, workspace=self.ws)

    async def shell(self, commands: list[str], **action: Any) -> dict[str, Any]:
        item = {
            "type": "shell_call",
            "id": "sh_1",
            "call_id": f"call_{next(_ids):04d}",
            "status": "completed",
            "action": {"commands": commands, **action},
        }
        return await run_openai(self.registry, item, workspace=self.ws)

    async def undo(self, call_id: str) -> Any:
        ws = await self.registry.workspace(self.ws)
        return await ws.recorder.undo(ws.sandbox, call_id=call_id)

    async def log(self, call_id: str) -> list[Any]:
        ws = await self.registry.workspace(self.ws)
        return list(await ws.recorder.log(call_id=call_id))


@pytest.fixture(params=RUNTIMES)
async def env(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[Env]:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with own_registry(tmp_path, request.param) as registry:
        yield Env(registry, ws)


# -- bash ---------------------------------------------------------------------------------


async def test_the_shell_keeps_cwd_exports_and_functions_until_restarted(env: Env) -> None:
    assert (await env.bash('cd /tmp && export GREETING=hello && say() { echo "$GREETING $1"; }'))[:2] == ("", False)
    assert (await env.bash("pwd; say world"))[:2] == ("/tmp\nhello world", False)
    assert (await env.bash(restart=True))[:2] == ("tool has been restarted.", False)
    text, is_error, _ = await env.bash('pwd; echo "[$GREETING]"; type say || echo no-say')
    assert not is_error
    assert text.splitlines()[:2] == ["/workspace", "[]"] and text.endswith("no-say")


async def test_stdin_no_final_newline_stderr_and_exit_codes(env: Env) -> None:
    assert (await env.bash("cat; echo after-cat"))[:2] == ("after-cat", False)  # stdin is /dev/null
    assert (await env.bash('read x; echo "read=$?"'))[:2] == ("read=1", False)
    assert (await env.bash("printf no-newline"))[:2] == ("no-newline", False)
    assert (await env.bash("echo out; echo err >&2; false"))[:2] == ("out\nerr", False)
    assert (await env.bash("set -x"))[1] is False
    text, is_error, _ = await env.bash("echo still-here")  # xtrace shows the command, not the protocol
    assert not is_error and text.endswith("echo still-here\nstill-here") and "loom" not in text.lower(), text
    assert (await env.bash("set +x; echo quiet"))[0].endswith("quiet")
    assert (await env.bash("echo traced-no-more"))[:2] == ("traced-no-more", False)
    assert (await env.bash("if then"))[1] is False  # a syntax error is the command's output
    assert (await env.bash("echo alive"))[:2] == ("alive", False)
    assert (await env.bash())[:2] == ("no command provided.", True)


async def test_background_jobs_run_on_and_print_into_later_calls(env: Env) -> None:
    text, is_error, _ = await env.bash("(sleep 0.3; echo from-the-job) & echo started")
    assert (text, is_error) == ("started", False)
    text, _e, _ = await env.bash("sleep 1; echo next")
    assert "from-the-job" in text and text.endswith("next")


async def test_a_hung_command_ends_with_the_restart_message_and_leaves_no_process(env: Env) -> None:
    text, is_error, _ = await env.bash("sleep 1000 & sleep 999", timeout=2)
    assert is_error and text == "timed out: bash has not returned in 2.0 seconds and must be restarted"
    # As the reference does, the tool says so until it is restarted.
    assert (await env.bash("echo hi"))[:2] == (text, True)
    ps = await env.registry.execute("shell_execute", {"command": "ps -eo args"}, env.ws)
    assert "sleep 1000" not in ps.output and "sleep 999" not in ps.output, ps.output
    assert (await env.bash(restart=True))[:2] == ("tool has been restarted.", False)
    assert (await env.bash("echo back"))[:2] == ("back", False)


async def test_exit_ends_the_session_and_the_tool_must_be_restarted(env: Env) -> None:
    text, is_error, _ = await env.bash("echo bye; exit 3")
    assert is_error and text == "<system>tool must be restarted</system>\nbye\nbash has exited with returncode 3"
    text, is_error, _ = await env.bash("echo again")
    assert is_error and text.endswith("bash has exited with returncode 3")
    await env.bash(restart=True)
    assert (await env.bash("echo ok"))[:2] == ("ok", False)


async def test_output_over_the_cap_is_cut_in_the_middle(env: Env) -> None:
    text, is_error, _ = await env.bash("seq 1 20000; echo THE-END")
    assert not is_error
    assert text.startswith("1\n2\n3\n") and text.endswith("19999\n20000\nTHE-END")
    assert "bytes of output omitted (limit 30720 bytes per call)" in text
    assert len(text.encode()) < MAX_OUTPUT + 200


async def test_each_command_s_changes_are_its_own_undoable_entries(env: Env) -> None:
    (env.ws / "keep.txt").write_text("original\n")
    _t, _e, first = await env.bash("echo made > new.txt && echo changed > keep.txt")
    _t, _e, second = await env.bash("rm keep.txt")
    assert not (env.ws / "keep.txt").exists()
    assert {e.path for e in await env.log(first)} >= {"new.txt", "keep.txt"}
    assert [e.path for e in await env.log(second)] == ["keep.txt"]
    await env.undo(second)
    assert (env.ws / "keep.txt").read_text() == "changed\n"
    await env.undo(first)
    assert (env.ws / "keep.txt").read_text() == "original\n" and not (env.ws / "new.txt").exists()


# -- the text editor ----------------------------------------------------------------------

#: (input, expected text, is_error) run in order on a workspace holding a.py (3 lines) and
#: dir/: the wording is the reference implementation's (anthropic-quickstarts edit.py).
EDITOR_CASES: list[tuple[dict[str, Any], str, bool]] = [
    (
        {"command": "view", "path": "/workspace/a.py"},
        "Here's the result of running `cat -n` on /workspace/a.py:\n     1\tdef f():\n     2\t    return 1\n     3\t\n",
        False,
    ),
    (
        {"command": "view", "path": "/workspace/a.py", "view_range": [2, -1]},
        "Here's the result of running `cat -n` on /workspace/a.py:\n     2\t    return 1\n     3\t\n",
        False,
    ),
    (
        {"command": "view", "path": "/workspace/a.py", "view_range": [0, 2]},
        "Invalid `view_range`: [0, 2]. Its first element `0` should be within the range of lines of the file: [1, 3]",
        True,
    ),
    (
        {"command": "view", "path": "/workspace/a.py", "view_range": [1, 9]},
        "Invalid `view_range`: [1, 9]. Its second element `9` should be smaller than the number of lines in the "
        "file: `3`",
        True,
    ),
    (
        {"command": "view", "path": "/workspace/a.py", "view_range": [3, 2]},
        "Invalid `view_range`: [3, 2]. Its second element `2` should be larger or equal than its first `3`",
        True,
    ),
    (
        {"command": "view", "path": "/workspace/a.py", "view_range": [1]},
        "Invalid `view_range`. It should be a list of two integers.",
        True,
    ),
    (
        {"command": "view", "path": "a.py"},
        "The path a.py is not an absolute path, it should start with `/`. Maybe you meant /workspace/a.py?",
        True,
    ),
    (
        {"command": "view", "path": "/workspace/nope.py"},
        "The path /workspace/nope.py does not exist. Please provide a valid path.",
        True,
    ),
    ({"command": "view", "path": "/etc/passwd"}, "Safety violation: Path '/etc/passwd' is outside the workspace", True),
    (
        {"command": "create", "path": "/workspace/a.py", "file_text": "x"},
        "File already exists at: /workspace/a.py. Cannot overwrite files using command `create`.",
        True,
    ),
    ({"command": "create", "path": "/workspace/b.py"}, "Parameter `file_text` is required for command: create", True),
    (
        {"command": "str_replace", "path": "/workspace/dir", "old_str": "x"},
        "The path /workspace/dir is a directory and only the `view` command can be used on directories",
        True,
    ),
    (
        {"command": "str_replace", "path": "/workspace/a.py"},
        "Parameter `old_str` is required for command: str_replace",
        True,
    ),
    (
        {"command": "str_replace", "path": "/workspace/a.py", "old_str": "return 2", "new_str": "x"},
        "No replacement was performed, old_str `return 2` did not appear verbatim in /workspace/a.py.",
        True,
    ),
    (
        {"command": "insert", "path": "/workspace/a.py", "insert_text": "x"},
        "Parameter `insert_line` is required for command: insert",
        True,
    ),
    (
        {"command": "insert", "path": "/workspace/a.py", "insert_line": 1},
        "Parameter `insert_text` is required for command: insert",
        True,
    ),
    (
        {"command": "insert", "path": "/workspace/a.py", "insert_line": 4, "insert_text": "x"},
        "Invalid `insert_line` parameter: 4. It should be within the range of lines of the file: [0, 3]",
        True,
    ),
    (
        {"command": "undo_edit", "path": "/workspace/a.py"},
        "Unrecognized command undo_edit. The allowed commands for the str_replace_based_edit_tool tool are: "
        "view, create, str_replace, insert",
        True,
    ),
    (
        {"command": "view", "path": "/workspace/dir", "view_range": [1, 2]},
        "The `view_range` parameter is not allowed when `path` points to a directory.",
        True,
    ),
]


async def test_editor_views_and_every_error_message(env: Env) -> None:
    (env.ws / "a.py").write_text("def f():\n    return 1\n")
    (env.ws / "dir").mkdir()
    for inp, expected, is_error in EDITOR_CASES:
        text, err, _ = await env.edit(**inp)
        assert (text, err) == (expected, is_error), inp
    assert (env.ws / "a.py").read_text() == "def f():\n    return 1\n"  # no failed command changed it


async def test_editor_view_of_a_directory_lists_two_levels_without_hidden_entries(env: Env) -> None:
    for rel in ("src/pkg/deep/x.py", "src/main.py", ".git/config", "src/.hidden", "README.md"):
        (env.ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (env.ws / rel).write_text("x\n")
    text, is_error, _ = await env.edit(command="view", path="/workspace")
    assert not is_error
    assert text == (
        "Here's the files and directories up to 2 levels deep in /workspace, excluding hidden items:\n"
        "/workspace\n/workspace/README.md\n/workspace/src\n/workspace/src/main.py\n/workspace/src/pkg\n"
    )


async def test_editor_edits_are_recorded_and_each_is_undoable(env: Env) -> None:
    (env.ws / "m.py").write_text("a = 1\nb = 2\nb = 2\n")
    text, is_error, created = await env.edit(command="create", path="/workspace/pkg/new.py", file_text="x = 1\n")
    assert (text, is_error) == ("File created successfully at: /workspace/pkg/new.py", False)
    text, is_error, _ = await env.edit(command="str_replace", path="/workspace/m.py", old_str="b = 2", new_str="c")
    assert (
        is_error
        and text
        == "No replacement was performed. Multiple occurrences of old_str `b = 2` in lines [2, 3]. "
        "Please ensure it is unique"
    )
    text, is_error, replaced = await env.edit(
        command="str_replace", path="/workspace/m.py", old_str="a = 1", new_str="a = 10"
    )
    assert not is_error and text.startswith(
        "The file /workspace/m.py has been edited. Here's the result of running `cat -n` on a snippet of "
        "/workspace/m.py:\n     1\ta = 10\n"
    )
    assert text.endswith("Review the changes and make sure they are as expected. Edit the file again if necessary.")
    text, is_error, inserted = await env.edit(command="insert", path="/workspace/m.py", insert_line=0, new_str="# top")
    assert not is_error and "     1\t# top\n     2\ta = 10\n" in text
    assert (env.ws / "m.py").read_text() == "# top\na = 10\nb = 2\nb = 2\n"
    for call_id, after in ((inserted, "a = 10\nb = 2\nb = 2\n"), (replaced, "a = 1\nb = 2\nb = 2\n")):
        assert [e.tool for e in await env.log(call_id)] == ["str_replace_based_edit_tool"]
        await env.undo(call_id)
        assert (env.ws / "m.py").read_text() == after
    await env.undo(created)
    assert not (env.ws / "pkg" / "new.py").exists()


async def test_editor_refuses_files_that_are_not_utf8_text(env: Env) -> None:
    (env.ws / "latin1.txt").write_bytes(b"caf\xe9\n")
    (env.ws / "blob.bin").write_bytes(b"\x00\x01\x02")
    text, is_error, _ = await env.edit(command="view", path="/workspace/latin1.txt")
    assert is_error and text == (
        "The file /workspace/latin1.txt is not valid UTF-8 text (invalid byte at offset 3); "
        "the text editor reads and writes UTF-8 text only"
    )
    text, is_error, _ = await env.edit(command="str_replace", path="/workspace/blob.bin", old_str="a", new_str="b")
    assert is_error and "is a binary file" in text
    assert (env.ws / "latin1.txt").read_bytes() == b"caf\xe9\n"


async def test_editor_max_characters_clips_a_view(env: Env) -> None:
    (env.ws / "long.txt").write_text("x" * 50 + "\n")
    block = {
        "type": "tool_use",
        "id": "toolu_max",
        "name": "str_replace_based_edit_tool",
        "input": {"command": "view", "path": "/workspace/long.txt"},
    }
    r = await run_anthropic(env.registry, block, workspace=env.ws, max_characters=10)
    text = r["content"][0]["text"]
    assert text.startswith(
        "Here's the result of running `cat -n` on /workspace/long.txt:\n     1\txxxxxxxxxx<response clipped>"
    )


# -- OpenAI shell -------------------------------------------------------------------------


async def test_shell_call_answers_each_command_and_echoes_max_output_length(env: Env) -> None:
    out = await env.shell(["echo one", "echo two >&2; exit 4", "printf 0123456789abcdef"], max_output_length=8)
    assert out["type"] == "shell_call_output" and out["max_output_length"] == 8
    assert out["output"] == [
        {"stdout": "one\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
        {"stdout": "", "stderr": "two\n", "outcome": {"type": "exit", "exit_code": 4}},
        {"stdout": "01234567", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
    ]
    out = await env.shell(["sleep 30", "echo never"], timeout_ms=500)
    assert out["output"] == [{"stdout": "", "stderr": "", "outcome": {"type": "timeout"}}]
    assert "max_output_length" not in out


# -- apply_patch --------------------------------------------------------------------------

SRC = "import os\n\n\nclass A:\n    def f(self):\n        return 1\n\n\nclass B:\n    def f(self):\n        return 1\n"

#: (name, operation, expected status, expected output start, expected files after)
PATCH_CASES: list[tuple[str, dict[str, Any], str, str, dict[str, str | None]]] = [
    (
        "add",
        {"type": "create_file", "path": "new/x.txt", "diff": "+hello\n+world\n"},
        "completed",
        "Success.",
        {"new/x.txt": "hello\nworld\n"},
    ),
    ("delete", {"type": "delete_file", "path": "gone.txt"}, "completed", "Success.", {"gone.txt": None}),
    (
        "anchors pick the second class",
        {
            "type": "update_file",
            "path": "m.py",
            "diff": "@@ class B:\n@@     def f(self):\n-        return 1\n+        return 2\n",
        },
        "completed",
        "Success.",
        {"m.py": SRC.replace("return 1\n", "return 2\n").replace("return 2\n", "return 1\n", 1)},
    ),
    (
        "several hunks",
        {
            "type": "update_file",
            "path": "m.py",
            "diff": "@@\n-import os\n+import sys\n@@ class B:\n"
            "     def f(self):\n-        return 1\n+        return 3\n",
        },
        "completed",
        "Success.",
        {
            "m.py": SRC.replace("import os", "import sys")
            .replace("return 1\n", "return 3\n")
            .replace("return 3\n", "return 1\n", 1)
        },
    ),
    (
        "whitespace-only differences",
        {"type": "update_file", "path": "ws.txt", "diff": "@@\n-alpha\n- beta\n+ALPHA\n"},
        "completed",
        "Success.",
        {"ws.txt": "ALPHA\ngamma\n"},
    ),
    (
        "end of file",
        {"type": "update_file", "path": "tail.txt", "diff": "@@\n-x\n+last\n*** End of File\n"},
        "completed",
        "Success.",
        {"tail.txt": "x\ny\nlast\n"},
    ),
    (
        "a hunk that does not match",
        {"type": "update_file", "path": "m.py", "diff": "@@ class B:\n-        return 9\n+        return 2\n"},
        "failed",
        "Failed to find expected lines in m.py, searching from line 10:\n        return 9",
        {"m.py": SRC},
    ),
    (
        "an anchor that does not match",
        {"type": "update_file", "path": "m.py", "diff": "@@ class C:\n-x\n+y\n"},
        "failed",
        "Failed to find context 'class C:' in m.py, searching from line 1",
        {"m.py": SRC},
    ),
    (
        "outside the workspace",
        {"type": "create_file", "path": "../evil.txt", "diff": "+x\n"},
        "failed",
        "Safety violation: Path '../evil.txt' escapes the workspace",
        {},
    ),
    (
        "update a missing file",
        {"type": "update_file", "path": "nope.txt", "diff": "@@\n-a\n+b\n"},
        "failed",
        "Failed to read file to update nope.txt",
        {},
    ),
    (
        "delete a missing file",
        {"type": "delete_file", "path": "nope.txt"},
        "failed",
        "Failed to delete file nope.txt: it does not exist",
        {},
    ),
]


@pytest.mark.parametrize("case", PATCH_CASES, ids=[c[0] for c in PATCH_CASES])
async def test_apply_patch_operations(
    env: Env, case: tuple[str, dict[str, Any], str, str, dict[str, str | None]]
) -> None:
    _name, op, status, output, after = case
    (env.ws / "m.py").write_text(SRC)
    (env.ws / "gone.txt").write_text("bye\n")
    (env.ws / "ws.txt").write_text("alpha   \n  beta\ngamma\n")
    (env.ws / "tail.txt").write_text("x\ny\nx\n")
    out = await env.patch_op(op)
    assert out["type"] == "apply_patch_call_output" and out["status"] == status, out
    assert out["output"].startswith(output), out["output"]
    for rel, content in after.items():
        assert (env.ws / rel).read_text() == content if content is not None else not (env.ws / rel).exists(), rel
    assert not (env.ws.parent / "evil.txt").exists()


ENVELOPE = """*** Begin Patch
*** Add File: docs/notes.md
+# Notes
*** Update File: m.py
*** Move to: pkg/m.py
@@ class A:
     def f(self):
-        return 1
+        return 10
*** Delete File: gone.txt
*** End Patch
"""


async def test_an_envelope_applies_as_one_undoable_change(env: Env) -> None:
    (env.ws / "m.py").write_text(SRC)
    (env.ws / "gone.txt").write_text("bye\n")
    result = await apply_envelope(env.registry, ENVELOPE, workspace=env.ws, call_id="patch-1")
    assert result.success, result.error
    assert result.output == "Success. Updated the following files:\nA docs/notes.md\nM pkg/m.py\nD gone.txt\n"
    assert (env.ws / "pkg/m.py").read_text() == SRC.replace("return 1", "return 10", 1)
    assert not (env.ws / "m.py").exists() and not (env.ws / "gone.txt").exists()
    await env.undo("patch-1")
    assert (env.ws / "m.py").read_text() == SRC and (env.ws / "gone.txt").read_text() == "bye\n"
    assert not (env.ws / "pkg/m.py").exists() and not (env.ws / "docs/notes.md").exists()


async def test_an_envelope_whose_third_file_fails_changes_nothing(env: Env) -> None:
    (env.ws / "m.py").write_text(SRC)
    (env.ws / "gone.txt").write_text("bye\n")
    bad = ENVELOPE.replace("*** Delete File: gone.txt", "*** Update File: gone.txt\n@@\n-not there\n+x")
    before = sorted(p.relative_to(env.ws).as_posix() for p in env.ws.rglob("*"))
    result = await apply_envelope(env.registry, bad, workspace=env.ws, call_id="patch-2")
    assert (
        not result.success
        and result.error == "Failed to find expected lines in gone.txt, searching from line 1:\nnot there"
    )
    assert sorted(p.relative_to(env.ws).as_posix() for p in env.ws.rglob("*")) == before
    assert (env.ws / "m.py").read_text() == SRC and await env.log("patch-2") == []


async def test_an_idle_session_is_ended_with_its_tree_and_replaced_by_a_fresh_one(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    import worker.native.bash as native_bash

    monkeypatch.setattr(native_bash, "IDLE_SECONDS", 1.0)
    await env.bash("export LEFT=1; sleep 600 &")
    await asyncio.sleep(3.0)  # the supervisor ends it (checked every 0.2 s), tree and all
    ps = await env.registry.execute("shell_execute", {"command": "ps -eo args"}, env.ws)
    assert "sleep 600" not in ps.output, ps.output
    text, is_error, _ = await env.bash("echo LEFT=$LEFT")
    assert not is_error and text == native_bash.IDLE_NOTE + "LEFT="
