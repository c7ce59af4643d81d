"""The examples' agent loops (examples/anthropic_loop.py, examples/openai_loop.py) against
recorded model turns, built from the SDKs' own types and played back by a client object
in place of the SDK's (no network), on the real engine; and the HTTP routes with each
vendor's JSON. The examples cannot rot: what they send back is checked against the API's
input types too."""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from anthropic.types import Message, ToolResultBlockParam
from openai.types.responses import Response
from openai.types.responses.response_input_item_param import ApplyPatchCallOutput, ShellCallOutput
from pydantic import TypeAdapter

from tests.docker.conftest import own_registry
from tests.unit.test_http import running

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def message(n: int, content: list[dict[str, Any]], stop: str) -> Message:
    return Message.model_validate(
        {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }
    )


def response(n: int, output: list[dict[str, Any]]) -> Response:
    return Response.model_validate(
        {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 0,
            "model": "gpt-5.1",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


class Recorded:
    """Plays back recorded turns and keeps every request (a stand-in for the SDK client)."""

    def __init__(self, turns: list[Any]) -> None:
        self.turns = list(turns)
        self.requests: list[dict[str, Any]] = []

    async def create(self, **request: Any) -> Any:
        self.requests.append(copy.deepcopy(request))  # the loop appends to its lists later
        return self.turns.pop(0)


@pytest.fixture(params=["runc", pytest.param("runsc", marks=pytest.mark.gvisor)])
async def registry(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[Any]:
    async with own_registry(tmp_path, request.param) as reg:
        yield reg


async def test_the_anthropic_loop_runs_recorded_turns(registry: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("def greet():\n    return 'hi'\n")
    turns = [
        message(
            1,
            [{"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "cd /workspace && ls"}}],
            "tool_use",
        ),
        message(
            2,
            [
                {"type": "text", "text": "Editing."},
                {
                    "type": "tool_use",
                    "id": "toolu_02",
                    "name": "str_replace_based_edit_tool",
                    "input": {
                        "command": "str_replace",
                        "path": "/workspace/app.py",
                        "old_str": "'hi'",
                        "new_str": "'hello'",
                    },
                },
                {
                    "type": "tool_use",
                    "id": "toolu_03",
                    "name": "bash",
                    "input": {"command": "python3 -c 'import app; print(app.greet())'"},
                },
            ],
            "tool_use",
        ),
        message(3, [{"type": "text", "text": "Done: greet() says hello."}], "end_turn"),
    ]
    client = Recorded(turns)
    loop = example("anthropic_loop")
    final = await loop.run("Make greet say hello", ws, client=SimpleNamespace(messages=client), registry=registry)
    assert final.stop_reason == "end_turn" and (ws / "app.py").read_text() == "def greet():\n    return 'hello'\n"
    assert client.requests[0]["tools"] == [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 20000},
    ]
    results = client.requests[2]["messages"][-1]["content"]
    adapter = TypeAdapter(ToolResultBlockParam)
    for r in results:
        adapter.validate_python(r)
    assert [r["tool_use_id"] for r in results] == ["toolu_02", "toolu_03"]
    assert results[1]["content"] == [{"type": "text", "text": "hello"}] and not results[1]["is_error"]
    first = client.requests[1]["messages"][-1]["content"][0]
    assert first["content"] == [{"type": "text", "text": "app.py"}]


async def test_the_openai_loop_runs_recorded_turns(registry: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    patch = "@@ def add(a, b):\n-    return a - b\n+    return a + b\n"
    turns = [
        response(
            1,
            [
                {
                    "type": "shell_call",
                    "id": "sh_1",
                    "call_id": "call_1",
                    "status": "completed",
                    "action": {"commands": ["cat calc.py"], "timeout_ms": 10000, "max_output_length": 4096},
                }
            ],
        ),
        response(
            2,
            [
                {
                    "type": "apply_patch_call",
                    "id": "ap_1",
                    "call_id": "call_2",
                    "status": "completed",
                    "operation": {"type": "update_file", "path": "calc.py", "diff": patch},
                },
                {
                    "type": "apply_patch_call",
                    "id": "ap_2",
                    "call_id": "call_3",
                    "status": "completed",
                    "operation": {"type": "update_file", "path": "calc.py", "diff": "@@\n-nothing like this\n+x\n"},
                },
            ],
        ),
        response(
            3,
            [
                {
                    "type": "shell_call",
                    "id": "sh_2",
                    "call_id": "call_4",
                    "status": "completed",
                    "action": {"commands": ["python3 -c 'import calc; print(calc.add(2, 3))'"]},
                }
            ],
        ),
        response(
            4,
            [
                {
                    "type": "message",
                    "id": "m_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Fixed.", "annotations": []}],
                }
            ],
        ),
    ]
    client = Recorded(turns)
    loop = example("openai_loop")
    final = await loop.run("Fix add", ws, client=SimpleNamespace(responses=client), registry=registry)
    assert final.output_text == "Fixed." and "a + b" in (ws / "calc.py").read_text()
    assert client.requests[0]["tools"] == [{"type": "shell"}, {"type": "apply_patch"}]
    shell_out = client.requests[1]["input"][0]
    TypeAdapter(ShellCallOutput).validate_python(shell_out)
    assert shell_out["max_output_length"] == 4096
    assert shell_out["output"][0]["stdout"] == "def add(a, b):\n    return a - b\n"
    patched, refused = client.requests[2]["input"]
    for item in (patched, refused):
        TypeAdapter(ApplyPatchCallOutput).validate_python(item)
    assert patched["status"] == "completed" and refused["status"] == "failed"
    assert refused["output"].startswith("Failed to find expected lines in calc.py")
    assert client.requests[3]["input"][0]["output"][0]["stdout"] == "5\n"
    assert client.requests[3]["previous_response_id"] == "resp_3"


async def test_the_http_routes_speak_each_vendor_s_json(registry: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proj").mkdir(parents=True)
    async with running(root, registry) as svc:
        c = svc.client
        tools = (await c.get("/v1/native/tools", params={"vendor": "anthropic", "max_characters": 500})).json()
        assert tools[1] == {
            "type": "text_editor_20250728",
            "name": "str_replace_based_edit_tool",
            "max_characters": 500,
        }
        assert (await c.get("/v1/native/tools", params={"vendor": "openai"})).json() == [
            {"type": "shell"},
            {"type": "apply_patch"},
        ]
        base = "/v1/workspaces/proj/native"
        block = {
            "type": "tool_use",
            "id": "toolu_h1",
            "name": "bash",
            "input": {"command": "export X=1; echo made > f.txt"},
        }
        r = await c.post(f"{base}/anthropic", json=block)
        assert r.status_code == 200 and r.json() == {
            "type": "tool_result",
            "tool_use_id": "toolu_h1",
            "content": [],
            "is_error": False,
        }
        block = {"type": "tool_use", "id": "toolu_h2", "name": "bash", "input": {"command": "echo X=$X"}}
        assert (await c.post(f"{base}/anthropic", json=block)).json()["content"] == [{"type": "text", "text": "X=1"}]
        block = {
            "type": "tool_use",
            "id": "toolu_h3",
            "name": "str_replace_based_edit_tool",
            "input": {"command": "view", "path": "/workspace/f.txt"},
        }
        body = (await c.post(f"{base}/anthropic", json=block)).json()
        assert (
            body["content"][0]["text"]
            == "Here's the result of running `cat -n` on /workspace/f.txt:\n     1\tmade\n     2\t\n"
        )
        item = {
            "type": "apply_patch_call",
            "id": "ap",
            "call_id": "call_h4",
            "status": "completed",
            "operation": {"type": "update_file", "path": "f.txt", "diff": "@@\n-made\n+patched\n"},
        }
        body = (await c.post(f"{base}/openai", json=item)).json()
        assert body == {
            "type": "apply_patch_call_output",
            "call_id": "call_h4",
            "status": "completed",
            "output": "Success. Updated the following files:\nM f.txt\n",
        }
        item = {
            "type": "shell_call",
            "id": "sh",
            "call_id": "call_h5",
            "status": "completed",
            "action": {"commands": ["cat f.txt"]},
        }
        body = (await c.post(f"{base}/openai", json=item)).json()
        assert body["output"] == [{"stdout": "patched\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
        # Bad input names the field (422); another vendor item type is refused the same way.
        r = await c.post(f"{base}/openai", json={"type": "shell_call", "call_id": "x", "action": {"commands": []}})
        assert r.status_code == 422 and "commands" in r.text
        r = await c.post(f"{base}/anthropic", json={"type": "tool_use", "name": "bash", "input": {}})
        assert r.status_code == 422 and "id" in r.text
        # The calls are in the journal (the dashboard's timeline) under the vendors' ids.
        calls = (await c.get("/v1/workspaces/proj/calls")).json()
        ids = {row.get("call_id") for row in calls.get("calls", calls) if isinstance(row, dict)}
        assert {"toolu_h1", "toolu_h3", "call_h4", "call_h5"} <= ids
        # Without the token, nothing runs.
        r = await c.post(f"{base}/openai", json=item, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
