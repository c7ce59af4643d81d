"""The harness API and the tools' bytes on every backend and image (issue 26): the same
calls on the local backend, the default image, and minimal, busybox and musl images under
runc and gVisor. One test per concern, each a few calls, so a new image costs seconds."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

from sandbox.errors import IsADirError, PathNotFoundError
from worker import ToolRegistry

EVERY_BYTE = bytes(range(256)) * 3


async def test_bytes_exactly_through_the_tools_and_the_harness(registry: ToolRegistry, workspace: Path) -> None:
    ws = str(workspace)
    r = await registry.execute(
        "write_file", {"path": "b/all.bin", "content": base64.b64encode(EVERY_BYTE).decode(), "encoding": "base64"}, ws
    )
    assert r.success, r.error
    assert (workspace / "b" / "all.bin").read_bytes() == EVERY_BYTE
    r = await registry.execute("read_file", {"path": "b/all.bin", "encoding": "base64"}, ws)
    assert r.success and r.data is not None
    assert base64.b64decode(r.data["content"]) == EVERY_BYTE and r.data["encoding"] == "base64"
    r = await registry.execute("write_file", {"path": "b/raw.bin", "content": EVERY_BYTE}, ws)  # bytes from Python
    assert r.success and (workspace / "b" / "raw.bin").read_bytes() == EVERY_BYTE
    r = await registry.execute("write_file", {"path": "b/x", "content": "%%%", "encoding": "base64"}, ws)
    assert not r.success and "'content': not valid base64" in (r.error or "")

    box = registry.sandbox(workspace)
    assert await box.read_file("b/all.bin") == EVERY_BYTE
    out = await box.exec("cat", input=EVERY_BYTE)
    assert out.success and out.stdout == EVERY_BYTE
    out = await box.exec(["sh", "-c", "cat > b/stdin.bin"], input=EVERY_BYTE)
    assert out.success
    assert (workspace / "b" / "stdin.bin").read_bytes() == EVERY_BYTE


async def test_files_outside_the_workspace_are_the_sandboxs_scratch_space(
    registry: ToolRegistry, workspace: Path
) -> None:
    box = registry.sandbox(workspace)
    scratch = f"/tmp/loom-contract-{secrets.token_hex(4)}/deep/f.bin"
    w = await box.write_file(scratch, EVERY_BYTE)
    assert (w.path, w.size, w.created, w.recorded) == (scratch, len(EVERY_BYTE), True, False)
    assert await box.read_file(scratch) == EVERY_BYTE
    w = await box.write_file("in/ws.txt", "text")
    assert w.recorded and w.created and (workspace / "in" / "ws.txt").read_text() == "text"
    try:
        await box.read_file("/tmp")
        raise AssertionError("a directory was read")
    except IsADirError as e:
        assert "directory" in str(e)
    try:
        await box.read_file("no/such/file")
        raise AssertionError("a missing file was read")
    except PathNotFoundError as e:
        assert "no/such/file" in str(e)
    await box.exec(["rm", "-rf", scratch.rsplit("/", 2)[0]])


async def test_commands_of_any_length_with_their_own_env_and_cwd(registry: ToolRegistry, workspace: Path) -> None:
    box = registry.sandbox(workspace)
    big = "x" * (300 << 10)  # more than one argument of sh -c may hold (128 KiB)
    out = await box.exec(f"printf %s '{big}' | wc -c")
    assert out.success and out.text().strip() == str(len(big)), out.stderr
    out = await box.exec(["printf", "%s", *(["y" * (64 << 10)] * 8)])  # an argv of 512 KiB
    assert out.success and len(out.stdout) == 8 * (64 << 10)
    out = await box.exec("echo $ONE-$TWO; pwd", env={"ONE": "1", "TWO": "two words"}, cwd="/")
    assert out.success and out.text() == "1-two words\n/\n"
    out = await box.exec(["no-such-program-here"])
    assert (out.returncode, out.launch_error) == (127, "not_found")
    out = await box.exec("true", cwd="/no/such/dir")
    assert (out.returncode, out.launch_error) == (126, "cwd")
    r = await registry.execute("shell_execute", {"command": f"echo '{big}' | wc -c"}, str(workspace))
    assert r.success and r.output.strip() == str(len(big) + 1)


async def test_shell_execute_takes_env_and_stdin(registry: ToolRegistry, workspace: Path) -> None:
    ws = str(workspace)
    args = {"command": 'cat; echo "[$GREETING]"', "env": {"GREETING": "hi there"}, "stdin": "line\n"}
    r = await registry.execute("shell_execute", args, ws)
    assert r.success and r.output == "line\n[hi there]\n", r.output
    raw = base64.b64encode(EVERY_BYTE).decode()
    r = await registry.execute("shell_execute", {"command": "wc -c", "stdin": raw, "stdin_encoding": "base64"}, ws)
    assert r.success and r.output.strip() == str(len(EVERY_BYTE))
    r = await registry.execute("shell_execute", {"command": "true", "stdin": "x", "background": True}, ws)
    assert not r.success and "process_input" in (r.error or "")
    r = await registry.execute("shell_execute", {"command": "true", "env": {"A=B": "x"}}, ws)
    assert (not r.success and "'env'" in (r.error or "")) or "env" in (r.error or "")
