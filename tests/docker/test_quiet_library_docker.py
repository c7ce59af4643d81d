"""The library on the real engine prints nothing of ours: a sandbox started for a
root-owned workspace (an info event and a warning), calls that succeed and fail."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path

    from worker import default_registry

    async def main() -> None:
        ws = Path(sys.argv[1])
        async with default_registry(image=sys.argv[2]) as reg:
            try:
                ok = [
                    (await reg.execute("write_file", {"path": "a.txt", "content": "x"}, ws)).success,
                    (await reg.execute("shell_execute", {"command": "cat a.txt; echo e >&2; exit 3"}, ws)).success,
                    (await reg.execute("read_file", {"path": "missing"}, ws)).success,
                ]
            finally:
                await reg.stop(ws)
        Path(sys.argv[3]).write_text(repr(ok))

    asyncio.run(main())
    """
)


def test_the_library_prints_nothing_on_the_real_engine(docker_ready: None, workspace: Path, tmp_path: Path) -> None:
    assert workspace.stat().st_uid == 0  # the sandbox logs a warning for a root-owned workspace
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update({"PYTHONPATH": str(ROOT), "LOOM_DATA_DIR": str(tmp_path / "data")})
    done = tmp_path / "done"
    p = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(workspace), SANDBOX_IMAGE, str(done)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    assert done.read_text() == "[True, False, False]"
    assert p.stdout == "" and p.stderr == ""
