"""A tool is data plus one async function.

:class:`Tool` holds a name, a description, a pydantic model of its arguments
(``extra="forbid"``, one docstring per field) and the function that does the work. The
JSON Schema the model sees is generated from that same model (:func:`parameters_schema`)
and rendered for OpenAI function calling, Anthropic tool use and MCP.

Every built-in argument model derives from :class:`ToolArgs`: unknown fields refused,
and strict types (a boolean is not a number, ``"10"`` is not an integer, ``2.0`` is not an
integer, a number is not a boolean) with only finite numbers (``Infinity``, ``NaN`` and
``1e309``, which Python's ``json`` reads as infinity, are refused). A model's mistaken
argument comes back naming the field instead of being silently reinterpreted.
:meth:`Tool.validate` validates strictly even a model that does not derive from it.

Errors a tool raises for the model to act on::

    ToolError              success=false with this message (bad input, nothing to do)
    └── PolicyError        a refusal by policy; the message starts with "Safety violation"
"""

from __future__ import annotations

import copy
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .result import ToolResult

if TYPE_CHECKING:
    from sandbox.base import ExecControl, OutputCallback

    from .workspace import Workspace


class ToolArgs(BaseModel):
    """Base of a tool's argument model: unknown fields are refused and types are strict.

    ``strict``: no coercion between types (``true`` for a number, ``1`` for a boolean,
    ``"10"`` for a number and ``2.0`` for an integer are refused, as is a tuple for a
    list); ``allow_inf_nan=False``: a number must be finite. The JSON Schema the model
    sees says the same (``"type": "integer"``, ``"boolean"``, bounds as ``minimum`` /
    ``exclusiveMinimum``); a JSON document cannot carry a non-finite number at all.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ToolError(Exception):
    """A problem the model can fix; becomes ``success=false`` with this message."""

    def __init__(self, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data = data

    @property
    def message(self) -> str:
        return str(self)


class PolicyError(ToolError):
    """A call refused by policy (path outside the workspace, dangerous command)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason if reason.startswith("Safety violation") else f"Safety violation: {reason}")


@dataclass(frozen=True)
class ToolContext:
    """What a tool function gets besides its arguments."""

    workspace: Workspace | None
    call_id: str | None = None
    subtask_id: str | None = None
    #: Where a tool that runs a command hands its output as it happens (the caller asked
    #: for a stream: ``ToolRegistry.execute_stream``); None: nobody listens.
    on_output: OutputCallback | None = None
    #: Lets the caller signal the command the tool runs (a Ctrl-C passed on).
    control: ExecControl | None = None

    def require_workspace(self) -> Workspace:
        """The workspace. Raises ToolError ("No workspace") when there is none."""
        if self.workspace is None:
            raise ToolError("No workspace: this tool needs a workspace directory, and none was given")
        return self.workspace


ToolFn = Callable[[Any, ToolContext], Awaitable[ToolResult]]


@dataclass(frozen=True)
class Tool:
    """One tool: its contract with the model (name, description, arguments) and its code.

    ``timeout`` is the whole call's deadline in seconds; its passing is the call's limit
    ("t timed out after Ns"). ``timeout_for`` (when set) computes it from the validated
    arguments instead, for a tool whose own limit is enforced in the sandbox (a command's
    timeout, a kernel's): that limit plus slack for the answer, so its passing is an
    infrastructure failure (the sandbox or the engine did not answer), never the limit.
    ``mutating`` tools may change the workspace; ``needs_workspace`` tools fail with
    "No workspace" when called without one.
    """

    name: str
    description: str
    args_model: type[BaseModel]
    fn: ToolFn
    timeout: float = 30.0
    mutating: bool = False
    needs_workspace: bool = True
    timeout_for: Callable[[Any], float] | None = None
    tags: tuple[str, ...] = field(default=())

    def deadline(self, args: BaseModel) -> float:
        return self.timeout_for(args) if self.timeout_for is not None else self.timeout

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        """The arguments as the tool's model, validated strictly (see :class:`ToolArgs`).
        Raises ToolError naming each bad field."""
        try:
            return self.args_model.model_validate(arguments, strict=True)
        except ValidationError as e:
            raise ToolError(format_validation_error(self.name, e, fields=list(self.args_model.model_fields))) from None

    # -- schemas -----------------------------------------------------------------------

    def parameters(self) -> dict[str, Any]:
        """JSON Schema of the arguments (self-contained, no ``$ref``, no titles)."""
        return parameters_schema(self.args_model)

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters()},
        }

    def anthropic_schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.parameters()}

    def mcp_schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.parameters(),
            "annotations": {
                "readOnlyHint": not self.mutating,
                "destructiveHint": self.mutating,
                "openWorldHint": False,
            },
        }

    def schema(self, fmt: str = "openai") -> dict[str, Any]:
        """The definition in ``fmt`` (openai | anthropic | mcp). Raises ValueError otherwise."""
        if fmt == "openai":
            return self.openai_schema()
        if fmt == "anthropic":
            return self.anthropic_schema()
        if fmt == "mcp":
            return self.mcp_schema()
        raise ValueError(f"unknown schema format {fmt!r} (openai, anthropic, mcp)")


SCHEMA_FORMATS = ("openai", "anthropic", "mcp")


def parameters_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema made model-friendly.

    ``$ref`` to ``$defs`` are inlined (not every function-calling API resolves them),
    ``title`` keys dropped, and an optional field's ``anyOf [X, null]`` collapsed to X
    (the model should omit the field rather than send null).
    """
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})

    def walk(node: Any, in_properties: bool = False) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        if in_properties:  # keys are field names here, not schema keywords
            return {k: walk(v) for k, v in node.items()}
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return walk({**target, **rest})
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "title":
                continue
            out[k] = walk(v, in_properties=(k == "properties"))
        any_of = out.get("anyOf")
        if isinstance(any_of, list) and len(any_of) == 2 and {"type": "null"} in any_of:
            other = next(x for x in any_of if x != {"type": "null"})
            del out["anyOf"]
            if out.get("default", 0) is None:
                del out["default"]
            out = {**other, **out}
        return out

    result: dict[str, Any] = walk(raw)
    result.setdefault("properties", {})
    return result


_RANGE_TYPES = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "too_short",
    "too_long",
    "string_too_short",
    "string_too_long",
    "multiple_of",
}


def non_finite(value: Any, loc: str = "") -> tuple[str, float] | None:
    """The location (``a.0.b``) and value of the first non-finite number (inf, -inf,
    NaN) in the JSON-like ``value``, or None. For arguments checked by a JSON Schema,
    whose ``"type": "number"`` admits them once Python's ``json`` has read ``Infinity``,
    ``NaN`` or ``1e309``."""
    if isinstance(value, float) and not math.isfinite(value):
        return loc or "arguments", value
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        found = non_finite(v, f"{loc}.{k}" if loc else str(k))
        if found is not None:
            return found
    return None


def non_finite_message(tool: str, arguments: dict[str, Any]) -> str | None:
    """``Invalid arguments for <tool>: '<field>': wrong value ...`` when ``arguments``
    hold a non-finite number (worded as for a model's field), else None."""
    found = non_finite(arguments)
    if found is None:
        return None
    loc, value = found
    return f"Invalid arguments for {tool}: '{loc}': wrong value ({_shown(value)}): Input should be a finite number"


def _shown(value: Any) -> str:
    """The JSON type of a wrong value, and the value itself when it is a short scalar
    (``boolean true``, ``string '10'``): what the model sent, so it sees its mistake."""
    name = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )
    if isinstance(value, bool):
        return f"{name} {'true' if value else 'false'}"
    if isinstance(value, float) and not math.isfinite(value):  # as JSON writers spell it
        return f"{name} {'NaN' if math.isnan(value) else ('Infinity' if value > 0 else '-Infinity')}"
    if isinstance(value, int | float) or (isinstance(value, str) and len(value) <= 40):
        return f"{name} {value!r}"
    return name


def format_validation_error(tool: str, err: ValidationError, fields: list[str] | None = None) -> str:
    """One line per problem: the field, then missing / unknown field / wrong type / out of range.
    ``fields``: the tool's arguments, named after the problems when one is an unknown field
    at the top (a misspelt or guessed name: the model sees the right ones)."""
    problems = []
    unknown = False
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "arguments"
        kind = e["type"]
        msg = e["msg"]
        if kind == "missing":
            problems.append(f"'{loc}': missing required field")
        elif kind == "extra_forbidden":
            problems.append(f"'{loc}': unknown field (not an argument of {tool})")
            unknown = unknown or len(e["loc"]) == 1
        elif kind in _RANGE_TYPES:
            problems.append(f"'{loc}': out of range: {msg}")
        elif kind == "finite_number":
            problems.append(f"'{loc}': wrong value ({_shown(e.get('input'))}): {msg}")
        elif kind.endswith("_type") or kind.endswith("_parsing") or kind in ("model_attributes_type",):
            problems.append(f"'{loc}': wrong type ({_shown(e.get('input'))}): {msg}")
        else:
            text = msg.removeprefix("Value error, ")
            problems.append(f"'{loc}': {text}")
    message = f"Invalid arguments for {tool}: " + "; ".join(problems)
    if unknown and fields:
        message += f". {tool} takes: {', '.join(fields)}"
    return message
