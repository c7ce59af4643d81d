"""Long-lived processes with streamed stdio (what a stdio MCP server needs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend
from sandbox.errors import PathNotFoundError

pytestmark = pytest.mark.docker

ECHO = "import sys\nfor line in sys.stdin:\n    print('echo:' + line.strip(), flush=True)\n"


async def test_spawned_process_streams_and_survives_commands(docker_backend: DockerBackend, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    proc = await box.spawn(["python3", "-u", "-c", ECHO, "marker-7731"])
    await proc.write(b"hello\n")
    assert await proc.read_line() == b"echo:hello\n"
    r = await box.exec(ExecRequest("sleep 0.1; echo done"))  # the per-command tree kill spares it
    assert r.stdout == b"done\n"
    await proc.write("ünïcode\n".encode())
    assert await proc.read_line() == "echo:ünïcode\n".encode()
    await proc.close()
    # (the pattern is not its own match: a subshell forked for the pipeline, before it
    # runs grep, has this command line too, and pgrep -f would see it)
    r = await box.exec(ExecRequest("pgrep -f 'marker-773[1]' || echo gone"))
    assert r.stdout.strip().endswith(b"gone"), r.stdout


async def test_spawned_process_exit_is_reported(docker_backend: DockerBackend, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    proc = await box.spawn(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert await proc.read_line() == b"out\n"
    assert await proc.read_line() == b""
    assert proc.returncode == 3 and proc.stderr_tail == b"err\n"


async def test_spawn_of_missing_program_is_refused(docker_backend: DockerBackend, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    with pytest.raises(PathNotFoundError):
        await box.spawn(["/no/such/program"])


async def test_spawned_processes_die_with_the_connection(docker_backend: DockerBackend, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    proc = await box.spawn(["sh", "-c", "sleep 611 & sleep 612"])
    await box.close()  # the worker goes away: the agent kills what it spawned
    r = await box.exec(ExecRequest("sleep 0.5; ps -eo args | grep -c '^sleep 61[12]' || true"))
    assert r.stdout.strip() == b"0"
    assert proc.lost or proc.returncode is not None
