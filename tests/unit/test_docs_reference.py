"""The generated references (``docs/reference/``) match the code: a route or a setting
changed without ``python -m worker.docs_gen`` fails here, and the generator leaves
nothing out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import Field

from tests.unit.test_http_access import served, sockets
from worker import docs_gen
from worker.http import create_app
from worker.settings import Settings

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"
FIX = "stale: run `python -m worker.docs_gen` and commit the result"


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return docs_gen.render_all()


@pytest.mark.parametrize("name", [docs_gen.HTTP_MD, docs_gen.CONFIGURATION_MD])
def test_the_reference_is_current(rendered: dict[str, str], name: str) -> None:
    path = REFERENCE / name
    assert path.is_file(), f"{path} is missing: run `python -m worker.docs_gen`"
    assert path.read_text(encoding="utf-8") == rendered[name], f"{path} is {FIX}"


def test_every_route_is_listed_once(rendered: dict[str, str]) -> None:
    app = create_app(Settings.model_construct(api_token="t"), object())
    text = rendered[docs_gen.HTTP_MD]
    rows = re.findall(r"^\| `([A-Z*]+)` \| `([^`]+)` \|", text, flags=re.M)
    assert len(rows) == len(set(rows)), "a route is listed twice"
    listed = set(rows)
    for method, template in served(app):
        if method == "HEAD" and ("GET", template) in listed:
            continue  # HEAD of a GET route: the GET row stands for it
        assert (method, template) in listed or ("*", template) in listed, (method, template)
    assert ("GET", "/v1/tools/search") in listed
    assert ("GET", "/v1/workspaces/{workspace_id}/egress") in listed
    for template in sockets(app):
        assert (docs_gen.WEBSOCKET, template) in listed, template
    for method, template in listed:  # and nothing that is not served
        assert any(t == template for _m, t in served(app)) or template in sockets(app), (method, template)


def test_every_route_with_a_body_names_its_model(rendered: dict[str, str]) -> None:
    text = rendered[docs_gen.HTTP_MD]
    section = text.split("### `POST /v1/workspaces/{workspace_id}/execute`", 1)[1].split("\n### ", 1)[0]
    assert "body: `ExecuteRequest`" in section
    models = text.split("## Models", 1)[1]
    for name in ("ExecuteRequest", "ToolCall", "FunctionCall", "UndoRequest", "WorkspaceSettings", "InputBody"):
        assert f"### `{name}`" in models, name
    assert "| `tool` | string (length ≥ 1, length ≤ 128) | yes |" in models


def test_every_setting_is_listed_once_with_its_meaning(rendered: dict[str, str]) -> None:
    text = rendered[docs_gen.CONFIGURATION_MD]
    for name, info in Settings.model_fields.items():
        env = f"LOOM_{name.upper()}"
        rows = re.findall(rf"^\| `{env}` \|.*\|$", text, flags=re.M)
        assert len(rows) == 1, env
        assert info.description and docs_gen._cell(info.description) in rows[0], env
    assert '| `LOOM_RUNTIME` | `"runc"` \\| `"runsc"` | `runc` |' in text
    assert "| `LOOM_PORT` | integer (≥ 1, ≤ 65535) | `8080` |" in text


def test_a_setting_without_a_meaning_is_refused() -> None:
    class Undocumented(Settings):
        new_knob: int = Field(3)

    with pytest.raises(ValueError, match="new_knob"):
        docs_gen.render_configuration(Undocumented)


def test_check_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert docs_gen.main(["--check", "--out", str(tmp_path)]) == 1
    assert not list(tmp_path.iterdir())
    assert docs_gen.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [docs_gen.CLI_MD, docs_gen.CONFIGURATION_MD, docs_gen.HTTP_MD]
    assert docs_gen.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / docs_gen.HTTP_MD).write_text("old\n")
    assert docs_gen.main(["--check", "--out", str(tmp_path)]) == 1
    assert f"stale: {tmp_path / docs_gen.HTTP_MD}" in capsys.readouterr().out
