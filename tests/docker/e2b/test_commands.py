"""envd's process service through the official E2B SDK (``sandbox.commands``,
``sandbox.pty``) on the real engine: foreground and background commands, their output as
it comes, exit codes, env and cwd, stdin, reattaching, listing, killing, timeouts, PTYs,
users, and the changelog of what a command changed (undone by loom's undo).

The core cases run under runc and gVisor (``e2b_server_runtime``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import e2b
import httpx
import pytest
from e2b import CommandExitException, PtySize

from tests.docker.e2b.conftest import E2BServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


@pytest.fixture
def sbx(e2b_server_runtime: E2BServer) -> Iterator[e2b.Sandbox]:
    box = e2b.Sandbox.create()
    try:
        yield box
    finally:
        box.kill()


def _loom(server: E2BServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60)


def _until(check: object, what: str, limit: float = 30.0) -> None:
    """Wait for ``check()`` (a callable) to be true (the test's own patience, not a
    measurement)."""
    end = time.monotonic() + limit
    while not check():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_foreground_output_exit_codes_env_and_cwd(sbx: e2b.Sandbox, e2b_server_runtime: E2BServer) -> None:
    out: list[str] = []
    err: list[str] = []
    r = sbx.commands.run(
        'echo "hello $WHO"; echo oops >&2; pwd',
        envs={"WHO": "e2b"},
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert r.exit_code == 0 and r.error is None
    lines = r.stdout.splitlines()
    assert lines[0] == "hello e2b"
    # E2B's home is the workspace, mounted at /home/user too: a command starts there
    assert lines[1] == "/home/user"
    assert r.stderr == "oops\n"
    assert "".join(out) == r.stdout and "".join(err) == r.stderr  # the callbacks saw it all

    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo partial; echo broken >&2; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "partial\n" and failed.value.stderr == "broken\n"
    assert failed.value.error == "exit status 3"

    # cwd: relative to the home, inside the workspace, or anywhere in the sandbox
    sbx.commands.run("mkdir -p sub/dir")
    assert sbx.commands.run("pwd", cwd="sub/dir").stdout.strip().endswith("/sub/dir")
    assert sbx.commands.run("pwd", cwd="/home/user/sub").stdout.strip().endswith("/sub")
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    with pytest.raises(e2b.InvalidArgumentException, match="does not exist"):
        sbx.commands.run("pwd", cwd="/home/user/nope")
    with pytest.raises(e2b.InvalidArgumentException, match="does not exist"):
        sbx.commands.run("pwd", cwd="/nope")
    # stdin is /dev/null unless asked for: a command reading it ends at once
    assert sbx.commands.run("cat; echo done").stdout == "done\n"
    # bytes that are not UTF-8, and more than one event's worth of output
    big = sbx.commands.run("head -c 300000 /dev/zero | tr '\\0' x; printf '\\xe2'")
    assert big.stdout == "x" * 300000 + "\ufffd"


def test_output_streams_as_it_comes(sbx: e2b.Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    # The second line is printed only once the test has received the first one: it
    # must reach the client while the command still runs.
    handle = sbx.commands.run("echo first; while [ ! -e go ]; do sleep 0.05; done; echo second", background=True)

    def consume() -> None:
        handle.wait(on_stdout=lambda s: seen.append((time.monotonic() - started, s)))

    t = threading.Thread(target=consume)
    t.start()
    _until(lambda: seen, "the first line")
    assert seen[0][1] == "first\n"
    sbx.commands.run("touch go")
    t.join(60)
    assert [s for _, s in seen] == ["first\n", "second\n"]


def test_background_list_connect_kill(sbx: e2b.Sandbox) -> None:
    handle = sbx.commands.run(
        "for i in $(seq 1 600); do echo tick $i; sleep 0.1; done", background=True, envs={"A": "1"}, cwd="/tmp"
    )
    assert handle.pid > 0
    listed = {p.pid: p for p in sbx.commands.list()}
    assert handle.pid in listed
    info = listed[handle.pid]
    assert info.cmd == "/bin/bash" and info.args[:2] == ["-l", "-c"] and "tick" in info.args[2]
    assert info.envs == {"A": "1"} and info.cwd == "/tmp" and info.tag is None

    # Reattach: output from then on
    handle.disconnect()
    again = sbx.commands.connect(handle.pid)
    assert again.pid == handle.pid
    got: list[str] = []
    for stdout, _, _ in again:
        if stdout:
            got.append(stdout)
        if len(got) >= 2:
            break
    assert all("tick" in g for g in got)
    again.disconnect()

    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as killed:
        sbx.commands.connect(handle.pid).wait()  # (a late Connect gets its end)
    assert killed.value.exit_code == -1 and killed.value.error == "signal: killed"
    assert handle.pid not in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.kill(handle.pid) is False  # no longer running
    with pytest.raises(e2b.NotFoundException):
        sbx.commands.connect(999_999)
    with pytest.raises(e2b.NotFoundException):
        sbx.commands.send_stdin(999_999, "x")


def test_stdin_send_and_close(sbx: e2b.Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "Hello, ")
    handle.send_stdin(b"World!")
    for stdout, _, _ in handle:
        if stdout and "World" in stdout:
            break
    handle.close_stdin()  # cat ends at EOF
    result = handle.wait()
    assert result.exit_code == 0
    # A command started without stdin refuses input, as envd does
    quiet = sbx.commands.run("sleep 30", background=True)
    with pytest.raises(e2b.SandboxException, match="stdin"):
        sbx.commands.send_stdin(quiet.pid, "x")
    # Input as a stream (Connect's client streaming over HTTP/1.1)
    streamed = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(streamed.pid, ["one ", b"two ", "three"])
    streamed.close_stdin()
    assert streamed.wait().stdout == "one two three"
    quiet.kill()


def test_timeouts_and_sigterm(sbx: e2b.Sandbox) -> None:
    with pytest.raises(e2b.TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    # the command was killed with it, as envd kills it
    _until(lambda: not [p for p in sbx.commands.list() if "sleep 30" in " ".join(p.args)], "the kill")
    # a background command's timeout holds without a reader
    bg = sbx.commands.run("sleep 30; echo late > late.txt", background=True, timeout=1)
    bg.disconnect()
    _until(lambda: bg.pid not in {p.pid for p in sbx.commands.list()}, "the background command's end")
    assert sbx.commands.run("ls late.txt 2>&1 || true").stdout.strip().endswith("No such file or directory")
    # SIGTERM goes to the process group, which may handle it (kill() is SIGKILL)
    trap = sbx.commands.run("trap 'echo caught; exit 7' TERM; echo ready; sleep 30 & wait", background=True)
    for stdout, _, _ in trap:
        if stdout and "ready" in stdout:
            break
    from e2b.envd.process import process_pb
    from protobuf import Oneof

    sbx.commands._rpc.send_signal(
        process_pb.SendSignalRequest(
            process=process_pb.ProcessSelector(selector=Oneof("pid", trap.pid)), signal=process_pb.Signal.SIGTERM
        )
    )
    with pytest.raises(CommandExitException) as term:
        trap.wait()
    assert term.value.exit_code == 7 and "caught" in term.value.stdout


def test_pty_input_resize_kill(sbx: e2b.Sandbox) -> None:
    chunks: list[bytes] = []
    handle = sbx.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})
    done = threading.Event()

    def read() -> None:
        try:
            handle.wait(on_pty=chunks.append)
        except CommandExitException:
            pass
        finally:
            done.set()

    t = threading.Thread(target=read)
    t.start()
    shown = lambda: b"".join(chunks)  # noqa: E731
    sbx.pty.send_stdin(handle.pid, b"echo pty-$((40+2))\n")
    _until(lambda: b"pty-42" in shown(), "the PTY's echo")
    sbx.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(handle.pid, b"stty size\n")
    _until(lambda: b"30 100" in shown(), "the new size")
    assert handle.pid in {p.pid for p in sbx.commands.list()}
    assert sbx.pty.kill(handle.pid) is True
    assert done.wait(60)
    t.join(5)
    assert handle.pid not in {p.pid for p in sbx.commands.list()}


def test_changes_are_recorded_and_undone(sbx: e2b.Sandbox, e2b_server_runtime: E2BServer) -> None:
    server = e2b_server_runtime
    host = server.workspace(sbx.sandbox_id)
    sbx.commands.run("echo data > made.txt && mkdir -p d && echo x > d/f.txt")
    assert (host / "made.txt").read_text() == "data\n"
    bg = sbx.commands.run("echo later > bg.txt", background=True)
    bg.wait()
    with _loom(server) as loom:
        log = loom.get(f"/v1/workspaces/{sbx.sandbox_id}/changelog").json()
        paths = {e["path"] for e in log}
        assert {"made.txt", "d/f.txt", "bg.txt"} <= paths
        # one command's changes are one call: undo them by its id
        calls = {e["call_id"] for e in log if e["path"] == "bg.txt"}
        assert len(calls) == 1
        r = loom.post(f"/v1/workspaces/{sbx.sandbox_id}/undo", json={"call_id": calls.pop()})
        assert r.status_code == 200, r.text
        assert not (host / "bg.txt").exists() and (host / "made.txt").exists()
        r = loom.post(f"/v1/workspaces/{sbx.sandbox_id}/undo", json={"all": True})
        assert r.status_code == 200, r.text
    assert not (host / "made.txt").exists() and not (host / "d").exists()


def test_users_and_the_process_limit(e2b_server: E2BServer) -> None:
    sbx = e2b.Sandbox.create()
    # loom's limit of processes running at once (8 by default) is a limit, said as one
    running = [sbx.commands.run("sleep 60", background=True) for _ in range(8)]
    with pytest.raises(e2b.RateLimitException, match="at most 8"):
        sbx.commands.run("true")
    for handle in running:
        handle.kill()
    assert sbx.commands.run("id -u", user="user").stdout.strip() == "1000"
    with pytest.raises(e2b.SandboxException, match="root") as refused:
        sbx.commands.run("id -u", user="root")
    assert "PERMISSION_DENIED" in str(refused.value) and "allow_root" in str(refused.value)
    # (the SDK names only "user" and "root": another name by hand)
    with pytest.raises(e2b.AuthenticationException, match="invalid username"):
        _start_as(sbx, "nobody-here")
    sbx.kill()


def _start_as(sbx: e2b.Sandbox, user: str) -> None:
    import base64

    from e2b.envd.process import process_pb
    from e2b.envd.rpc import handle_rpc_exception

    events = sbx.commands._rpc.start(
        process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="/bin/true")),
        headers={"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()},
    )
    try:
        next(iter(events))
    except Exception as e:
        raise handle_rpc_exception(e) from e


def test_root_where_the_workspace_allows_it(e2b_server: E2BServer) -> None:
    sbx = e2b.Sandbox.create()
    with _loom(e2b_server) as loom:
        r = loom.patch(f"/v1/workspaces/{sbx.sandbox_id}", json={"allow_root": True})
        assert r.status_code == 200, r.text
    out: list[str] = []
    r = sbx.commands.run("id -u; pwd", user="root", on_stdout=out.append)
    assert r.stdout.splitlines()[:2] == ["0", "/root"] and "".join(out) == r.stdout
    # what it wrote in the workspace is recorded as any command's change
    r2 = sbx.commands.run("echo hi > mine.txt", user="root", cwd="/home/user")
    assert r2.exit_code == 0 and (e2b_server.workspace(sbx.sandbox_id) / "mine.txt").read_text() == "hi\n"
    with _loom(e2b_server) as loom:
        log = loom.get(f"/v1/workspaces/{sbx.sandbox_id}/changelog").json()
    assert "mine.txt" in {e["path"] for e in log}
    # loom runs another user's commands without stdin or a PTY, and says so
    with pytest.raises(e2b.SandboxException, match="without stdin"):
        sbx.commands.run("cat", user="root", stdin=True, background=True)
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("exit 5", user="root")
    assert failed.value.exit_code == 5
    sbx.kill()


async def test_the_async_sdk(e2b_server: E2BServer) -> None:
    sbx = await e2b.AsyncSandbox.create()
    try:
        r = await sbx.commands.run("echo async; echo err >&2")
        assert (r.stdout, r.stderr, r.exit_code) == ("async\n", "err\n", 0)
        lines: list[str] = []
        handle = await sbx.commands.run(
            "echo one; sleep 0.3; echo two", background=True, on_stdout=lambda s: lines.append(s)
        )
        assert (await handle.wait()).exit_code == 0 and "".join(lines) == "one\ntwo\n"
        typed = await sbx.commands.run("cat", background=True, stdin=True)
        await sbx.commands.send_stdin(typed.pid, "to cat")
        await sbx.commands.close_stdin(typed.pid)
        assert (await typed.wait()).stdout == "to cat"
        shown: list[bytes] = []
        pty = await sbx.pty.create(PtySize(rows=20, cols=60), on_data=lambda b: shown.append(b))
        await sbx.pty.send_stdin(pty.pid, b"echo async-pty-$((6*7))\n")
        end = time.monotonic() + 30
        while b"async-pty-42" not in b"".join(shown):
            assert time.monotonic() < end, "no PTY output"
            await asyncio.sleep(0.05)
        assert await sbx.pty.kill(pty.pid)
        assert [p.pid for p in await sbx.commands.list()] == []
    finally:
        await sbx.kill()
