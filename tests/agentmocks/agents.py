"""How to run the real agent CLIs headless against a provider (the mock or a real one): the
argv and environment each needs (see /work/wt/notes/agents-findings.md for why each piece)."""

from __future__ import annotations

MOCK_CODEX_MODEL = "gpt-5-codex"  # a model whose request has a plain top-level tool list


def claude_argv(binary: str, prompt: str) -> list[str]:
    return [binary, "-p", prompt, "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions"]


def claude_env(base_url: str, key: str) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        "IS_SANDBOX": "1",  # else --dangerously-skip-permissions refuses to run as root
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, no /api/hello, no DNS of its own
        "DISABLE_AUTOUPDATER": "1",
    }


def codex_argv(binary: str, prompt: str, base_url: str, model: str = MOCK_CODEX_MODEL) -> list[str]:
    """``base_url`` ends in ``/v1``. OPENAI_BASE_URL is not honoured by Codex's built-in provider
    (it dials api.openai.com's WebSocket), so a provider of our own is configured."""
    provider = f'{{name="loom",base_url="{base_url}",env_key="OPENAI_API_KEY",wire_api="responses"}}'
    return [
        binary,
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-m",
        model,
        "-c",
        "model_provider=loom",
        "-c",
        f"model_providers.loom={provider}",
        "-c",
        "check_for_update_on_startup=false",
        prompt,
    ]


def codex_env(key: str, codex_home: str) -> dict[str, str]:
    return {"OPENAI_API_KEY": key, "CODEX_HOME": codex_home}
