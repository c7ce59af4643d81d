"""The harness API on the real engine, runc and gVisor (issue 26): bytes at size, undo of
binary files, large commands and outputs, permissions as the shell's, users and root.

Each test is a few calls on one sandbox (with the changelog, as ``default_registry`` makes
it), so the tier stays lean.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.errors import PermissionDeniedError, UserUnsupportedError
from tests.docker.conftest import own_registry

pytestmark = pytest.mark.docker

RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "runsc"])


@pytest.fixture
def owned(workspace: Path) -> Path:
    """A workspace of an ordinary user (uid 1000), as on a developer's machine."""
    os.chown(workspace, 1000, 1000)
    os.chmod(workspace, 0o755)
    return workspace


@RUNTIMES
async def test_50_mib_of_binary_both_ways_and_undo_byte_for_byte(
    runtime: str, owned: Path, tmp_path: Path, docker_ready: None
) -> None:
    big = os.urandom(50 << 20)
    async with own_registry(tmp_path, runtime) as reg:
        box = reg.sandbox(owned)
        # Into the workspace (recorded) and out again; into /tmp (not recorded) and out.
        w = await box.write_file("data/big.bin", big)
        assert w.recorded and w.size == len(big) and (owned / "data" / "big.bin").read_bytes() == big
        assert await box.read_file("/workspace/data/big.bin") == big
        w = await box.write_file("/tmp/big.bin", big)
        assert not w.recorded and await box.read_file("/tmp/big.bin") == big
        out = await box.exec(["sh", "-c", "cmp /tmp/big.bin /workspace/data/big.bin && wc -c < /tmp/big.bin"])
        assert out.success and out.text().strip() == str(len(big))
        out = await box.exec(["wc", "-c"], input=big)  # and 50 MiB of stdin
        assert out.success and out.text().split()[0] == str(len(big))

        # A binary file changed by a tool and by a command: undo gives back its bytes.
        original = bytes(range(256)) * 64
        first = await box.write_file("img.bin", original)
        r = await reg.execute("write_file", {"path": "img.bin", "content": b"\x00\xff" * 10}, str(owned))
        assert r.success
        out = await box.exec("printf '\\377\\376\\000' >> img.bin")
        assert out.files_changed == ["img.bin"]
        from worker.changelog import Changelog

        async with Changelog.open(tmp_path / "data", owned) as log:
            ws = await reg.workspace(owned)
            entries = [e for e in await log.log() if e.path == "img.bin"]
            assert entries[0].call_id == first.call_id and len(entries) == 3
            undone = await log.undo(ws.sandbox, to=entries[0].id)
            assert [s.status for s in undone.steps] == ["reverted", "reverted"], undone
        assert (owned / "img.bin").read_bytes() == original


@RUNTIMES
async def test_a_1_mib_command_and_5_mib_of_output_through_shell_execute(
    runtime: str, owned: Path, tmp_path: Path, docker_ready: None
) -> None:
    async with own_registry(tmp_path, runtime) as reg:
        data = "z" * (1 << 20)
        r = await reg.execute("shell_execute", {"command": f"printf %s '{data}' | wc -c"}, str(owned))
        assert r.success, r.error
        assert r.output.strip() == str(1 << 20)
        cmd = "head -c 5242880 /dev/zero | tr '\\0' 'q'"
        r = await reg.execute("shell_execute", {"command": cmd, "max_output": 16 << 20}, str(owned))
        assert r.success and r.data is not None
        assert r.data["stdout"] == "q" * (5 << 20) and r.data["stdout_bytes"] == 5 << 20
        r = await reg.execute("shell_execute", {"command": cmd}, str(owned))  # the default cap: 256 KiB kept
        assert r.data is not None and r.data["stdout_bytes"] == 5 << 20 and len(r.data["stdout"]) < 300 << 10


@RUNTIMES
async def test_a_0444_file_is_refused_as_the_shell_refuses_it(
    runtime: str, owned: Path, tmp_path: Path, docker_ready: None
) -> None:
    async with own_registry(tmp_path, runtime) as reg:
        box = reg.sandbox(owned)
        out = await box.exec(
            "echo x > ro.txt && chmod 444 ro.txt && mkdir -p /tmp/d && echo x > /tmp/d/ro.txt"
            " && chmod 444 /tmp/d/ro.txt"
        )
        assert out.success, out.stderr
        shell = await box.exec("echo y > ro.txt")
        assert shell.returncode != 0 and b"Permission denied" in shell.stderr  # what the shell says
        # The model's tool: a failed call with that message, nothing written.
        r = await reg.execute("write_file", {"path": "ro.txt", "content": "y"}, str(owned))
        assert not r.success and "Permission denied: ro.txt" in (r.error or "")
        assert r.data is not None and r.data["error_code"] == "permission"
        r = await reg.execute("edit_file", {"path": "ro.txt", "old_str": "x", "new_str": "y"}, str(owned))
        assert not r.success and "Permission denied" in (r.error or "")
        # The harness: a PermissionError, in the workspace and in /tmp.
        for path in ("ro.txt", "/tmp/d/ro.txt"):
            with pytest.raises(PermissionError) as err:
                await box.write_file(path, b"y")
            assert isinstance(err.value, PermissionDeniedError) and path in str(err.value)
            assert (await box.read_file(path)) == b"x\n"
        with pytest.raises(PermissionError, match=r"Read-only|Permission denied"):
            await box.write_file("/etc/motd-by-harness", b"no")  # the root file system is read-only
        assert (owned / "ro.txt").read_text() == "x\n"


@RUNTIMES
async def test_users_and_root_with_the_defaults_and_with_allow_root(
    runtime: str, owned: Path, tmp_path: Path, docker_ready: None
) -> None:
    async with own_registry(tmp_path, runtime) as reg:
        box = reg.sandbox(owned)
        owner = await box.exec("id -u; grep CapEff /proc/self/status; touch /etc/x 2>&1 || true")
        assert owner.text().splitlines()[:2] == ["1000", "CapEff:\t0000000000000000"]
        assert "Read-only file system" in owner.text() or "Permission denied" in owner.text()
        nobody = await box.exec("id -u; grep CapEff /proc/self/status", user="nobody")
        assert nobody.success and nobody.text().splitlines() == ["65534", "CapEff:\t0000000000000000"]
        missing = await box.exec("whoami", user="no-such-user")
        assert (missing.returncode, missing.launch_error) == (126, "user")
        assert b"unable to find user no-such-user" in missing.stderr
        with pytest.raises(UserUnsupportedError):
            await box.exec("id", user="root")
        with pytest.raises(UserUnsupportedError):
            await box.exec("id", user="0")

        # Opted in: root holds the five capabilities, the owner's commands still none.
        await reg.configure_workspace(owned, {"allow_root": True})
        root = await box.exec("id -u; grep CapEff /proc/self/status; touch /etc/by-root && echo wrote", user="root")
        assert root.success, root.stderr
        assert root.text().splitlines() == ["0", "CapEff:\t00000000000000cb", "wrote"]
        owner = await box.exec("id -u; grep -E 'Cap(Eff|Prm)' /proc/self/status")
        assert owner.text().splitlines() == ["1000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000"]
        added = await box.exec("adduser --disabled-password --comment t harness-user", user="root", timeout=30)
        assert added.success, added.stderr
        who = await box.exec("whoami; grep CapEff /proc/self/status", user="harness-user")
        assert who.text().splitlines() == ["harness-user", "CapEff:\t0000000000000000"]
