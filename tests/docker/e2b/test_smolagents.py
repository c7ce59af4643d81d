"""smolagents' ``CodeAgent(executor_type="e2b")`` (its ``E2BExecutor``, unchanged) runs its
code in loom: a scripted model (no network) answers two code actions, the first writes a
file and prints, the second gives the final answer; the file is the sandbox's workspace's,
and ``loom-worker log`` (the real CLI, reading the service's data directory) shows it.

E2BExecutor pip-installs ``additional_authorized_imports`` (none here) and the imports of
its tools: of its own final answer tool, ``pillow`` and ``numpy``, which loom's image has
(matplotlib's); the sandbox has no network and its pip refuses at once (Debian's PEP 668
marker), the agent goes on: it runs offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.docker.e2b.conftest import E2BServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

#: The model's two turns: CodeAgent's default code block tags are <code>...</code>.
ACTIONS = [
    "Thought: I write the report.\n<code>\n"
    "with open('report.txt', 'w') as f:\n"
    "    f.write('made by a smolagents CodeAgent')\n"
    "print('wrote', len(open('report.txt').read()), 'characters')\n"
    "</code>",
    "Thought: Done.\n<code>\nfinal_answer(open('report.txt').read().upper())\n</code>",
]


def test_code_agent_runs_in_loom(e2b_server: E2BServer) -> None:
    from smolagents import CodeAgent
    from smolagents.models import ChatMessage, MessageRole, Model

    class Scripted(Model):
        """Answers the canned actions in turn, and records what the agent showed it."""

        def __init__(self) -> None:
            super().__init__(model_id="scripted")
            self.seen: list[str] = []

        def generate(self, messages: list[Any], stop_sequences: Any = None, **kwargs: Any) -> ChatMessage:
            self.seen.append(json.dumps([m.dict() if hasattr(m, "dict") else m for m in messages], default=str))
            return ChatMessage(role=MessageRole.ASSISTANT, content=ACTIONS[len(self.seen) - 1])

    model = Scripted()
    agent = CodeAgent(tools=[], model=model, executor_type="e2b", additional_authorized_imports=[], max_steps=3)
    executor: Any = agent.python_executor  # (smolagents' E2BExecutor)
    try:
        sandbox_id = executor.sandbox.sandbox_id
        answer = agent.run("Write a report file, then answer with its text in capitals.")
        # What it ran `!pip install` for (its final answer tool's imports): in loom's
        # image already (matplotlib's), and pip refuses at once (Debian's PEP 668 marker).
        assert set(executor.installed_packages) <= {"pillow", "numpy"}
        assert executor.sandbox.run_code("import PIL, numpy").error is None
    finally:
        agent.cleanup()

    assert answer == "MADE BY A SMOLAGENTS CODEAGENT"
    assert len(model.seen) == 2
    assert "wrote 30 characters" in model.seen[1]  # the first action's output, as the agent saw it

    # The file is the workspace's, and its changelog says the code wrote it.
    workspace = e2b_server.workspace(sandbox_id)
    assert (workspace / "report.txt").read_text() == "made by a smolagents CodeAgent"
    env = {**os.environ, "LOOM_DATA_DIR": str(e2b_server.data), "LOOM_WORKSPACE_ROOT": str(e2b_server.root)}
    cli = Path(sys.executable).with_name("loom-worker")
    done = subprocess.run(
        [str(cli), "log", "-w", str(workspace), "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    made = [e for e in entries if e["path"] == "report.txt"]
    assert len(made) == 1 and made[0]["op"] == "create" and made[0]["tool"] == "e2b.run_code"
    plain = subprocess.run(
        [str(cli), "log", "-w", str(workspace)], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert "report.txt" in plain.stdout and "e2b.run_code" in plain.stdout
