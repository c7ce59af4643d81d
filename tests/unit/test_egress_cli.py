"""``loom-worker workspace set --egress`` and ``loom-worker egress-log`` (no Docker: the
allowlist is a host-side setting, and the log is read from the host)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.cli import main
from worker.egress.log import EgressLog, EgressRecord


@pytest.fixture(autouse=True)
def data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("LOOM_LOG_LEVEL", "warning")
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_allowlist_is_set_shown_and_bad_entries_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    code, _out, err = run(capsys, "workspace", "set", "-w", str(ws), "--egress", "pypi,*.com")
    assert code == 2 and "egress" in err and "'*.com'" in err and "public suffix" in err
    code, out, err = run(capsys, "workspace", "set", "-w", str(ws), "--egress", "pypi, npm ,!upload.pypi.org")
    assert code == 0, err
    assert "pypi, npm, !upload.pypi.org  (workspace)" in out
    code, out, _err = run(capsys, "workspace", "show", "-w", str(ws), "--json")
    assert json.loads(out)["effective"]["egress"] == ["pypi", "npm", "!upload.pypi.org"]
    code, out, _err = run(capsys, "workspace", "set", "-w", str(ws), "--egress", "none")
    assert code == 0 and "none (no network)" in out


def test_egress_log_prints_what_the_gateway_did(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_dir: Path
) -> None:
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    assert run(capsys, "workspace", "set", "-w", str(ws), "--egress", "pypi")[0] == 0
    log = EgressLog(data_dir)
    log.append(
        ws,
        EgressRecord(
            str(ws), "connect", "pypi.org", 443, "allowed", "allowed", "pypi:pypi.org", "203.0.113.80", 900, 20480
        ),
    )
    log.append(ws, EgressRecord(str(ws), "connect", "evil.example", 443, "denied", "not on the allowlist"))
    log.close()
    code, out, err = run(capsys, "egress-log", "-w", str(ws))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "allowlist: pypi"
    assert "allowed" in lines[1] and "pypi.org:443 -> 203.0.113.80" in lines[1] and "down 20.0 KiB" in lines[1]
    assert "denied" in lines[2] and "evil.example:443" in lines[2] and "not on the allowlist" in lines[2]
    code, out, _err = run(capsys, "egress-log", "-w", str(ws), "--verdict", "denied", "--json")
    entries = json.loads(out)["entries"]
    assert [e["host"] for e in entries] == ["evil.example"]
    code, _out, err = run(capsys, "egress-log", "-w", str(tmp_path / "nope"))
    assert code == 2 and "not found" in err
