"""The agent CLIs loom knows by name: their npm package, the executable it provides and the
model provider whose key it needs (:mod:`worker.agents.providers`). ``loom-worker agent
install NAME`` installs one of these into the host's agents store (:mod:`.store`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A version ``agent install`` accepts: an exact version (``2.1.3``, ``1.0.0-beta.2``) or a
#: dist-tag of the registry (``latest``, ``next``); never a range, a URL or a path, which
#: would make the pinned install something other than what its name says.
VERSION = re.compile(r"^(?:\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?|[a-z][a-z0-9-]{0,31})$")


@dataclass(frozen=True)
class AgentSpec:
    """One known agent CLI."""

    package: str  # the npm package
    binary: str  # the executable it provides (a ``bin`` of the package)
    provider: str | None  # the provider whose key it needs (None: any, or none)


AGENTS: dict[str, AgentSpec] = {
    "claude": AgentSpec(package="@anthropic-ai/claude-code", binary="claude", provider="anthropic"),
    "codex": AgentSpec("@openai/codex", "codex", "openai"),
    "opencode": AgentSpec("opencode-ai", "opencode", None),
}


def check_version(version: str) -> str:
    """``version`` if ``agent install`` takes it. Raises ValueError."""
    if not VERSION.fullmatch(version):
        raise ValueError(f"{version!r} is not a version (an exact one like 2.1.3, or a tag like latest)")
    return version
