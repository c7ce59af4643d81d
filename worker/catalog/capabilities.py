"""Capability tags and search keywords, extracted from a tool's name and description.

Matching is on *whole words* (after splitting ``snake_case``, ``kebab-case`` and
``camelCase``), never on substrings: "thread" is not "read", "showcase" is not "case",
"sqlite" is not "sql" unless listed. The Go registry matched substrings, which tagged
``thread_dump`` as file I/O; this module exists so that cannot happen again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .index import Source, ToolDescriptor
from .tags import CAPABILITIES

# Whole words (lower case, after splitting identifiers) that imply a tag. Multi-word
# phrases are written with a space and matched as consecutive words.
_TRIGGERS: dict[str, tuple[str, ...]] = {
    "file_io": (
        "file",
        "files",
        "read",
        "reads",
        "write",
        "writes",
        "directory",
        "directories",
        "folder",
        "filesystem",
        "path",
        "paths",
        "edit",
        "append",
        "upload",
        "download",
        "disk",
    ),
    "http": (
        "http",
        "https",
        "rest",
        "api",
        "apis",
        "url",
        "urls",
        "webhook",
        "webhooks",
        "request",
        "requests",
        "endpoint",
        "endpoints",
        "graphql",
        "fetch",
        "curl",
    ),
    "database": (
        "database",
        "databases",
        "sql",
        "sqlite",
        "postgres",
        "postgresql",
        "mysql",
        "mongodb",
        "redis",
        "db",
        "migration",
        "migrations",
        "tables",
    ),
    "notification": (
        "notify",
        "notification",
        "notifications",
        "alert",
        "alerts",
        "slack",
        "email",
        "emails",
        "sms",
        "pagerduty",
        "teams",
        "discord",
        "telegram",
        "pager",
        "webhook",
    ),
    "shell": (
        "shell",
        "bash",
        "command",
        "commands",
        "execute",
        "exec",
        "terminal",
        "script",
        "scripts",
        "run",
        "process",
        "processes",
    ),
    "search": ("search", "find", "lookup", "grep", "locate", "query", "index", "discover"),
    "transform": (
        "transform",
        "convert",
        "conversion",
        "format",
        "parse",
        "serialize",
        "encode",
        "decode",
        "translate",
        "compress",
        "decompress",
        "resize",
        "minify",
        "csv",
        "json",
        "yaml",
        "xml",
    ),
    "validate": (
        "validate",
        "validation",
        "lint",
        "linter",
        "check",
        "verify",
        "test",
        "tests",
        "audit",
        "typecheck",
    ),
    "generate": ("generate", "create", "scaffold", "template", "synthesize", "compose", "draft"),
    "analyze": (
        "analyze",
        "analyse",
        "analysis",
        "inspect",
        "review",
        "profile",
        "metrics",
        "statistics",
        "stats",
        "summarize",
        "count",
        "measure",
        "diagnose",
    ),
    "web_search": ("web search", "search engine", "google", "bing", "tavily", "duckduckgo", "serp"),
    "code": (
        "code",
        "function",
        "functions",
        "refactor",
        "compile",
        "build",
        "python",
        "javascript",
        "typescript",
        "rust",
        "golang",
        "java",
        "symbol",
        "symbols",
        "ast",
    ),
    "git": (
        "git",
        "commit",
        "commits",
        "branch",
        "branches",
        "diff",
        "merge",
        "rebase",
        "repository",
        "repo",
        "github",
        "gitlab",
        "pull request",
    ),
    "kubernetes": ("kubernetes", "k8s", "kubectl", "pod", "pods", "helm", "deployment", "cluster"),
    "aws": ("aws", "s3", "ec2", "lambda", "dynamodb", "cloudwatch", "iam", "sqs", "sns"),
    "visualization": (
        "chart",
        "charts",
        "graph",
        "graphs",
        "plot",
        "plots",
        "visualize",
        "visualization",
        "diagram",
        "dashboard",
        "histogram",
    ),
}

# Words that mean the tool changes state or runs something: it needs approval.
_APPROVAL_WORDS = frozenset(
    {
        "bash",
        "shell",
        "exec",
        "execute",
        "run",
        "write",
        "writes",
        "edit",
        "delete",
        "remove",
        "create",
        "update",
        "deploy",
        "install",
        "kill",
        "drop",
        "push",
        "commit",
        "send",
        "post",
        "apply",
        "move",
        "rename",
        "overwrite",
        "modify",
    }
)

STOP_WORDS = frozenset(
    """a an and are as at be but by can could do does for from how i if in into is it its me my
    of on or please should so some than that the their them then there these this those to too
    use uses using via want was we what when where which while who will with would you your
    tool tools given any all""".split()
)

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def words(text: str) -> list[str]:
    """Lower-case words of ``text``; identifiers are split on ``_``, ``-`` and camelCase."""
    return [w.lower() for w in _WORD.findall(_CAMEL.sub(" ", text))]


def _phrase_hit(seq: list[str], wordset: set[str], phrase: str) -> bool:
    if " " not in phrase:
        return phrase in wordset
    parts = phrase.split()
    n = len(parts)
    return any(seq[i : i + n] == parts for i in range(len(seq) - n + 1))


def extract_capabilities(name: str, description: str, extra: Iterable[str] = ()) -> list[str]:
    """Capability tags for a tool, in the canonical order of :data:`CAPABILITIES`.

    ``extra`` are tags declared by the tool's author; unknown ones are ignored.
    """
    seq = words(name) + words(description)
    wordset = set(seq)
    found = {c for c in extra if c in _TRIGGERS}
    for cap, triggers in _TRIGGERS.items():
        if cap not in found and any(_phrase_hit(seq, wordset, t) for t in triggers):
            found.add(cap)
    return [c for c in CAPABILITIES if c in found]


def extract_keywords(name: str, description: str, parameters: Iterable[str] = (), limit: int = 20) -> list[str]:
    """Up to ``limit`` distinct meaningful words: name parts first, then description, then
    parameter names; stop-words, numbers and one-letter words removed."""
    out: list[str] = []
    seen: set[str] = set()
    for w in words(name) + words(description) + [p for n in parameters for p in words(n)]:
        if w in seen or w in STOP_WORDS or len(w) < 2 or w.isdigit():
            continue
        seen.add(w)
        out.append(w)
        if len(out) >= limit:
            break
    return out


def needs_approval(name: str, description: str, capabilities: Iterable[str]) -> bool:
    """True for tools that execute commands or write/change state."""
    if "shell" in set(capabilities):
        return True
    return bool(_APPROVAL_WORDS.intersection(words(name)))


def make_descriptor(
    *,
    source: Source,
    name: str,
    description: str,
    input_schema: dict[str, Any] | None = None,
    mcp_server: str = "",
    output_schema: dict[str, Any] | None = None,
    capabilities: Iterable[str] = (),
    keywords: Iterable[str] = (),
    examples: Iterable[dict[str, Any]] = (),
    version: str | None = None,
    requires_approval: bool | None = None,
) -> ToolDescriptor:
    """A descriptor with its id, capabilities, keywords and approval flag filled in.

    Declared ``capabilities``/``keywords`` are merged with the extracted ones;
    ``requires_approval=None`` means "decide from the name and capabilities".
    """
    schema = input_schema or {"type": "object", "properties": {}}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    caps = extract_capabilities(name, description, capabilities)
    kws = list(dict.fromkeys([k.lower() for k in keywords if k.strip()]))
    kws = (kws + [k for k in extract_keywords(name, description, props or ()) if k not in kws])[:20]
    tool_id = f"mcp:{mcp_server}:{name}" if source == "mcp" else f"{source}:{name}"
    return ToolDescriptor(
        id=tool_id,
        name=name,
        description=description.strip(),
        source=source,
        mcp_server=mcp_server if source == "mcp" else "",
        input_schema=schema,
        output_schema=output_schema,
        capabilities=tuple(caps),
        keywords=tuple(kws),
        examples=tuple(examples),
        version=version,
        requires_approval=(needs_approval(name, description, caps) if requires_approval is None else requires_approval),
    )


def descriptor_from_openai(schema: dict[str, Any], *, source: Source = "builtin") -> ToolDescriptor:
    """Descriptor for an OpenAI-format tool schema ``{"type": "function", "function": {...}}``
    (what ``ToolRegistry.all_schemas()`` returns). Raises ValueError when it has no name."""
    fn = schema.get("function", schema)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("tool schema without a function name")
    return make_descriptor(
        source=source,
        name=name,
        description=str(fn.get("description") or ""),
        input_schema=fn.get("parameters") or None,
    )
