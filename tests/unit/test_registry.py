"""ToolRegistry: registration, validation, the two error channels, schemas, subtasks,
the recorder hook and ToolResult. Runs without Docker (LocalProcessBackend or fakes)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import structlog
from pydantic import BaseModel, ConfigDict, Field

from sandbox.base import Sandbox, SandboxBackend, WriteResult
from sandbox.errors import (
    DaemonUnavailableError,
    ProtocolError,
    SandboxLostError,
    SandboxTimeoutError,
)
from sandbox.local import LocalProcessBackend
from worker import Tool, ToolContext, ToolRegistry, ToolResult, metrics
from worker.result import MAX_OUTPUT_BYTES, truncate_output
from worker.tools import BUILTIN_NAMES, CODE_NAMES, PROCESS_NAMES, TOOL_NAMES, builtin_tools

FILE_AND_SHELL_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "a.txt"}),
    ("write_file", {"path": "a.txt", "content": "x"}),
    ("edit_file", {"path": "a.txt", "old_str": "x", "new_str": "y"}),
    ("shell_execute", {"command": "true"}),
    ("search_files", {"pattern": "x"}),
    ("list_directory", {}),
]


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def make_tool(name: str, fn: Any, *, timeout: float = 5.0, needs_workspace: bool = False) -> Tool:
    return Tool(
        name=name,
        description=f"test tool {name}",
        args_model=NoArgs,
        fn=fn,
        timeout=timeout,
        needs_workspace=needs_workspace,
    )


@pytest.fixture
async def local_registry(local_backend: LocalProcessBackend) -> ToolRegistry:
    return ToolRegistry(backend=local_backend)


# -- registration ------------------------------------------------------------------------


def test_builtin_tools_registered_in_stable_order() -> None:
    reg = ToolRegistry()
    assert reg.names() == list(TOOL_NAMES) == [*BUILTIN_NAMES, *PROCESS_NAMES, *CODE_NAMES]
    assert list(PROCESS_NAMES) == ["process_output", "process_input", "process_kill", "process_list"]
    assert list(BUILTIN_NAMES) == [
        "read_file",
        "write_file",
        "edit_file",
        "shell_execute",
        "search_files",
        "list_directory",
    ]


def test_duplicate_registration_raises() -> None:
    reg = ToolRegistry()
    with pytest.raises(ValueError, match="already registered"):
        reg.register(builtin_tools()[0])


def test_empty_registry_and_custom_tool() -> None:
    async def ok(args: NoArgs, ctx: ToolContext) -> ToolResult:
        return ToolResult.ok("fine")

    reg = ToolRegistry(tools=[])
    assert reg.names() == []
    reg.register(make_tool("ping", ok))
    assert reg.names() == ["ping"] and reg.get("ping") is not None and reg.get("nope") is None


# -- errors: model channel ---------------------------------------------------------------


async def test_unknown_tool(local_registry: ToolRegistry, workspace: Path) -> None:
    r = await local_registry.execute("delete_everything", {}, workspace)
    assert not r.success and r.error is not None
    assert "Unknown tool" in r.error and "read_file" in r.error


@pytest.mark.parametrize(
    ("tool", "args", "needles"),
    [
        ("read_file", {}, ["'path'", "missing"]),
        ("read_file", {"path": 7}, ["'path'", "wrong type"]),
        (
            "read_file",
            {"path": "a", "bogus": 1},
            ["'bogus'", "unknown field", "read_file takes: path, line_range, max_bytes, encoding"],
        ),
        ("read_file", {"path": "a", "line_range": [3, 1]}, ["'line_range'", "out of range"]),
        ("read_file", {"path": "a", "line_range": [0, 1]}, ["'line_range.0'", "out of range"]),
        ("read_file", {"path": "a", "line_range": [1]}, ["'line_range'", "out of range"]),
        ("read_file", {"path": "a", "max_bytes": 0}, ["'max_bytes'", "out of range"]),
        ("list_directory", {"depth": 11}, ["'depth'", "out of range"]),
        ("list_directory", {"depth": 0}, ["'depth'", "out of range"]),
        ("list_directory", {"depth": "deep"}, ["'depth'", "wrong type"]),
        ("shell_execute", {"command": "ls", "timeout": -1}, ["'timeout'", "out of range"]),
        ("shell_execute", {"command": ["ls"]}, ["'command'", "wrong type"]),
        ("write_file", {"path": "a"}, ["'content'", "missing"]),
        ("edit_file", {"path": "a"}, ["old_str and new_str are required"]),
        (
            "edit_file",
            {"path": "a", "old_str": "x", "new_str": "y", "edits": []},
            ["'edits'", "out of range"],
        ),
        (
            "edit_file",
            {"path": "a", "old_str": "x", "new_str": "y", "edits": [{"old_str": "a", "new_str": "b"}]},
            ["not both"],
        ),
        ("edit_file", {"path": "a", "edits": [{"old_str": "a"}]}, ["'edits.0.new_str'", "missing"]),
        ("search_files", {"pattern": ""}, ["'pattern'", "out of range"]),
    ],
)
async def test_invalid_arguments_name_field_and_problem(
    local_registry: ToolRegistry, workspace: Path, tool: str, args: dict[str, Any], needles: list[str]
) -> None:
    r = await local_registry.execute(tool, args, workspace)
    assert not r.success and r.error is not None
    assert r.error.startswith(f"Invalid arguments for {tool}")
    for needle in needles:
        assert needle in r.error, r.error


async def test_the_arguments_are_named_only_after_an_unknown_one_at_the_top(
    local_registry: ToolRegistry, workspace: Path
) -> None:
    missing = await local_registry.execute("read_file", {}, workspace)
    nested = await local_registry.execute(
        "edit_file", {"path": "a", "edits": [{"old_str": "a", "new_str": "b", "x": 1}]}, workspace
    )
    for r in (missing, nested):
        assert r.error is not None and "takes:" not in r.error, r.error
    assert nested.error is not None and "'edits.0.x': unknown field" in nested.error


async def test_arguments_as_json_string(local_registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "a.txt").write_text("hi")
    r = await local_registry.execute("read_file", '{"path": "a.txt"}', workspace)
    assert r.success and r.output == "hi"
    r = await local_registry.execute("read_file", '{"path": ', workspace)
    assert not r.success and r.error is not None and "not valid JSON" in r.error
    r = await local_registry.execute("read_file", ["a.txt"], workspace)  # type: ignore[arg-type]
    assert not r.success and r.error is not None and "expected a JSON object" in r.error


@pytest.mark.parametrize(("tool", "args"), FILE_AND_SHELL_CALLS)
async def test_no_workspace(local_registry: ToolRegistry, tool: str, args: dict[str, Any]) -> None:
    r = await local_registry.execute(tool, args, None)
    assert not r.success and r.error is not None and "No workspace" in r.error


async def test_missing_workspace_directory(local_registry: ToolRegistry, tmp_path: Path) -> None:
    r = await local_registry.execute("list_directory", {}, tmp_path / "does-not-exist")
    assert not r.success and r.error is not None and "Workspace directory not found" in r.error


async def test_tool_timeout(workspace: Path) -> None:
    async def slow(args: NoArgs, ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(10)
        return ToolResult.ok("late")

    reg = ToolRegistry(tools=[make_tool("slow", slow, timeout=0.2)])
    r = await reg.execute("slow", {})
    assert not r.success and r.error == "slow timed out after 0.2s"


async def test_a_tool_that_enforces_its_own_limit_in_the_sandbox_gets_no_answer_is_infrastructure(
    workspace: Path,
) -> None:
    # (as shell_execute: its command's timeout is the agent's to enforce; the registry's
    # deadline adds slack for the answer, so passing it means the sandbox did not answer)
    async def hung(args: NoArgs, ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(10)
        return ToolResult.ok("late")

    tool = dataclasses.replace(make_tool("hung", hung), timeout_for=lambda a: 0.2)
    r = await ToolRegistry(tools=[tool]).execute("hung", {})
    assert not r.success and r.error is not None
    assert r.error.startswith("Sandbox did not answer in time (infrastructure failure"), r.error
    assert "no answer to hung within 0.2s" in r.error
    assert r.data == {"error_kind": "infrastructure", "exception": "SandboxTimeoutError"}
    assert metrics.outcome_of(r) == "infra"
    # A tool whose deadline is its own limit: the call's limit, as before.
    plain = await ToolRegistry(tools=[make_tool("slow", hung, timeout=0.2)]).execute("slow", {})
    assert plain.error == "slow timed out after 0.2s" and plain.data == {"timed_out": True}
    assert metrics.outcome_of(plain) == "timeout"


def test_default_timeouts() -> None:
    timeouts = {t.name: t.timeout for t in builtin_tools()}
    assert timeouts["read_file"] == timeouts["write_file"] == timeouts["edit_file"] == 10
    assert timeouts["list_directory"] == 10 and timeouts["search_files"] == 30
    shell = ToolRegistry().get("shell_execute")
    assert shell is not None
    args = shell.validate({"command": "ls", "timeout": 1000})
    assert args.timeout == 300  # type: ignore[attr-defined]
    assert shell.deadline(args) > 300  # the registry waits beyond the command's own kill
    assert shell.deadline(shell.validate({"command": "ls"})) > 60


async def test_internal_error_is_contained() -> None:
    async def buggy(args: NoArgs, ctx: ToolContext) -> ToolResult:
        raise KeyError("oops")

    reg = ToolRegistry(tools=[make_tool("buggy", buggy)])
    r = await reg.execute("buggy", {})
    assert not r.success and r.error is not None and "Internal error in buggy" in r.error
    assert r.data is not None and r.data["error_kind"] == "internal"


# -- errors: infrastructure channel ------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "prefix"),
    [
        (SandboxLostError("agent died"), "Sandbox unavailable"),
        (DaemonUnavailableError("no daemon"), "Sandbox unavailable"),
        (ProtocolError("garbage"), "Sandbox protocol error"),
        (SandboxTimeoutError("no answer"), "Sandbox did not answer in time"),
    ],
)
async def test_infrastructure_errors_have_their_own_channel(exc: Exception, prefix: str) -> None:
    async def broken(args: NoArgs, ctx: ToolContext) -> ToolResult:
        raise exc

    reg = ToolRegistry(tools=[make_tool("broken", broken)])
    r = await reg.execute("broken", {})
    assert not r.success and r.error is not None
    assert r.error.startswith(prefix) and "infrastructure failure" in r.error and str(exc) in r.error
    assert r.data is not None and r.data["error_kind"] == "infrastructure"


class DeadBackend(SandboxBackend):
    async def get(self, workspace: Path) -> Sandbox:
        raise DaemonUnavailableError("Cannot reach the Docker daemon: connection refused")

    async def stop(self, workspace: Path) -> bool:
        return False

    async def aclose(self) -> None:
        pass


async def test_backend_down_is_infrastructure(workspace: Path) -> None:
    reg = ToolRegistry(backend=DeadBackend())
    for tool, args in FILE_AND_SHELL_CALLS:
        r = await reg.execute(tool, args, workspace)
        assert not r.success and r.error is not None and "Sandbox unavailable" in r.error
        assert r.data is not None and r.data["error_kind"] == "infrastructure"
        assert r.output.startswith("Error: ")  # never dressed up as command output


async def test_no_backend_is_infrastructure(workspace: Path) -> None:
    r = await ToolRegistry().execute("read_file", {"path": "a"}, workspace)
    assert not r.success and r.data is not None and r.data["error_kind"] == "infrastructure"


@pytest.mark.parametrize(
    "arguments",
    [None, "", "null", "[]", "42", {"path": None}, {"": 1}, {"path": "\x00"}, {"path": "a" * 10000}],
)
async def test_execute_never_raises(local_registry: ToolRegistry, workspace: Path, arguments: Any) -> None:
    empty = arguments in (None, "", "null")
    for tool in [*BUILTIN_NAMES, "", "nope"]:
        r = await local_registry.execute(tool, arguments, workspace)
        assert isinstance(r, ToolResult)
        if empty and tool == "list_directory":  # its only arguments have defaults
            assert r.success
        else:
            assert not r.success and r.error


# -- schemas -----------------------------------------------------------------------------


def test_openai_schemas_valid_and_stable() -> None:
    schemas = ToolRegistry().all_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOL_NAMES)
    assert json.dumps(schemas, sort_keys=False) == json.dumps(ToolRegistry().all_schemas(), sort_keys=False)
    for s in schemas:
        assert set(s) == {"type", "function"} and s["type"] == "function"
        fn = s["function"]
        assert set(fn) == {"name", "description", "parameters"} and fn["description"]
        params = fn["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["type"] == "object" and params["additionalProperties"] is False
        text = json.dumps(params)
        assert "$ref" not in text and "$defs" not in text and '"title"' not in text
        for name, prop in params["properties"].items():
            assert prop.get("description"), f"{fn['name']}.{name} has no description"


def test_schema_agrees_with_validation() -> None:
    reg = ToolRegistry()
    cases: list[tuple[str, dict[str, Any], bool]] = [
        ("read_file", {"path": "a", "line_range": [1, 2]}, True),
        ("read_file", {"path": "a", "extra": 1}, False),
        ("list_directory", {"depth": 11}, False),
        ("edit_file", {"path": "a", "edits": [{"old_str": "x", "new_str": "y", "replace_all": True}]}, True),
        ("edit_file", {"path": "a", "edits": [{"old_str": "x", "new_str": "y", "oops": 1}]}, False),
        ("shell_execute", {"command": "ls", "cwd": "src", "timeout": 5}, True),
    ]
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in reg.all_schemas()}
    for tool, args, valid in cases:
        errors = list(jsonschema.Draft202012Validator(schemas[tool]).iter_errors(args))
        assert (not errors) == valid, (tool, args, errors)


def test_required_fields() -> None:
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in ToolRegistry().all_schemas()}
    assert schemas["read_file"]["required"] == ["path"]
    assert schemas["write_file"]["required"] == ["path", "content"]
    assert schemas["shell_execute"]["required"] == ["command"]
    assert schemas["search_files"]["required"] == ["pattern"]
    assert "required" not in schemas["list_directory"] or schemas["list_directory"]["required"] == []


def test_anthropic_and_mcp_formats() -> None:
    reg = ToolRegistry()
    openai = reg.all_schemas()
    anthropic = reg.all_schemas("anthropic")
    mcp = reg.all_schemas("mcp")
    for o, a, m in zip(openai, anthropic, mcp, strict=True):
        assert a == {
            "name": o["function"]["name"],
            "description": o["function"]["description"],
            "input_schema": o["function"]["parameters"],
        }
        assert m["name"] == a["name"] and m["inputSchema"] == a["input_schema"]
    hints = {m["name"]: m["annotations"]["readOnlyHint"] for m in mcp}
    assert hints == {
        "read_file": True,
        "write_file": False,
        "edit_file": False,
        "shell_execute": False,
        "search_files": True,
        "list_directory": True,
        "process_output": False,
        "process_input": False,
        "process_kill": False,
        "process_list": True,
        "run_code": False,
    }
    with pytest.raises(ValueError, match="unknown schema format"):
        reg.all_schemas("xml")


# -- tools_for_subtask -------------------------------------------------------------------


def _names(schemas: list[dict[str, Any]]) -> list[str]:
    return [s["function"]["name"] for s in schemas]


def test_tools_for_subtask() -> None:
    async def noop(args: NoArgs, ctx: ToolContext) -> ToolResult:
        return ToolResult.ok("")

    reg = ToolRegistry()
    reg.register(make_tool("extra", noop))

    class Subtask:
        tools = ["list_directory", "read_file", "made_up"]
        excluded_tools = ["read_file"]

    assert _names(reg.tools_for_subtask(None)) == list(BUILTIN_NAMES)
    assert _names(reg.tools_for_subtask({})) == list(BUILTIN_NAMES)
    # Named tools in registration order, unknown names ignored, exclusions win.
    assert _names(reg.tools_for_subtask({"tools": ["search_files", "read_file", "nope"]})) == [
        "read_file",
        "search_files",
    ]
    assert _names(reg.tools_for_subtask(Subtask())) == ["list_directory"]
    assert _names(reg.tools_for_subtask({"tools": ["extra"]})) == ["extra"]
    # Only unknown names: the core set (which does not include extra tools).
    assert _names(reg.tools_for_subtask({"tools": ["ghost"]})) == list(BUILTIN_NAMES)
    assert "shell_execute" not in _names(reg.tools_for_subtask({"excluded_tools": ["shell_execute"]}))
    assert reg.tools_for_subtask({"tools": ["read_file"]}) == reg.tools_for_subtask({"tools": ["read_file"]})


# -- ToolResult and truncation -----------------------------------------------------------


def test_truncate_output_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 50_000 + "TAIL"
    cut, was_cut = truncate_output(text)
    assert was_cut and len(cut.encode()) <= MAX_OUTPUT_BYTES
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and "bytes omitted" in cut
    assert truncate_output("short") == ("short", False)
    exact = "y" * MAX_OUTPUT_BYTES
    assert truncate_output(exact) == (exact, False)


def test_truncate_output_never_splits_characters() -> None:
    text = "é☃𝄞" * 5000
    cut, was_cut = truncate_output(text)
    assert was_cut and len(cut.encode("utf-8")) <= MAX_OUTPUT_BYTES
    assert "\ufffd" not in cut


def test_result_to_json_and_capped() -> None:
    r = ToolResult.ok("ü" * 20_000, {"k": 1}, ["a.txt"])
    capped = r.capped()
    assert len(capped.output.encode()) <= MAX_OUTPUT_BYTES
    assert capped.data == {"k": 1, "truncated": True, "output_truncated": True}
    assert r.data == {"k": 1}  # the original is not modified
    decoded = json.loads(capped.to_json())
    assert decoded["success"] is True and decoded["files_changed"] == ["a.txt"] and decoded["error"] is None
    f = ToolResult.fail("boom")
    assert json.loads(f.to_json()) == {
        "success": False,
        "output": "Error: boom",
        "data": None,
        "files_changed": [],
        "error": "boom",
    }


async def test_execute_caps_output(workspace: Path) -> None:
    async def loud(args: NoArgs, ctx: ToolContext) -> ToolResult:
        return ToolResult.ok("start\n" + "z" * 100_000 + "\nend")

    r = await ToolRegistry(tools=[make_tool("loud", loud)]).execute("loud", {})
    assert r.success and len(r.output.encode()) <= MAX_OUTPUT_BYTES
    assert r.output.startswith("start") and r.output.endswith("end")
    assert r.data is not None and r.data["truncated"] is True


async def test_every_call_is_logged(local_registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "a.txt").write_text("x")
    with structlog.testing.capture_logs() as logs:
        await local_registry.execute("read_file", {"path": "a.txt"}, workspace, call_id="c-1", subtask_id="s-1")
        await local_registry.execute("read_file", {"path": "nope"}, workspace, call_id="c-2")
    calls = [e for e in logs if e["event"] == "tool.call"]
    assert [(c["tool"], c["call_id"], c["success"]) for c in calls] == [
        ("read_file", "c-1", True),
        ("read_file", "c-2", False),
    ]
    assert calls[0]["subtask_id"] == "s-1" and calls[0]["workspace"] == str(workspace)
    assert all(isinstance(c["duration_ms"], float) for c in calls)
    assert "not found" in calls[1]["error"]


# -- workspaces and the change recorder --------------------------------------------------


class SpyRecorder:
    """Records what the tools asked for; writes through, reports a fixed shell change."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.active_shells = 0
        self.max_active = 0

    async def write(
        self,
        sandbox: Sandbox,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None,
        expect_absent: bool,
        tool: str,
        call_id: str | None,
        subtask_id: str | None,
    ) -> WriteResult:
        self.events.append(("write", path, tool, call_id, subtask_id, expect_sha256, expect_absent))
        return await sandbox.write(path, data, expect_sha256=expect_sha256, expect_absent=expect_absent)

    async def before_shell(
        self, sandbox: Sandbox, *, piggyback: bool = False, pending: object = None, intent: object = None
    ) -> object:
        self.active_shells += 1
        self.max_active = max(self.max_active, self.active_shells)
        self.events.append(("before",))
        return "token"

    async def after_shell(
        self,
        sandbox: Sandbox,
        token: object,
        *,
        tool: str,
        command: str,
        call_id: str | None,
        subtask_id: str | None,
        result: object = None,
    ) -> list[str]:
        self.active_shells -= 1
        self.events.append(("after", token, tool, command, call_id))
        return ["z.txt", "a.txt", "a.txt"]


async def test_writes_go_through_the_recorder(local_backend: LocalProcessBackend, workspace: Path) -> None:
    spy = SpyRecorder()
    reg = ToolRegistry(backend=local_backend, recorder_factory=lambda root: spy)
    r = await reg.execute("write_file", {"path": "f.txt", "content": "abc"}, workspace, call_id="w1", subtask_id="s")
    assert r.success
    r = await reg.execute("edit_file", {"path": "f.txt", "old_str": "b", "new_str": "B"}, workspace, call_id="e1")
    assert r.success
    r = await reg.execute("edit_file", {"path": "g.txt", "old_str": "", "new_str": "new"}, workspace, call_id="e2")
    assert r.success
    import hashlib

    assert spy.events == [
        ("write", "f.txt", "write_file", "w1", "s", None, False),
        ("write", "f.txt", "edit_file", "e1", None, hashlib.sha256(b"abc").hexdigest(), False),
        ("write", "g.txt", "edit_file", "e2", None, None, True),
    ]
    assert (workspace / "f.txt").read_text() == "aBc"


async def test_shell_is_bracketed_and_serialized(local_backend: LocalProcessBackend, workspace: Path) -> None:
    spy = SpyRecorder()
    reg = ToolRegistry(backend=local_backend, recorder_factory=lambda root: spy)
    results = await asyncio.gather(
        *(reg.execute("shell_execute", {"command": "sleep 0.05"}, workspace, call_id=f"s{i}") for i in range(4))
    )
    assert all(r.success for r in results)
    assert results[0].files_changed == ["a.txt", "z.txt"]  # sorted, deduplicated
    assert spy.max_active == 1  # never two commands between before/after at once
    kinds = [e[0] for e in spy.events]
    assert kinds == ["before", "after"] * 4
    assert {e[4] for e in spy.events if e[0] == "after"} == {"s0", "s1", "s2", "s3"}


async def test_conflict_between_read_and_write_fails_cleanly(
    local_backend: LocalProcessBackend, workspace: Path
) -> None:
    class Meddler(SpyRecorder):
        async def write(self, sandbox: Sandbox, path: str, data: bytes, **kw: Any) -> WriteResult:
            # Someone else changes the file after edit_file read it.
            await sandbox.write(path, b"changed by someone else\n")
            return await super().write(sandbox, path, data, **kw)

    reg = ToolRegistry(backend=local_backend, recorder_factory=lambda root: Meddler())
    (workspace / "f.txt").write_text("original\n")
    r = await reg.execute("edit_file", {"path": "f.txt", "old_str": "original", "new_str": "mine"}, workspace)
    assert not r.success and r.error is not None and "changed" in r.error and "Conflict" in r.error
    assert (workspace / "f.txt").read_text() == "changed by someone else\n"


async def test_workspace_is_cached_by_real_path(local_registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    a = await local_registry.workspace(workspace)
    b = await local_registry.workspace(str(workspace / "sub" / ".."))
    assert a is b and a.root == workspace.resolve()
    assert await local_registry.stop(workspace) is True
    assert await local_registry.workspace(workspace) is not a


async def test_registry_async_context_closes_backend(workspace: Path) -> None:
    backend = LocalProcessBackend()
    async with ToolRegistry(backend=backend) as reg:
        r = await reg.execute("list_directory", {}, workspace)
        assert r.success
    assert backend._boxes == {}


def test_default_registry_builds_docker_backend_without_contacting_it() -> None:
    from sandbox.docker import DockerBackend
    from worker import default_registry

    reg = default_registry(image="example/sandbox:1", cpus=2.0, docker_host="unix:///nonexistent.sock")
    assert isinstance(reg.backend, DockerBackend)
    assert reg.backend.spec.image == "example/sandbox:1" and reg.backend.spec.cpus == 2.0
    assert reg.names()[:6] == list(BUILTIN_NAMES) and "tool_search" in reg.names()


async def test_default_registry_daemon_down_is_infrastructure(workspace: Path) -> None:
    from worker import default_registry

    async with default_registry(docker_host="unix:///nonexistent/docker.sock") as reg:
        r = await reg.execute("list_directory", {}, workspace)
    assert not r.success and r.data is not None and r.data["error_kind"] == "infrastructure"
    assert r.error is not None and "Sandbox unavailable" in r.error


def test_field_descriptions_come_from_models() -> None:
    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        n: int | None = Field(None, ge=1, description="A number.")

    async def fn(args: Args, ctx: ToolContext) -> ToolResult:
        return ToolResult.ok("")

    params = Tool("t", "d", Args, fn).parameters()
    assert params["properties"]["n"] == {"type": "integer", "minimum": 1, "description": "A number."}


async def test_a_workspaces_recorder_is_opened_off_the_event_loop(
    local_backend: LocalProcessBackend, workspace: Path
) -> None:
    # Opening a changelog creates its database (~6 ms): on the loop it held every other call.
    import threading

    loop_thread = threading.get_ident()
    opened_in: list[int] = []

    def factory(root: Path) -> SpyRecorder:
        opened_in.append(threading.get_ident())
        return SpyRecorder()

    reg = ToolRegistry(backend=local_backend, recorder_factory=factory)
    r = await reg.execute("shell_execute", {"command": "true"}, workspace)
    assert r.success
    assert opened_in and loop_thread not in opened_in
    await reg.aclose()


async def test_a_recorder_opened_for_a_caller_that_gave_up_is_closed_when_owned(
    local_backend: LocalProcessBackend, workspace: Path
) -> None:
    import threading

    from worker.registry.pool import WorkspacePool

    release = threading.Event()
    closed: list[bool] = []

    class Owned(SpyRecorder):
        async def aclose(self) -> None:
            closed.append(True)

    def factory(root: Path) -> Owned:
        release.wait(10)  # still opening when its caller gives up
        return Owned()

    pool = WorkspacePool(local_backend, recorder_factory=factory, own_recorders=True)
    opening = asyncio.ensure_future(pool.workspace(workspace))
    await asyncio.sleep(0.05)
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    release.set()
    for _ in range(200):
        if closed:
            break
        await asyncio.sleep(0.01)
    assert closed == [True]
    ws = await pool.workspace(workspace)  # the next caller opens it anew
    assert isinstance(ws.recorder, Owned)
    await pool.aclose()
