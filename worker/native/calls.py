"""The Python entry points: a vendor's block in, our registry's call, the vendor's block out.

::

    from worker.native import anthropic_tools, run_anthropic, openai_tools, run_openai

    response = client.messages.create(..., tools=anthropic_tools())
    for block in response.content:
        if block.type == "tool_use":
            results.append(await run_anthropic(registry, block, workspace=path))

    response = client.responses.create(..., tools=openai_tools())
    for item in response.output:
        if item.type in ("shell_call", "apply_patch_call"):
            inputs.append(await run_openai(registry, item, workspace=path))

A block may be the SDK's object (``anthropic.types.ToolUseBlock``,
``openai.types.responses.ResponseFunctionShellToolCall`` / ``ResponseApplyPatchToolCall``)
or its JSON as a dict; the answer is a dict of the API's input type
(``ToolResultBlockParam``, ``ShellCallOutput``, ``ApplyPatchCallOutput``). Every call goes
through :meth:`ToolRegistry.execute` with the vendor's call id as the call id, so it is
journaled (the dashboard's timeline), its changes are in the changelog under that id, and
it obeys the registry's deadlines and policy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..content import anthropic_tool_result
from ..result import ToolResult
from ..tool import Tool
from . import apply_patch, bash, editor, shell

ANTHROPIC_NAMES = (bash.NAME, editor.NAME)
OPENAI_NAMES = (shell.NAME, apply_patch.NAME)
#: The type of each Anthropic tool's definition, by name.
ANTHROPIC_TYPES = {bash.NAME: "bash_20250124", editor.NAME: "text_editor_20250728"}
#: The exit code a shell command gets in a ``shell_call_output`` when it was refused
#: before running (policy, bad arguments, sandbox unavailable): "cannot execute".
REFUSED_EXIT_CODE = 126

Execute = Callable[..., Awaitable[ToolResult]]


class ToolHolder(Protocol):
    """What :func:`install` uses of a registry (a :class:`worker.registry.contract.
    ServiceRegistry`, or a cluster's :class:`worker.integrations.ray.ClusterRegistry`)."""

    def get(self, name: str) -> Tool | None: ...

    def register(self, tool: Tool) -> None: ...


def native_tools() -> list[Tool]:
    """The four tools, Anthropic's then OpenAI's."""
    return [bash.TOOL, editor.TOOL, shell.TOOL, apply_patch.TOOL]


def install(registry: ToolHolder, names: tuple[str, ...] = ANTHROPIC_NAMES + OPENAI_NAMES) -> None:
    """Register the native tools named ``names`` in ``registry`` (those not there yet).
    Raises ValueError when another tool already has one of the names."""
    for tool in native_tools():
        if tool.name not in names:
            continue
        have = registry.get(tool.name)
        if have is None:
            registry.register(tool)
        elif "native" not in have.tags:
            raise ValueError(f"the registry already has a tool named {tool.name!r} that is not the native one")


def anthropic_tools(*, max_characters: int | None = None) -> list[dict[str, Any]]:
    """The ``tools`` entries of a Messages API request: ``bash_20250124`` and
    ``text_editor_20250728`` (with ``max_characters`` when given)."""
    edit: dict[str, Any] = {"type": ANTHROPIC_TYPES[editor.NAME], "name": editor.NAME}
    if max_characters is not None:
        edit["max_characters"] = max_characters
    return [{"type": ANTHROPIC_TYPES[bash.NAME], "name": bash.NAME}, edit]


def openai_tools() -> list[dict[str, Any]]:
    """The ``tools`` entries of a Responses API request: ``shell`` and ``apply_patch``."""
    return [{"type": "shell"}, {"type": "apply_patch"}]


def as_dict(block: Any) -> dict[str, Any]:
    """An SDK object (pydantic) or a mapping as a plain dict. Raises TypeError."""
    dump = getattr(block, "model_dump", None)
    if dump is not None:
        return dict(dump(mode="json", exclude_none=True))
    if isinstance(block, Mapping):
        return dict(block)
    raise TypeError(f"expected an SDK block or a dict, got {type(block).__name__}")


def _text(result: ToolResult) -> str:
    data = result.data or {}
    text = data.get("text")
    if not isinstance(text, str):
        text = result.output if result.success else (result.error or result.output)
    system = data.get("system")
    return f"<system>{system}</system>\n{text}" if system else text


def anthropic_result(tool_use_id: str, result: ToolResult) -> dict[str, Any]:
    """The ``tool_result`` block answering ``tool_use_id`` (``is_error`` when it failed):
    the text, then the result's images as ``image`` blocks (:mod:`worker.content`)."""
    return anthropic_tool_result(tool_use_id, result, _text(result))


async def run_anthropic(
    registry: Any,
    block: Any,
    *,
    workspace: Path | str,
    session: str = "default",
    max_characters: int | None = None,
    bash_timeout: float | None = None,
    subtask_id: str | None = None,
    execute: Execute | None = None,
) -> dict[str, Any]:
    """Run one ``tool_use`` block of ``bash`` or ``str_replace_based_edit_tool`` in
    ``workspace``; returns its ``tool_result`` block. A block of another of the registry's
    own tools (``run_code``, offered with ``Tool.anthropic_schema()``) runs as it is and
    answers with its text and images (:func:`worker.content.anthropic_tool_result`); any
    other name answers an ``is_error`` result naming the two. ``session`` picks the
    persistent shell, ``max_characters`` is the editor definition's, ``bash_timeout`` one
    command's limit (default 120 s); ``execute`` replaces ``registry.execute`` (the HTTP
    service passes its runner's). Raises TypeError/KeyError for a block that is not a
    ``tool_use``."""
    b = as_dict(block)
    tool_use_id, name = str(b["id"]), str(b["name"])
    raw = b.get("input")
    args: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    run = execute or registry.execute
    if name not in ANTHROPIC_NAMES:
        tool = registry.get(name)
        if tool is None or "native" in tool.tags:
            failed = ToolResult.fail(f"Unknown tool '{name}'. Available tools: {', '.join(ANTHROPIC_NAMES)}")
            return anthropic_result(tool_use_id, failed)
        result = await run(name, args, workspace, call_id=tool_use_id, subtask_id=subtask_id)
        return anthropic_tool_result(tool_use_id, result)
    if name == bash.NAME:
        args["session"] = session
        if bash_timeout is not None:
            args["timeout"] = bash_timeout
    elif max_characters is not None:
        args["max_characters"] = max_characters
    install(registry)
    result = await run(name, args, workspace, call_id=tool_use_id, subtask_id=subtask_id)
    return anthropic_result(tool_use_id, result)


def shell_output(call_id: str, result: ToolResult, max_output_length: int | None) -> dict[str, Any]:
    """The ``shell_call_output`` item of a ``shell`` call's result."""
    data = result.data or {}
    outputs = data.get("output") if result.success else None
    if not isinstance(outputs, list):
        message = result.error or result.output
        outputs = [{"stdout": "", "stderr": message, "outcome": {"type": "exit", "exit_code": REFUSED_EXIT_CODE}}]
    item: dict[str, Any] = {"type": "shell_call_output", "call_id": call_id, "output": outputs}
    if max_output_length is not None:
        item["max_output_length"] = max_output_length
    return item


def apply_patch_output(call_id: str, result: ToolResult) -> dict[str, Any]:
    """The ``apply_patch_call_output`` item of an ``apply_patch`` call's result."""
    return {
        "type": "apply_patch_call_output",
        "call_id": call_id,
        "status": "completed" if result.success else "failed",
        "output": _text(result),
    }


async def run_openai(
    registry: Any,
    item: Any,
    *,
    workspace: Path | str,
    subtask_id: str | None = None,
    execute: Execute | None = None,
) -> dict[str, Any]:
    """Run one ``shell_call`` or ``apply_patch_call`` item in ``workspace``; returns the
    ``shell_call_output`` / ``apply_patch_call_output`` item to send back. Raises
    ValueError for another item type, TypeError/KeyError for a malformed one."""
    it = as_dict(item)
    kind, call_id = it.get("type"), str(it["call_id"])
    install(registry)
    run = execute or registry.execute
    if kind == "shell_call":
        action = dict(it["action"])
        result = await run(shell.NAME, action, workspace, call_id=call_id, subtask_id=subtask_id)
        return shell_output(call_id, result, action.get("max_output_length"))
    if kind == "apply_patch_call":
        result = await run(
            apply_patch.NAME, {"operation": it["operation"]}, workspace, call_id=call_id, subtask_id=subtask_id
        )
        return apply_patch_output(call_id, result)
    raise ValueError(f"not a shell_call or apply_patch_call item: type {kind!r}")


async def apply_envelope(registry: Any, patch: str, *, workspace: Path | str, call_id: str | None = None) -> ToolResult:
    """Apply a whole ``*** Begin Patch`` envelope (Codex's ``apply_patch``) in ``workspace``."""
    install(registry, (apply_patch.NAME,))
    result: ToolResult = await registry.execute(apply_patch.NAME, {"patch": patch}, workspace, call_id=call_id)
    return result
