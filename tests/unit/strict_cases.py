"""The bad-argument table of issue 24 (item 2), generated from the tools' own schemas.

Every ``integer``, ``number`` and ``boolean`` field a tool's JSON Schema declares (also an
array's items and the fields of objects inside arrays, such as ``edits[].replace_all``)
gets every value that must be refused: non-finite numbers (``Infinity``, ``-Infinity``,
``NaN``, ``1e309``, which Python's ``json`` reads as infinity), booleans for numbers,
numbers for booleans, numeric strings, a fraction for an integer, and values just past the
bounds the schema states. A case is raw JSON text (a JSON document cannot hold
``Infinity``; models and Python's ``json`` still produce it), put into a valid set of
arguments of its tool (:data:`BASE`), so the only thing wrong is the one field.

A tool without an entry in :data:`BASE` fails :func:`cases` (a new tool cannot be
forgotten), and a field is found from the schema (a new argument cannot be forgotten).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

#: A custom YAML tool with a field of each type, so the JSON-Schema tools are in the table.
CUSTOM_TOOL = """
name: typed_args
description: Echo typed arguments
parameters:
  type: object
  properties:
    count: {type: integer, minimum: 1, description: How many}
    ratio: {type: number, exclusiveMinimum: 0, description: A ratio}
    flag: {type: boolean, description: A switch}
    sizes: {type: array, items: {type: integer, minimum: 0}, description: Sizes}
  required: [count]
script: 'echo "$ARG_count"'
"""

#: Valid arguments of each tool, into which one bad value is put at a time.
BASE: dict[str, dict[str, Any]] = {
    "read_file": {"path": "a.txt", "line_range": [1, 2]},
    "write_file": {"path": "a.txt", "content": "x"},
    "edit_file": {"path": "a.txt", "edits": [{"old_str": "a", "new_str": "b"}]},
    "shell_execute": {"command": "true"},
    "search_files": {"pattern": "x"},
    "list_directory": {},
    "process_output": {"process_id": "p1"},
    "process_input": {"process_id": "p1", "text": "x"},
    "process_kill": {"process_id": "p1"},
    "process_list": {},
    "run_code": {"code": "1 + 1"},
    "tool_search": {"query": "read a file"},
    "typed_args": {"count": 1, "sizes": [1]},
}

_NON_FINITE = ("Infinity", "-Infinity", "NaN", "1e309", "-1e309")
_NOT_A_NUMBER = ("true", "false", '"10"', '"1.5"', "[1]", '{"a": 1}')
_NOT_A_BOOLEAN = ("1", "0", "1.0", '"true"', '"false"', '"1"', "Infinity", "[]")
_PLACEHOLDER = "__BAD_VALUE__"


@dataclass(frozen=True)
class Case:
    tool: str
    field: str  # the location as the error names it: "timeout", "edits.0.replace_all"
    raw: str  # the bad value as JSON text
    args: str  # the whole arguments as JSON text

    @property
    def id(self) -> str:
        return f"{self.tool}.{self.field}={self.raw}"


def _type(node: dict[str, Any]) -> str | None:
    t = node.get("type")
    if isinstance(t, list):  # ["integer", "null"]
        t = next((x for x in t if x != "null"), None)
    return t if isinstance(t, str) else None


def typed_fields(
    schema: dict[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """(path, schema node) of every integer, number and boolean field, at any depth (an
    array's first item stands for its items)."""
    for name, node in (schema.get("properties") or {}).items():
        yield from _walk((*prefix, name), node)


def _walk(path: tuple[str, ...], node: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    for alt in node.get("anyOf") or ():
        if isinstance(alt, dict) and _type(alt) not in (None, "null"):
            yield from _walk(path, {**node, **alt, "anyOf": None})
    t = _type(node)
    if t in ("integer", "number", "boolean"):
        yield path, node
    elif t == "array" and isinstance(node.get("items"), dict):
        yield from _walk((*path, "0"), node["items"])
    elif t == "object":
        yield from typed_fields(node, path)


def bad_values(node: dict[str, Any]) -> list[str]:
    """What must be refused for a field of this schema, as JSON text."""
    t = _type(node)
    if t == "boolean":
        return list(_NOT_A_BOOLEAN)
    out = list(_NON_FINITE + _NOT_A_NUMBER)
    if t == "integer":
        out += ["1.5", "2.0"]  # strict: an integer is written as one
    if "minimum" in node:
        out.append(json.dumps(node["minimum"] - 1))
    if "exclusiveMinimum" in node:
        out += [json.dumps(node["exclusiveMinimum"]), json.dumps(node["exclusiveMinimum"] - 1)]
    if "maximum" in node:
        out.append(json.dumps(node["maximum"] + 1))
    if "exclusiveMaximum" in node:
        out.append(json.dumps(node["exclusiveMaximum"]))
    return out


def _put(args: Any, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        args = args[int(key)] if isinstance(args, list) else args.setdefault(key, {})
    last = path[-1]
    if isinstance(args, list):
        args[int(last)] = value
    else:
        args[last] = value


def cases(schemas: Iterable[tuple[str, dict[str, Any]]]) -> list[Case]:
    """Every bad case of every (tool name, parameters schema). Raises KeyError naming a
    tool that has no valid base arguments in :data:`BASE`."""
    out = []
    for tool, schema in schemas:
        if tool not in BASE:
            raise KeyError(f"tests/unit/strict_cases.py: give {tool!r} its valid arguments in BASE")
        for path, node in typed_fields(schema):
            for raw in bad_values(node):
                args = json.loads(json.dumps(BASE[tool]))
                _put(args, path, _PLACEHOLDER)
                text = json.dumps(args).replace(json.dumps(_PLACEHOLDER), raw)
                out.append(Case(tool, ".".join(path), raw, text))
    return out


def expected(case: Case, error: str | None) -> bool:
    """Whether ``error`` is the refusal ``case`` must get: the tool and the field named."""
    return error is not None and error.startswith(f"Invalid arguments for {case.tool}: ") and f"'{case.field}'" in error
