"""The harness API's parts that need no engine (issue 26): the container a workspace gets
with and without ``allow_root``, who a user is, large payloads sent in pieces (on the
local backend, the pieces made small), the inspect provider's config and answers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sandbox import protocol
from sandbox.users import NOT_FOUND, resolve, valid

PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\nbad line\n"


def test_the_defaults_stay_hardened_and_allow_root_changes_only_what_it_says(tmp_path: Path) -> None:
    from sandbox.docker import DockerBackend
    from sandbox.spec import ROOT_CAPABILITIES, SandboxSpec

    os.chown(tmp_path, 1000, 1000)
    default = DockerBackend(SandboxSpec()).container_config(tmp_path)
    assert default["user"] == "1000:1000" and default["read_only"] is True
    assert default["cap_drop"] == ["ALL"] and "cap_add" not in default
    assert "no-new-privileges" in default["security_opt"] and default["network_mode"] == "none"
    rooted = DockerBackend(SandboxSpec(allow_root=True)).container_config(tmp_path)
    assert rooted["user"] == "0:0" and rooted["read_only"] is False
    assert rooted["cap_add"] == list(ROOT_CAPABILITIES) == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"]
    same = {k: v for k, v in default.items() if k not in ("user", "read_only", "labels")}
    assert same == {k: v for k, v in rooted.items() if k not in ("user", "read_only", "labels", "cap_add")}
    assert SandboxSpec(allow_root=True).fingerprint() != SandboxSpec().fingerprint()  # a new container


async def test_allow_root_is_refused_for_a_root_owned_workspace(tmp_path: Path) -> None:
    from sandbox.docker import DockerBackend
    from sandbox.errors import SandboxUnavailableError
    from sandbox.spec import SandboxSpec

    class Engine:
        class containers:
            @staticmethod
            def get(name: str) -> Any:
                import docker.errors

                raise docker.errors.NotFound("no")

    backend = DockerBackend(SandboxSpec(allow_root=True), client_factory=Engine)

    async def nothing(_spec: Any = None) -> None:
        return None

    backend.prepare = nothing  # type: ignore[method-assign,assignment]
    os.chown(tmp_path, 0, 0)
    with pytest.raises(SandboxUnavailableError, match="owned by another user than root"):
        await backend.ensure_container(tmp_path)


def test_users_by_name_or_number() -> None:
    assert resolve("nobody", PASSWD) == (65534, 65534)
    assert resolve("root", PASSWD) == (0, 0) and resolve("0", PASSWD) == (0, 0)
    assert resolve("1234", PASSWD) == (1234, 1234) and resolve("1234:7", PASSWD) == (1234, 7)
    assert resolve("65534", PASSWD) == (65534, 65534)  # its passwd group
    assert resolve("ghost", PASSWD) is None and resolve("bad", PASSWD) is None
    assert not valid("a b") and not valid("x;rm") and not valid("") and valid("www-data") and valid("12:34")
    assert NOT_FOUND.format(user="x") == "unable to find user x: no matching entries in passwd file"


async def test_large_payloads_go_in_pieces(
    monkeypatch: pytest.MonkeyPatch, local_backend: Any, workspace: Path, tmp_path: Path
) -> None:
    """Writes larger than a request's raw bytes are staged in pieces (and put in place
    whole), reads larger than one answer are read in pieces of one unchanged file: with
    the pieces made 1000 bytes here, a few KiB take several of each."""
    monkeypatch.setattr(protocol, "MAX_RAW_REQUEST", 1000)
    monkeypatch.setattr(protocol, "MAX_READ_BYTES", 1000)
    box = await local_backend.get(workspace)
    data = os.urandom(7500)
    w = await box.write("pieces.bin", data)
    assert (w.size, w.created) == (7500, True) and (workspace / "pieces.bin").read_bytes() == data
    staged = await box.stage_write("staged.bin", data)
    assert not (workspace / "staged.bin").exists()  # not in place before the commit
    await box.commit_write(staged)
    assert (workspace / "staged.bin").read_bytes() == data
    outside = tmp_path / "out" / "x.bin"
    pw = await box.write_path(str(outside), data)
    assert (pw.size, pw.created) == (7500, True) and outside.read_bytes() == data
    got = await box.read_path(str(outside), max_bytes=1 << 20)
    assert (got.data, got.size, got.truncated) == (data, 7500, False)
    part = await box.read_path(str(outside), max_bytes=2500)
    assert (part.data, part.truncated) == (data[:2500], True)
    r = await box.read("pieces.bin", max_bytes=800)  # a workspace read: raw, capped
    assert r.data == data[:800] and r.truncated


# -- the inspect provider ---------------------------------------------------------------


def test_the_provider_config_from_yaml_and_its_errors(tmp_path: Path) -> None:
    from worker.integrations.inspect.config import load

    path = tmp_path / "loom.yaml"
    path.write_text(
        "image: img:1\nruntime: runsc\nenv: {A: '1'}\nallow_root: true\n"
        "services:\n  db: {image: img:2, allow_root: false}\n  default: {}\n"
    )
    cfg = load(str(path))
    items = cfg.service_items()
    assert [name for name, _ in items] == ["default", "db"]  # the default first
    default, db = items[0][1], items[1][1]
    assert default.settings() == {"image": "img:1", "runtime": "runsc", "env": {"A": "1"}, "allow_root": True}
    assert db.settings() == {"image": "img:2", "runtime": "runsc", "env": {"A": "1"}, "allow_root": False}
    assert load(None).service_items()[0][0] == "default" and load({"cpus": 2}).cpus == 2
    bad_settings = (({"image": "."}, "image"), ({"cpus": 0.01}, "cpus"), ({"memory": "lots"}, "memory"))
    bad_settings += (({"services": {"db": {"env": {"LD_PRELOAD": "x"}}}}, "env"),)  # a service's, checked as well
    for bad, word in (
        ({"runtime": "kata"}, "runtime"),
        ({"nope": 1}, "nope"),
        ({"services": {}}, "services"),
        *bad_settings,
    ):
        with pytest.raises(ValueError, match=word):
            load(bad)
    with pytest.raises(ValueError, match="No such file"):
        load(str(tmp_path / "missing.yaml"))
    (tmp_path / "bad.yaml").write_text("image: [unclosed")
    with pytest.raises(ValueError, match="not YAML"):
        load(str(tmp_path / "bad.yaml"))


def test_the_provider_answers_as_inspect_expects() -> None:
    from inspect_ai.util import OutputLimitExceededError

    from worker.harness import ExecOutput
    from worker.integrations.inspect.provider import _result

    ok = _result(ExecOutput(3, b"out\xff", b"err", "exit", 1.0), 10)
    assert (ok.success, ok.returncode, ok.stdout, ok.stderr) == (False, 3, "out\ufffd", "err")
    with pytest.raises(TimeoutError, match="after 2 seconds"):
        _result(ExecOutput(None, b"partial", b"", "timeout", 2000.0), 2)
    with pytest.raises(PermissionError):
        _result(ExecOutput(126, b"", b"/etc/passwd: Permission denied\n", "exit", 0.0, launch_error="permission"), 5)
    with pytest.raises(OutputLimitExceededError, match="limit of 10 MiB was exceeded"):
        _result(ExecOutput(0, b"x", b"", "exit", 1.0, truncated=True, stdout_bytes=20 << 20), 5)
    assert _result(ExecOutput(None, b"", b"", "signal", 1.0, signal=9), 5).returncode == 137
    assert _result(ExecOutput(127, b"", b"x: not found", "exit", 0.0, launch_error="not_found"), 5).returncode == 127
    refused = _result(ExecOutput(126, b"", b"Safety violation: no\n", "refused", 0.0), 5)
    assert (refused.success, refused.returncode) == (False, 126) and "Safety violation" in refused.stderr


def test_the_entry_point_registers_loom() -> None:
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="inspect_ai") if ep.value.startswith("worker.")]
    assert [ep.value for ep in eps] == ["worker.integrations.inspect._registry"]
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    from worker.integrations.inspect import LoomSandboxEnvironment

    assert registry_find_sandboxenv("loom") is LoomSandboxEnvironment
