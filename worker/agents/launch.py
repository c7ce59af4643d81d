"""How each known agent CLI is started by ``agent run``: its argv (headless with JSON lines
on stdout, or interactive on a terminal), the variables that turn its telemetry, error
reports and self-updates off, and the provider it talks to. Any other ``AGENT`` is a
command of the user's, run as given with the prompt as its last argument.

Flags checked against the CLIs' own ``--help`` (Claude Code 2.1, Codex 0.17x); see
docs/agents.md.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .providers import PROVIDERS, Provider


@dataclass(frozen=True)
class AgentKind:
    """A known agent: its executable, headless and interactive argv, provider, quiet env."""

    name: str
    binary: str
    headless: tuple[str, ...]  # after the binary; the prompt goes where "{prompt}" is
    interactive: tuple[str, ...]
    provider: str | None
    quiet_env: tuple[tuple[str, str], ...] = ()
    quiet_args: tuple[str, ...] = ()


KINDS: dict[str, AgentKind] = {
    "claude": AgentKind(
        "claude",
        "claude",
        ("-p", "{prompt}", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions"),
        ("--dangerously-skip-permissions",),
        "anthropic",
        quiet_env=(
            ("DISABLE_TELEMETRY", "1"),
            ("DISABLE_ERROR_REPORTING", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("DISABLE_BUG_COMMAND", "1"),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            # --dangerously-skip-permissions refuses to run as root without it (a workspace
            # may run its sandbox as root); the sandbox is what makes skipping them safe.
            ("IS_SANDBOX", "1"),
        ),
    ),
    "codex": AgentKind(
        "codex",
        "codex",
        ("exec", "--json", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check", "{prompt}"),
        ("--dangerously-bypass-approvals-and-sandbox",),
        "openai",
        # Codex has no variables for these: its config keys, given with -c.
        quiet_args=("-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false"),
    ),
    "opencode": AgentKind(
        "opencode",
        "opencode",
        ("run", "{prompt}"),
        (),
        None,
        quiet_env=(("OPENCODE_DISABLE_AUTOUPDATE", "1"), ("OPENCODE_DISABLE_SHARE", "1")),
    ),
}


@dataclass(frozen=True)
class Launch:
    """What starts in the sandbox: ``command`` (for ``sh -c``), ``argv`` (the same as
    words, shown in run.json), ``env`` on top of the sandbox's (never a key: a key is
    the gateway secret's placeholder, already in the sandbox's environment)."""

    argv: list[str]
    command: str
    env: dict[str, str]
    kind: AgentKind | None


def codex_provider_args(provider: Provider) -> list[str]:
    """Codex's built-in ``openai`` provider ignores ``OPENAI_BASE_URL`` and dials
    api.openai.com's WebSocket first (checked on 0.171): a provider of loom's own, on the
    Responses API at the provider's base URL with its key variable, is what it honours."""
    base = provider.base_url or "https://api.openai.com/v1"
    table = f'{{name="loom",base_url="{base}",env_key="{provider.key_env}",wire_api="responses"}}'
    return ["-c", "model_provider=loom", "-c", f"model_providers.loom={table}"]


def provider_for(agent: str) -> Provider | None:
    """The preset provider of a known agent (None: a custom command, or OpenCode)."""
    kind = KINDS.get(agent)
    return PROVIDERS[kind.provider] if kind is not None and kind.provider else None


def build(
    agent: str,
    prompt: str | None,
    extra: list[str],
    *,
    provider: Provider | None,
    tty: bool = False,
    turn_args: list[str] | None = None,
) -> Launch:
    """The launch of ``agent`` (a known name or a shell command) with ``prompt`` and the
    user's ``extra`` arguments (after ours, so they can override), pointed at
    ``provider``'s base URL. ``turn_args``: what turn-by-turn recording adds.

    Raises ValueError when a known agent needs a prompt (headless) and has none."""
    env: dict[str, str] = {}
    if provider is not None and provider.base_url_env and provider.base_url:
        env[provider.base_url_env] = provider.base_url
    kind = KINDS.get(agent)
    if kind is None:  # a command of the user's: as given, its words and the prompt after
        words = shlex.split(agent)
        argv = [*words, *extra, *([prompt] if prompt is not None else [])]
        command = " ".join([agent, *(shlex.quote(w) for w in argv[len(words) :])])
        return Launch(argv, command, env, None)
    env.update(kind.quiet_env)
    quiet = list(kind.quiet_args)
    if kind.name == "codex" and provider is not None:
        quiet += codex_provider_args(provider)
    if tty:
        argv = [kind.binary, *kind.interactive, *quiet, *(turn_args or []), *extra]
        if prompt is not None:
            argv.append(prompt)
    else:
        if prompt is None:
            raise ValueError(f"{agent} runs headless with a prompt: give --prompt or --prompt-file (or --tty)")
        argv = [kind.binary]
        for word in kind.headless:
            argv.append(prompt if word == "{prompt}" else word)
        # Quiet args after the subcommand (Codex's ``exec``), which must come first.
        at = 2 if kind.headless[0] == "exec" else 1
        argv[at:at] = quiet
        argv += [*(turn_args or []), *extra]
    return Launch(argv, shlex.join(argv), env, kind)


def model_in(extra: list[str]) -> str | None:
    """The model the user's arguments ask for (``-m X``, ``--model X``, ``--model=X``)."""
    for i, word in enumerate(extra):
        if word in ("-m", "--model") and i + 1 < len(extra):
            return extra[i + 1]
        if word.startswith("--model="):
            return word.split("=", 1)[1]
    return None
