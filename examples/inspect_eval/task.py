"""An inspect_ai evaluation whose samples run in loom-worker sandboxes (``sandbox="loom"``).

Each sample is the small ``tinycalc`` project (``project/``) with one bug put in by the
sample's setup script; the solver gives the model inspect's ``bash`` tool; the scorer runs
the project's own test suite in the sample's sandbox. By default the model is scripted
(inspect's ``mockllm`` with fixed outputs, no network): it runs the tests, reads which
one fails, and applies the fix it knows for it; it knows none for the third sample's
bug, so that sample scores INCORRECT. Run it::

    pip install 'loom-worker[inspect]'
    inspect eval examples/inspect_eval/task.py                    # runc (loom.yaml)
    inspect eval examples/inspect_eval/task.py -T config=loom-gvisor.yaml
    inspect eval examples/inspect_eval/task.py -T scripted=false --model openai/gpt-4o

No import of loom-worker is needed: ``sandbox=("loom", ...)`` finds the provider through
its entry point.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessage, GenerateConfig, ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import ToolChoice, ToolInfo, bash
from inspect_ai.util import sandbox

HERE = Path(__file__).resolve().parent
PROMPT = "The test suite of the tinycalc project in the current directory fails. Find the bug and fix it."
TESTS = ["python3", "-m", "unittest", "discover", "-s", "tests"]

# Each sample: the bug its setup script puts in.
BUGS = {
    "sub": "sed -i 's/return a - b/return b - a/' tinycalc/ops.py",
    "mul": "sed -i 's/return a \\* b/return a * b + 1/' tinycalc/ops.py",
    "unary-minus": "sed -i 's/return -value, rest/return value, rest/' tinycalc/parser.py",
}
# What the scripted model does about a failing test (it has nothing for test_unary_and_float).
FIXES = {
    "test_sub": "sed -i 's/return b - a/return a - b/' tinycalc/ops.py && python3 -m unittest discover -s tests",
    "test_mul": "sed -i 's/return a \\* b + 1/return a * b/' tinycalc/ops.py && python3 -m unittest discover -s tests",
}


def scripted_model(
    messages: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice, config: GenerateConfig
) -> ModelOutput:
    """A stand-in for a model, turn by turn: run the tests; fix the failing test's bug if
    it knows how; say it is done."""
    output = _turn(messages)
    # Usage said, so mockllm does not count tokens (with tiktoken's encodings, downloaded:
    # this eval needs no network).
    output.usage = ModelUsage(input_tokens=len(messages), output_tokens=1, total_tokens=len(messages) + 1)
    return output


def _turn(messages: list[ChatMessage]) -> ModelOutput:
    results = [m for m in messages if m.role == "tool"]
    if not results:
        return ModelOutput.for_tool_call(
            "mockllm/model", "bash", {"command": "python3 -m unittest discover -s tests 2>&1 | tail -n 20"}
        )
    if len(results) == 1:
        failing = re.findall(r"(?:FAIL|ERROR): (test_\w+)", results[0].text)
        fix = next((FIXES[name] for name in failing if name in FIXES), None)
        if fix is not None:
            return ModelOutput.for_tool_call("mockllm/model", "bash", {"command": fix})
        return ModelOutput.from_content("mockllm/model", f"I do not know how to fix {', '.join(failing) or 'this'}.")
    return ModelOutput.from_content("mockllm/model", "Fixed: the test suite passes.")


@scorer(metrics=[accuracy()])
def project_tests() -> Any:
    """The project's own test suite, run in the sample's sandbox."""

    async def score(state: TaskState, target: Target) -> Score:
        result = await sandbox().exec(TESTS, timeout=120)
        return Score(value=CORRECT if result.success else INCORRECT, explanation=result.stderr[-2000:])

    return score


@task
def tinycalc_bugs(config: str = "loom.yaml", scripted: bool = True) -> Task:
    """Three bugs in tinycalc, one sandbox per sample. ``config``: the loom sandbox's
    YAML (next to this file); ``scripted``: the mockllm script as the model (false: the
    eval's own model)."""
    dataset = [
        Sample(
            id=name,
            input=PROMPT,
            target="the test suite passes",
            files={".": str(HERE / "project")},
            setup=bug,
        )
        for name, bug in BUGS.items()
    ]
    return Task(
        dataset=dataset,
        solver=[use_tools(bash(timeout=60)), generate()],
        scorer=project_tests(),
        sandbox=("loom", str(HERE / config)),
        model=get_model("mockllm/model", custom_outputs=scripted_model) if scripted else None,
    )
