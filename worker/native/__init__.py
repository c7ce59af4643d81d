"""The vendors' own tools, executed natively on a workspace: Anthropic's ``bash``
(``bash_20250124``) and text editor (``text_editor_20250728``,
``str_replace_based_edit_tool``), OpenAI's ``shell`` and ``apply_patch``.

Each is a registry :class:`~worker.tool.Tool` (one module per tool) whose arguments are the
vendor's input, mapped onto the workspace's sandbox and changelog; :mod:`.calls` turns a
vendor's block into a registry call and the result back into the vendor's block. See
``docs/native-tools.md``.
"""

from __future__ import annotations

from .calls import (
    ANTHROPIC_NAMES,
    OPENAI_NAMES,
    anthropic_result,
    anthropic_tools,
    apply_envelope,
    apply_patch_output,
    install,
    native_tools,
    openai_tools,
    run_anthropic,
    run_openai,
    shell_output,
)

__all__ = [
    "ANTHROPIC_NAMES",
    "OPENAI_NAMES",
    "anthropic_result",
    "anthropic_tools",
    "apply_envelope",
    "apply_patch_output",
    "install",
    "native_tools",
    "openai_tools",
    "run_anthropic",
    "run_openai",
    "shell_output",
]
