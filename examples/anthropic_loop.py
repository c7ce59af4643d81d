"""A complete agent loop on Anthropic's Messages API with the model's own tools, executed by loom.

The model gets Anthropic's ``bash`` (``bash_20250124``) and text editor
(``text_editor_20250728``); every ``tool_use`` it answers with runs in the workspace's
sandbox through loom-worker (a persistent shell, edits recorded in the changelog, each
undoable with ``loom-worker undo --call <tool_use id>``), and goes back as a
``tool_result``, until the model stops asking for tools.

    pip install 'loom-worker[examples]'      # the anthropic SDK
    export ANTHROPIC_API_KEY=...
    python examples/anthropic_loop.py --workspace ./project "Add a test for parse() and run it"

``tests/docker/test_native_examples.py`` runs :func:`run` with a client that plays back
recorded model turns (the SDK's own ``Message`` objects), so this file cannot rot.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from worker.native import anthropic_tools, run_anthropic

MODEL = "claude-sonnet-4-5"


async def run(
    task: str, workspace: Path, *, client: Any, registry: Any, model: str = MODEL, max_turns: int = 30
) -> Any:
    """Loop until the model stops asking for tools; returns its last ``Message``."""
    tools = anthropic_tools(max_characters=20000)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        response = await client.messages.create(model=model, max_tokens=4096, tools=tools, messages=messages)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in response.content]})
        if response.stop_reason != "tool_use":
            return response
        results = [
            await run_anthropic(registry, block, workspace=workspace, max_characters=20000)
            for block in response.content
            if block.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    raise RuntimeError(f"the model was still asking for tools after {max_turns} turns")


async def main() -> None:
    import anthropic

    from worker.registry import default_registry

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", help="What the model should do.")
    parser.add_argument("--workspace", "-w", type=Path, required=True, help="The project directory.")
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args()
    async with default_registry() as registry:
        final = await run(
            args.task, args.workspace.resolve(), client=anthropic.AsyncAnthropic(), registry=registry, model=args.model
        )
    print("".join(b.text for b in final.content if b.type == "text"))


if __name__ == "__main__":
    asyncio.run(main())
