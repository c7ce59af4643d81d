"""``loom-worker tools search`` / ``tools index``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.cli import main

WC = (
    "name: word_count\ndescription: Count the words in a file\n"
    "parameters: {type: object, properties: {path: {type: string}}, required: [path]}\n"
    "command: [wc, -w, --, '{path}']\n"
)


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path))
    for var in ("LOOM_LLM_BASE_URL", "LOOM_LLM_MODEL", "LOOM_TOOLS_DIR", "LOOM_MCP_SERVERS_FILE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "wc.yaml").write_text(WC)
    return tmp_path


def test_search_indexes_on_first_use(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "search", "count words in a file", "--max", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"][0]["id"] == "custom:word_count" and out["results_count"] == 2
    assert out["search_mode"] == "FAST" and out["total_tools_indexed"] >= 2


def test_search_capability_filter_and_empty_query(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "search", "count words", "--capability", "shell"]) == 0
    assert all("shell" in r["capabilities"] for r in json.loads(capsys.readouterr().out)["results"])
    assert main(["tools", "search", "   "]) == 2
    assert "INVALID_QUERY" in capsys.readouterr().err


def test_index_reports_bad_files(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (data_dir / "tools" / "bad.yaml").write_text("oops: [")
    (data_dir / "mcp_servers.yaml").write_text("servers:\n  x: {command: [mcp-server-git]}\n")
    assert main(["tools", "index"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["sources"]["custom"]["total"] == 1 and out["sources"]["builtin"]["total"] >= 1
    assert set(out["errors"]) == {"custom:bad.yaml", "mcp:x"}
    assert "sandbox" in out["errors"]["mcp:x"]
