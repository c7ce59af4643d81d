"""A complete agent loop on OpenAI's Responses API with the model's own tools, executed by loom.

The model gets OpenAI's ``shell`` and ``apply_patch`` tools; every ``shell_call`` and
``apply_patch_call`` it answers with runs in the workspace's sandbox through loom-worker
(commands under the sandbox's limits, patches all or nothing, every change recorded in
the changelog and undoable with ``loom-worker undo --call <call_id>``), and goes back as a
``shell_call_output`` / ``apply_patch_call_output``, until the model stops calling tools.

    pip install 'loom-worker[examples]'      # the openai SDK
    export OPENAI_API_KEY=...
    python examples/openai_loop.py --workspace ./project "Fix the failing test"

``tests/docker/test_native_examples.py`` runs :func:`run` with a client that plays back
recorded model turns (the SDK's own ``Response`` objects), so this file cannot rot.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from worker.native import openai_tools, run_openai

MODEL = "gpt-5.1"
CALLS = ("shell_call", "apply_patch_call")


async def run(
    task: str, workspace: Path, *, client: Any, registry: Any, model: str = MODEL, max_turns: int = 30
) -> Any:
    """Loop until the model answers without a tool call; returns its last ``Response``."""
    tools = openai_tools()
    response = await client.responses.create(model=model, input=task, tools=tools)
    for _ in range(max_turns):
        outputs = [
            await run_openai(registry, item, workspace=workspace) for item in response.output if item.type in CALLS
        ]
        if not outputs:
            return response
        response = await client.responses.create(
            model=model, previous_response_id=response.id, input=outputs, tools=tools
        )
    raise RuntimeError(f"the model was still calling tools after {max_turns} turns")


async def main() -> None:
    import openai

    from worker.registry import default_registry

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", help="What the model should do.")
    parser.add_argument("--workspace", "-w", type=Path, required=True, help="The project directory.")
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args()
    async with default_registry() as registry:
        final = await run(
            args.task, args.workspace.resolve(), client=openai.AsyncOpenAI(), registry=registry, model=args.model
        )
    print(final.output_text)


if __name__ == "__main__":
    asyncio.run(main())
