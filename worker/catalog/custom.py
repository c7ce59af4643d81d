"""Custom tools defined in YAML files (``$LOOM_DATA_DIR/tools/*.yaml``), runnable in the
workspace sandbox.

A file holds one tool, or several under ``tools:``::

    name: count_matches
    description: Count lines matching a pattern in a file
    parameters:                      # JSON Schema (object) for the arguments
      type: object
      properties:
        pattern: {type: string, description: Regular expression}
        path: {type: string}
      required: [pattern, path]
    command: [grep, -c, -e, "{pattern}", --, "{path}"]   # argv template, no shell
    # or instead of command, a fixed shell script that reads its arguments from the
    # environment (ARG_<name>), never from text substituted into it:
    # script: 'grep -c -e "$ARG_pattern" -- "$ARG_path"'
    capabilities: [search, analyze]
    timeout: 30

Parameters are never interpolated into shell text. In ``command`` a placeholder
``{name}`` is replaced inside its own argv element (an element that is exactly
``{name}`` with a list value becomes one element per item; an element naming an omitted
optional parameter is dropped). In ``script`` values arrive as ``ARG_<name>`` variables.
Templates should put ``--`` before positional values so a value cannot act as an option.

Errors: :class:`CustomToolError` (also ValueError) for arguments that do not fit the
schema: the model's problem. A bad file is reported per file by :func:`load_custom_tools`
and does not stop the others.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sandbox.base import ExecRequest, Sandbox

from .capabilities import make_descriptor
from .index import ToolDescriptor

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _integer(_checker: Any, instance: Any) -> bool:
    # To JSON Schema 2.0 is an integer; as for the built-in tools' strict models, an
    # integer argument must be written as one (and a boolean is never a number).
    return isinstance(instance, int) and not isinstance(instance, bool)


#: Draft 2020-12 with strict integers: the validator of custom and MCP tools' arguments.
StrictValidator: Any = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _integer),
)


class CustomToolError(ValueError):
    """Arguments for a custom tool do not fit its parameter schema."""


class CustomToolSpec(BaseModel):
    """One tool as written in YAML."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$", description="Tool name, unique.")
    description: str = Field(min_length=1, max_length=4000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    command: list[str] | None = Field(None, min_length=1, description="argv template.")
    script: str | None = Field(None, min_length=1, description="sh script; arguments in $ARG_<name>.")
    capabilities: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    examples: list[dict[str, Any]] = Field(default_factory=list)
    timeout: float = Field(60.0, gt=0, le=3600)
    cwd: str = "."
    version: str | None = None
    requires_approval: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> CustomToolSpec:
        if (self.command is None) == (self.script is None):
            raise ValueError("exactly one of 'command' or 'script' is required")
        if self.parameters.get("type") != "object":
            raise ValueError("parameters must be a JSON Schema with type: object")
        try:
            jsonschema.Draft202012Validator.check_schema(self.parameters)
        except jsonschema.SchemaError as e:
            raise ValueError(f"parameters is not a valid JSON Schema: {e.message}") from e
        props = self.parameters.get("properties") or {}
        bad = [p for p in props if not _PARAM_NAME.match(p)]
        if bad:
            raise ValueError(f"parameter names must be identifiers: {bad}")
        for element in self.command or ():
            for ref in _PLACEHOLDER.findall(element):
                if ref not in props:
                    raise ValueError(f"command refers to undeclared parameter {{{ref}}}")
        return self


@dataclass
class CustomToolResult:
    success: bool
    exit_code: int | None
    stdout: str
    stderr: str
    outcome: str
    truncated: bool
    duration_ms: float
    argv: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    return json.dumps(value, separators=(",", ":"))


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


class CustomTool:
    """A loaded custom tool: its spec, its catalog descriptor, and how to run it."""

    def __init__(self, spec: CustomToolSpec, origin: str = "") -> None:
        self.spec = spec
        self.origin = origin
        schema = dict(spec.parameters)
        schema.setdefault("additionalProperties", False)  # unknown arguments are refused
        self._validator = StrictValidator(schema)
        self.schema = schema

    @property
    def name(self) -> str:
        return self.spec.name

    def descriptor(self) -> ToolDescriptor:
        s = self.spec
        return make_descriptor(
            source="custom",
            name=s.name,
            description=s.description,
            input_schema=self.schema,
            capabilities=s.capabilities,
            keywords=s.keywords,
            examples=s.examples,
            version=s.version,
            # A custom tool always runs a command; unless its author says otherwise it needs approval.
            requires_approval=True if s.requires_approval is None else s.requires_approval,
        )

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.spec.description, "parameters": self.schema},
        }

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Check ``args`` against the schema. Raises CustomToolError."""
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = ".".join(str(p) for p in e.path) or "arguments"
            raise CustomToolError(f"{self.name}: '{where}': {e.message}")
        if _has_nul(args):
            raise CustomToolError(f"{self.name}: arguments must not contain NUL characters")
        return args

    def build(self, args: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """(argv, env) for validated ``args``. Raises CustomToolError."""
        args = self.validate(args)
        if self.spec.script is not None:
            env = {f"ARG_{k}": _text(v) for k, v in args.items() if v is not None}
            return ["/bin/sh", "-c", self.spec.script, self.name], env
        argv: list[str] = []
        for element in self.spec.command or ():
            refs = _PLACEHOLDER.findall(element)
            if any(args.get(r) is None for r in refs):
                continue  # an omitted optional parameter drops its element
            whole = _PLACEHOLDER.fullmatch(element)
            if whole and isinstance(args[whole.group(1)], list):
                argv.extend(_text(v) for v in args[whole.group(1)])
                continue
            # One pass with a function: a value that itself looks like "{x}" stays literal.
            argv.append(_PLACEHOLDER.sub(lambda m: _text(args[m.group(1)]), element))
        if not argv:
            raise CustomToolError(f"{self.name}: the command is empty for these arguments")
        return argv, {}

    async def run(self, sandbox: Sandbox, args: dict[str, Any], *, timeout: float | None = None) -> CustomToolResult:
        """Run in ``sandbox`` (argv, no shell). Raises CustomToolError for bad arguments and
        the sandbox's errors (PathNotFoundError for a missing ``cwd``, infrastructure)."""
        argv, env = self.build(args)
        r = await sandbox.exec(
            ExecRequest("", argv=argv, env=env or None, cwd=self.spec.cwd, timeout=timeout or self.spec.timeout)
        )
        return CustomToolResult(
            success=r.outcome == "exit" and r.exit_code == 0,
            exit_code=r.exit_code,
            stdout=r.stdout.decode("utf-8", "replace"),
            stderr=r.stderr.decode("utf-8", "replace"),
            outcome=r.outcome,
            truncated=r.truncated,
            duration_ms=r.duration_ms,
            argv=argv,
        )


@dataclass
class LoadReport:
    tools: list[CustomTool] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # file -> what is wrong


def parse_custom_file(text: str, origin: str) -> list[CustomTool]:
    """Tools defined in one YAML document. Raises ValueError with a readable message."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"invalid YAML: {e}") from e
    items = doc.get("tools") if isinstance(doc, dict) and set(doc) == {"tools"} else [doc]
    if not isinstance(items, list) or not items:
        raise ValueError("expected a tool mapping or 'tools: [...]'")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"tool #{i + 1} is not a mapping")
        try:
            out.append(CustomTool(CustomToolSpec.model_validate(item), origin))
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or "tool"
            raise ValueError(f"tool #{i + 1} ({item.get('name', '?')}): {loc}: {first['msg']}") from e
    return out


def load_custom_tools(directory: Path) -> LoadReport:
    """Load every ``*.yaml``/``*.yml`` in ``directory`` (operator config on the host, not
    workspace content). A missing directory is an empty report; a bad file, or a name
    already defined by an earlier file, is an error for that file only."""
    report = LoadReport()
    if not directory.is_dir():
        return report
    seen: dict[str, str] = {}
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    for f in files:
        try:
            tools = parse_custom_file(f.read_text(encoding="utf-8"), f.name)
            names = [t.name for t in tools]
            if len(set(names)) != len(names):
                raise ValueError("the file defines the same tool name twice")
            dup = [n for n in names if n in seen]
            if dup:
                raise ValueError(f"tool {dup[0]!r} is already defined in {seen[dup[0]]}")
        except (OSError, UnicodeDecodeError, ValueError) as e:
            report.errors[f.name] = str(e)
            continue
        for t in tools:
            seen[t.name] = f.name
            report.tools.append(t)
    return report
