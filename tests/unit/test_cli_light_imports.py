"""What a command imports before it does anything: ``--help`` and every command's parser
import neither the event loop nor pydantic, the Docker SDK, the sandbox package or the MCP
SDK (docs/cli.md, "--help and tools"); a command that opens the registry never imports the
MCP SDK, which only an MCP tool source needs (it was most of a second of every command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["asyncio", "pydantic", "docker", "sandbox", "mcp", "structlog", "httpx", "uvloop"]


def _loaded(code: str) -> dict[str, bool]:
    probe = f"import json, sys\n{code}\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    loaded: dict[str, bool] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_help_and_the_parser_import_nothing_heavy() -> None:
    code = (
        "import contextlib, io\nfrom worker.cli import build_parser, main\nbuild_parser()\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main(['--help'])"
    )
    loaded = _loaded(code)
    assert not any(loaded.values()), [m for m, v in loaded.items() if v]


def test_the_registry_does_not_import_the_mcp_sdk() -> None:
    loaded = _loaded("from worker.registry import default_registry\nfrom worker.localworker import calls")
    assert loaded["pydantic"] and loaded["sandbox"]  # the probe sees what was imported
    assert not loaded["mcp"] and not loaded["httpx"]
