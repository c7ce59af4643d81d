"""The tool table: tools by name, in registration order, with a version that changes with
every registration and removal, and the functions told of each change.

The table changes at run time (the tool catalog registers an MCP server's tools when it
first indexes them), so nothing may keep a copy of the list it read once: a listing either
reads the table each time or keeps its copy by :attr:`ToolTable.version` and drops it when
the version moves; a surface that pushes changes to its clients (the MCP server's
``notifications/tools/list_changed``) subscribes with :meth:`ToolTable.subscribe`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sandbox.logs import get_logger

from ..tool import SCHEMA_FORMATS, Tool
from ..tools import BUILTIN_NAMES

log = get_logger("worker.registry")

#: The tools a subtask gets when it names none it may use.
CORE_TOOLS = BUILTIN_NAMES

#: The tag of the vendors' native tools (:mod:`worker.native`): listed only when asked.
NATIVE_TAG = "native"


def _field(subtask: object, *names: str) -> Any:
    for name in names:
        value = subtask.get(name) if isinstance(subtask, Mapping) else getattr(subtask, name, None)
        if value is not None:
            return value
    return None


class ToolTable:
    """Tools by name, in registration order (see the module docstring)."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._version = 0
        # Keyed by a token of their own, so the same function may subscribe twice.
        self._subscribers: dict[object, Callable[[], None]] = {}
        # Each format's schemas as rendered at this version (pydantic renders a model's
        # JSON Schema anew each time: about 1 ms a tool; a copy costs a tenth of that).
        self._rendered: dict[tuple[str, bool], list[dict[str, Any]]] = {}
        for tool in tools:
            self.register(tool)

    # -- changes --------------------------------------------------------------------------

    def register(self, tool: Tool) -> None:
        """Add ``tool``. Raises ValueError ("already registered") on a duplicate name."""
        if tool.name in self._tools:
            raise ValueError(f"Tool '{tool.name}' is already registered")
        self._tools[tool.name] = tool
        self._changed()

    def unregister(self, name: str) -> Tool:
        """Remove the tool ``name`` and return it. Raises KeyError when there is none."""
        try:
            tool = self._tools.pop(name)
        except KeyError:
            raise KeyError(f"Tool '{name}' is not registered") from None
        self._changed()
        return tool

    @property
    def version(self) -> int:
        """Starts at 0 and grows by one with every :meth:`register` and :meth:`unregister`."""
        return self._version

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after every change, in the thread that made it (on the event
        loop, for the worker's own changes), in the order of subscription. It must not
        block; an exception it raises is logged and does not stop the change or the other
        subscribers. Returns the function that unsubscribes it (calling it again does
        nothing)."""
        token = object()
        self._subscribers[token] = callback

        def unsubscribe() -> None:
            self._subscribers.pop(token, None)

        return unsubscribe

    def _changed(self) -> None:
        self._version += 1
        self._rendered.clear()
        for callback in list(self._subscribers.values()):
            try:
                callback()
            except Exception:  # one subscriber's bug must not undo a registration
                log.exception("tools.subscriber_failed", version=self._version)

    # -- reading --------------------------------------------------------------------------

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self._tools)

    @property
    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def all_schemas(self, fmt: str = "openai", *, native: bool = False) -> list[dict[str, Any]]:
        """Every tool's definition in registration order (``fmt``: openai | anthropic | mcp).

        The vendors' native tools (tagged ``native``: :mod:`worker.native`) are run
        through the table like any other but advertised with the vendor's own
        definitions (``worker.native.anthropic_tools()``), so they are left out unless
        ``native`` is true: a list sent to a model does not change because someone ran
        a native call. Raises ValueError for an unknown format.
        """
        if fmt not in SCHEMA_FORMATS:
            raise ValueError(f"unknown schema format {fmt!r} (openai, anthropic, mcp)")
        key = (fmt, native)
        rendered = self._rendered.get(key)
        if rendered is None:
            rendered = self._rendered[key] = [
                t.schema(fmt) for t in self._tools.values() if native or NATIVE_TAG not in t.tags
            ]
        return copy.deepcopy(rendered)  # the caller's to change

    def tools_for_subtask(self, subtask: object, fmt: str = "openai") -> list[dict[str, Any]]:
        """The schemas a subtask may use, in registration order. Deterministic:

        1. the registered tools the subtask names in ``tools`` (or ``tool_names``);
           names that are not registered are ignored;
        2. if that leaves none, the core set (the six built-ins that are registered);
        3. minus every tool named in ``excluded_tools`` (or ``exclude_tools``).

        ``subtask`` may be a mapping or any object with those attributes (or None).
        """
        wanted = _field(subtask, "tools", "tool_names") if subtask is not None else None
        excluded = _field(subtask, "excluded_tools", "exclude_tools") if subtask is not None else None
        wanted_set = {str(n) for n in (wanted or [])} & set(self._tools)
        if not wanted_set:
            wanted_set = set(CORE_TOOLS) & set(self._tools)
        wanted_set -= {str(n) for n in (excluded or [])}
        return [t.schema(fmt) for name, t in self._tools.items() if name in wanted_set]
