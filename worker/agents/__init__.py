"""Whole agent CLIs (Claude Code, Codex, OpenCode, any command) run inside a workspace's
sandbox: the host's agents store (``store``), ``agent run`` (``run``, ``providers``,
``transcript``), turn by turn undo (``turns``), and the hand-off of what the agent did
(:mod:`worker.handoff`). See docs/agents.md.
"""
