"""Mock model providers (Anthropic Messages, OpenAI Responses) driven by scripted sessions, for
running real agent CLIs (Claude Code, Codex) in tests and benchmarks without a model API."""

from tests.agentmocks.agents import claude_argv, claude_env, codex_argv, codex_env
from tests.agentmocks.script import Answer, Edit, Read, Shell, Step, Write, changes, project_files, session
from tests.agentmocks.server import MockProviders, Seen

__all__ = [
    "Answer",
    "Edit",
    "MockProviders",
    "Read",
    "Seen",
    "Shell",
    "Step",
    "Write",
    "changes",
    "claude_argv",
    "claude_env",
    "codex_argv",
    "codex_env",
    "project_files",
    "session",
]
