"""The local worker's small parts: the key, the run directory, the frames, the inputs'
fingerprint, and the ``loom-worker tools`` cache."""

from __future__ import annotations

import json
import os
import shutil
import stat
import typing
from pathlib import Path

import pytest

from tests.workers import cli, cli_env, run_dir
from worker.localworker import identity, wire
from worker.localworker.inputs import fingerprint
from worker.localworker.rundir import RunDirError, check_private_dir
from worker.localworker.rundir import run_dir as find_run_dir
from worker.settings import Settings

# -- the key ----------------------------------------------------------------------------


def test_the_path_settings_are_the_path_fields_of_settings() -> None:
    paths = set()
    for name, field in Settings.model_fields.items():
        if Path in typing.get_args(field.annotation) or field.annotation is Path:
            paths.add(f"LOOM_{name.upper()}")
    assert paths == identity.PATH_SETTINGS


def test_every_setting_is_in_the_key_but_the_switch() -> None:
    env = {f"LOOM_{name.upper()}": "x" for name in Settings.model_fields}
    kept = identity.settings_env(env)
    assert set(kept) == set(env) - {"LOOM_CLI_DAEMON"}


def key(env: dict[str, str], cwd: str = "/a", backend: str = "docker") -> str:
    return identity.daemon_key(backend, environ=env, cwd=cwd)


def test_the_key_follows_what_decides_a_call() -> None:
    base = {"HOME": "/root", "PATH": "/bin", "LOOM_IMAGE": "img"}
    k = key(base)
    assert key({**base, "LOOM_IMAGE": "other"}) != k
    assert key({**base, "loom_image": "lower case counts too"}) != k
    assert key({**base, "DOCKER_HOST": "unix:///other.sock"}) != k
    assert key({**base, "HTTPS_PROXY": "http://proxy:3128"}) != k
    assert key({**base, "PYTHONPATH": "/elsewhere"}) != k
    assert key({**base, "HOME": "/home/x"}) != k  # the default data directory
    assert key(base, backend="local") != k
    # What does not: the switch, unrelated variables, the directory (no relative path).
    assert key({**base, "LOOM_CLI_DAEMON": "1"}) == k
    assert key({**base, "PATH": "/usr/bin", "TERM": "dumb", "GITHUB_ACTION": "step2"}) == k
    assert key(base, cwd="/b") == k


def test_a_relative_path_setting_puts_the_directory_in_the_key() -> None:
    rel = {"LOOM_DATA_DIR": "data"}
    assert key(rel, cwd="/a") != key(rel, cwd="/b")
    absolute = {"LOOM_DATA_DIR": "/data"}
    assert key(absolute, cwd="/a") == key(absolute, cwd="/b")
    assert key({"LOOM_TOOLS_DIR": "~/tools"}, cwd="/a") != key({"LOOM_TOOLS_DIR": "~/tools"}, cwd="/b")


def test_the_umask_is_in_the_key() -> None:
    old = os.umask(0o022)
    try:
        a = key({})
        os.umask(0o077)
        b = key({})
    finally:
        os.umask(old)
    assert a != b


# -- the run directory --------------------------------------------------------------------------


def test_xdg_runtime_dir_when_it_is_ours(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    d, notes = find_run_dir({"XDG_RUNTIME_DIR": str(xdg)})
    assert d == f"{xdg}/loom-worker" and notes == []
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700


@pytest.mark.parametrize("problem", ["open", "link", "relative", "file"])
def test_an_xdg_runtime_dir_that_is_not_safe_is_passed_over(tmp_path: Path, problem: str) -> None:
    xdg = tmp_path / "xdg"
    if problem == "open":
        xdg.mkdir(mode=0o755)
        os.chmod(xdg, 0o755)
    elif problem == "link":
        (tmp_path / "real").mkdir(mode=0o700)
        xdg.symlink_to(tmp_path / "real")
    elif problem == "file":
        xdg.write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    value = "xdg" if problem == "relative" else str(xdg)
    d, notes = find_run_dir({"XDG_RUNTIME_DIR": value, "TMPDIR": str(tmp)})
    assert d == f"{tmp}/loom-worker-{os.getuid()}"
    assert len(notes) == 1 and notes[0].startswith("XDG_RUNTIME_DIR not used")


def test_a_directory_open_to_others_is_refused_not_repaired(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    d = tmp / f"loom-worker-{os.getuid()}"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    with pytest.raises(RunDirError, match="open to other users"):
        find_run_dir({"TMPDIR": str(tmp)})
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o755


def test_check_private_dir_names_the_owner(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(RunDirError, match="belongs to uid 65534"):
        check_private_dir(str(d), os.getuid())


# -- frames ------------------------------------------------------------------------------------------


def test_frames_round_trip_text_json_cannot_encode() -> None:
    frame = {"id": 1, "t": "result", "result": {"output": 'bad\udcffname ü \n"x"', "n": 1.5}}
    line = wire.encode(frame)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.decode(line) == frame
    plain = {"id": 2, "text": "ü"}
    assert wire.encode(plain) == '{"id":2,"text":"ü"}\n'.encode()


def test_a_frame_must_be_an_object() -> None:
    with pytest.raises(ValueError):
        wire.decode(b"[1]\n")


# -- fingerprints ---------------------------------------------------------------------------------


def test_a_fingerprint_sees_edits_additions_and_removals(tmp_path: Path) -> None:
    d = tmp_path / "tools"
    d.mkdir()
    (d / "a.yaml").write_text("one")
    paths = [str(d), str(tmp_path / "servers.yaml")]
    fp = fingerprint(paths)
    assert fingerprint(paths) == fp
    (d / "a.yaml").write_text("two!")
    fp2 = fingerprint(paths)
    assert fp2 != fp
    (tmp_path / "servers.yaml").write_text("x")
    fp3 = fingerprint(paths)
    assert fp3 != fp2
    (d / "a.yaml").unlink()
    assert fingerprint(paths) != fp3


# -- the `tools` cache ---------------------------------------------------------------------------

TOOL = """
name: {name}
description: Count the lines of a file in the workspace.
parameters:
  type: object
  properties:
    path: {{type: string, description: The file.}}
  required: [path]
command: [wc, -l, --, "{{path}}"]
"""


def test_tools_from_the_cache_are_the_same_bytes_and_follow_changes(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "count.yaml").write_text(TOOL.format(name="count_lines"))
    with run_dir() as run:
        env = cli_env(run, tmp_path / "data", LOOM_TOOLS_DIR=str(tools))
        fresh = cli({**env, "LOOM_CLI_DAEMON": "0"}, "tools", "--format", "mcp")
        assert fresh.returncode == 0 and b'"count_lines"' in fresh.stdout
        cached = [p.name for p in Path(run, "loom-worker").iterdir() if p.name.startswith("tools-")]
        assert len(cached) == 1
        again = cli(env, "tools", "--format", "mcp")
        assert again.stdout == fresh.stdout and again.returncode == 0
        # A changed custom tool file is seen at once.
        (tools / "count.yaml").write_text(TOOL.format(name="count_rows"))
        changed = cli(env, "tools", "--format", "mcp")
        assert b'"count_rows"' in changed.stdout and b'"count_lines"' not in changed.stdout
        # Another format and other settings are other entries.
        assert json.loads(cli(env, "tools").stdout)[0]["type"] == "function"
        assert b'"tool_search"' not in cli({**env, "LOOM_CATALOG": "false"}, "tools").stdout


def test_the_tools_cache_follows_mcp_tools_indexed_by_another_process(tmp_path: Path, workspace: Path) -> None:
    # An MCP server's tools are registered when the catalog first indexes it, in whichever
    # process does; the cached listing depends on the catalog database they are indexed
    # in, so the next `tools` lists them.
    shutil.copy(Path(__file__).parent.parent / "fixtures" / "mcp_stdio_server.py", workspace / "server.py")
    (tmp_path / "mcp.yaml").write_text("servers:\n  fx: {command: [python3, server.py]}\n")
    with run_dir() as run:
        env = cli_env(run, tmp_path / "data", LOOM_MCP_SERVERS_FILE=str(tmp_path / "mcp.yaml"))
        before = cli(env, "tools")
        assert before.returncode == 0 and b'"mcp__fx__shout"' not in before.stdout
        assert cli(env, "tools").stdout == before.stdout  # (from the cache)
        index = cli(env, "tools", "index", "--workspace", str(workspace), "--backend", "local")
        assert index.returncode == 0, index.stderr
        after = cli(env, "tools")
        assert after.returncode == 0 and b'"mcp__fx__shout"' in after.stdout


def test_a_listing_that_warned_is_not_cached(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "broken.yaml").write_text("name: [unclosed\n")
    with run_dir() as run:
        env = cli_env(run, tmp_path / "data", LOOM_TOOLS_DIR=str(tools))
        for _ in range(2):  # the warning each time, as before the cache
            p = cli(env, "tools")
            assert p.returncode == 0 and b"catalog.load_error" in p.stderr
        assert not [p for p in Path(run, "loom-worker").iterdir() if p.name.startswith("tools-")]
