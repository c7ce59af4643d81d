"""``loom-worker cp`` and ``loom-worker exec``'s harness options on the real engine
(issue 26): a file's bytes exactly both ways, recorded inside the workspace and not
outside, the sandbox user's permissions, another user, stdin."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.workers import cli, cli_env, run_dir

pytestmark = pytest.mark.docker


@pytest.fixture
def env(tmp_path: Path, docker_ready: None) -> Iterator[dict[str, str]]:
    with run_dir() as run:
        yield cli_env(run, tmp_path / "data", LOOM_IMAGE=SANDBOX_IMAGE)


def test_cp_and_exec_with_the_harness_options(env: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    os.chown(workspace, 1000, 1000)
    ws = str(workspace)
    blob = bytes(range(256)) * 1000
    (tmp_path / "in.bin").write_bytes(blob)
    try:
        p = cli(env, "cp", "-w", ws, str(tmp_path / "in.bin"), ":/tmp/in.bin")
        assert p.returncode == 0 and b"not recorded" in p.stderr, p.stderr
        p = cli(env, "cp", "-w", ws, ":/tmp/in.bin", "-")
        assert p.returncode == 0 and p.stdout == blob
        p = cli(env, "cp", "-w", ws, "-", ":sub/f.bin", stdin=blob)
        assert p.returncode == 0 and b"recorded in the changelog" in p.stderr
        assert (workspace / "sub" / "f.bin").read_bytes() == blob
        p = cli(env, "log", "--workspace", ws, "--json")
        assert p.returncode == 0 and b"sub/f.bin" in p.stdout
        p = cli(env, "cp", "-w", ws, ":/etc/shadow", str(tmp_path / "x"))
        assert p.returncode == 1 and b"Permission denied: /etc/shadow" in p.stderr
        p = cli(env, "exec", "-w", ws, "-i", "--", "sh", "-c", "cmp - /tmp/in.bin && echo same", stdin=blob)
        assert (p.returncode, p.stdout) == (0, b"same\n"), p.stderr
        p = cli(
            env,
            "exec",
            "-w",
            ws,
            "--user",
            "nobody",
            "--cwd",
            "/tmp",
            "-e",
            "X=1",
            "--",
            "sh",
            "-c",
            "id -u; pwd; echo $X",
        )
        assert (p.returncode, p.stdout) == (0, b"65534\n/tmp\n1\n"), p.stderr
        p = cli(env, "exec", "-w", ws, "--user", "root", "--", "id")
        assert p.returncode == 126 and b"allow_root" in p.stderr
    finally:
        cli(env, "stop", "--workspace", ws)
