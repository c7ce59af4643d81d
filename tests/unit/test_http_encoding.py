"""The hot routes answer with bytes encoded once from the ToolResult: same JSON as the
result, the documented response schemas, and no 500 for awkward text."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from worker.http import create_app
from worker.result import ToolResult
from worker.service import encode_json, result_dict
from worker.settings import Settings


def test_result_dict_is_the_result_as_json() -> None:
    r = ToolResult.ok("héllo ✓", data={"path": "a.txt", "nested": {"n": [1, 2]}}, files_changed=["a.txt"])
    assert result_dict(r) == r.to_dict()
    body = encode_json(result_dict(r))
    assert json.loads(body) == json.loads(r.to_json())
    assert "héllo ✓".encode() in body  # UTF-8, not \\u escapes


def test_values_json_cannot_hold_become_strings() -> None:
    r = ToolResult.ok("x", data={"where": Path("/w/a.txt")})
    assert json.loads(encode_json(result_dict(r)))["data"]["where"] == "/w/a.txt"


def test_lone_surrogates_are_escaped_not_refused() -> None:
    name = b"bad\xff.txt".decode("utf-8", "surrogateescape")
    body = encode_json({"files_changed": [name]})
    assert json.loads(body) == {"files_changed": [name]}


def test_openapi_still_documents_the_response_models() -> None:
    app = create_app(Settings(workspace_root=Path(tempfile.mkdtemp()), api_token="t"), object())
    doc: dict[str, Any] = app.openapi()
    ok = doc["paths"]["/v1/workspaces/{workspace_id}/execute"]["post"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ToolResultOut"}
    calls = doc["paths"]["/v1/workspaces/{workspace_id}/tool_calls"]["post"]["responses"]["200"]
    schema = calls["content"]["application/json"]["schema"]
    assert schema["type"] == "array" and schema["items"] == {"$ref": "#/components/schemas/ToolMessage"}


def test_the_default_response_never_fails_on_a_lone_surrogate() -> None:
    from worker.http import SafeJSONResponse

    name = b"bad\xff.txt".decode("utf-8", "surrogateescape")
    r = SafeJSONResponse({"detail": f"Not found: {name}"})
    assert json.loads(r.body.decode("utf-8")) == {"detail": f"Not found: {name}"}
    assert SafeJSONResponse({"ok": "caf\u00e9"}).body == '{"ok":"caf\u00e9"}'.encode()
