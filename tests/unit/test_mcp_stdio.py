"""``loom-worker mcp --workspace DIR`` over stdio, driven by the official ``mcp`` client.

The server runs with the test-only local backend (no Docker needed); the same server code
serves the Docker backend in production.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mcp import Client
from mcp.client.stdio import StdioServerParameters

try:  # tests/unit may or may not be a package
    from .mcp_session import play
except ImportError:
    from mcp_session import play  # type: ignore[no-redef]

LOOM = str(Path(sys.executable).with_name("loom-worker"))


def params(workspace: Path, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=LOOM,
        args=["mcp", "--workspace", str(workspace), "--backend", "local"],
        env={"LOOM_ALLOW_UNSAFE_LOCAL": "1", "LOOM_LOG_FORMAT": "json", **env},
    )


async def test_stdio_session_with_the_official_client(workspace: Path) -> None:
    async with Client(params(workspace)) as client:
        await play(client, workspace)


def test_local_backend_refused_without_the_test_switch(workspace: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LOOM_ALLOW_UNSAFE_LOCAL"}
    r = subprocess.run(
        [LOOM, "mcp", "--workspace", str(workspace), "--backend", "local"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2
    assert "LOOM_ALLOW_UNSAFE_LOCAL" in r.stderr
    assert r.stdout == ""


def test_missing_workspace_is_a_usage_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [LOOM, "mcp", "--workspace", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2 and "not a directory" in r.stderr
