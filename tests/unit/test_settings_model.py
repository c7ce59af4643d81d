"""One settings model (:mod:`worker.sandbox_settings`): the process-wide settings contain
the sandbox's, the per-workspace ones derive from them, a spec is built from them; and a
bad value of any setting, generated from the models' fields, is one line naming the
variable (CLI, exit 2) or a 422 naming the field (HTTP), never a traceback."""

from __future__ import annotations

import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from sandbox.spec import SandboxSpec
from tests.unit.test_http import running
from worker.cli.common import load_settings
from worker.registry import ToolRegistry
from worker.sandbox_settings import PER_WORKSPACE, SandboxSettings
from worker.settings import Settings
from worker.workspace_settings import Caps, Configs, SettingsError, SettingsStore, WorkspaceSettings, parse, spec_for

#: Strings tried, in turn, as a bad value of a string setting: the first its model refuses.
STRINGS = ("!! not valid !!", "relative/path", "1x", "")


def _base(annotation: Any) -> Any:
    """The type under ``X | None`` and ``Annotated[X, ...]``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def _candidates(info: FieldInfo) -> tuple[Any, ...]:
    base = _base(info.annotation)
    origin = get_origin(base)
    if origin is Literal:
        return ("no-such-choice",)
    if base is bool:
        return ("maybe",)
    if base in (int, float):
        return ("not-a-number",)
    if origin in (list, dict) or base in (list, dict):
        return ("{not json",)
    return STRINGS


def _validated(model: type[Any], name: str) -> bool:
    """Whether the field has a validator or a bound (its values are not just any text)."""
    info = model.model_fields[name]
    own = any(name in d.info.fields for d in model.__pydantic_decorators__.field_validators.values())
    return (
        own
        or bool(info.metadata)
        or get_origin(info.annotation) is Annotated
        or any(get_origin(a) is Annotated for a in get_args(info.annotation))
    )


# -- the model ----------------------------------------------------------------------------


def test_the_process_settings_contain_the_sandbox_settings_with_their_variables() -> None:
    assert issubclass(Settings, SandboxSettings)
    for name, info in SandboxSettings.model_fields.items():
        own = Settings.model_fields[name]
        assert (own.annotation, own.default, own.description, own.metadata) == (
            info.annotation,
            info.default,
            info.description,
            info.metadata,
        ), name


def test_the_workspace_settings_derive_from_them() -> None:
    shared = set(WorkspaceSettings.model_fields) & set(SandboxSettings.model_fields)
    assert shared == set(PER_WORKSPACE)
    for name in PER_WORKSPACE:
        own, base = WorkspaceSettings.model_fields[name], SandboxSettings.model_fields[name]
        assert own.description == base.description and own.default is None, name
        # The same validator: the process default passes both, a bad value fails both.
        parse({name: base.default or "/etc/ssl/certs/ca-certificates.crt"})
        bad = _bad_setting(name)
        with pytest.raises(ValidationError):
            SandboxSettings(**{name: bad})


def test_a_spec_is_built_from_them(tmp_path: Path) -> None:
    s = Settings(memory="2g", cpus=2, ca_bundle="/etc/ssl/certs/ca-certificates.crt")
    spec = SandboxSpec(**s.sandbox_spec_kwargs())
    assert (spec.memory, spec.cpus, spec.ca_bundle) == (2 << 30, 2.0, "/etc/ssl/certs/ca-certificates.crt")
    ws = spec_for(s.sandbox_spec_kwargs(), parse({"memory": "512m", "pids": 64}))
    assert (ws.memory, ws.pids, ws.cpus) == (512 << 20, 64, 2.0)


def test_every_sandbox_setting_is_validated() -> None:
    # None of the sandbox's settings is free text: each has a bound or a validator.
    free = [
        n
        for n in SandboxSettings.model_fields
        if not _validated(Settings, n) and _candidates(Settings.model_fields[n]) == STRINGS
    ]
    assert free == []


# -- the CLI: every variable ----------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for key in list(os.environ):
        if key.startswith("LOOM_"):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_a_bad_value_of_any_variable_is_one_line_naming_it(
    name: str, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    variable = f"LOOM_{name.upper()}"
    refused = None
    for value in _candidates(Settings.model_fields[name]):
        clean_env.setenv(variable, value)
        try:
            load_settings()
        except SystemExit as e:
            refused = (value, e.code, capsys.readouterr().err)
            break
        capsys.readouterr()
    if refused is None:
        # Free text (a token, a host, a model's name, a directory): no value is bad.
        assert not _validated(Settings, name) and _candidates(Settings.model_fields[name]) == STRINGS, name
        assert name not in SandboxSettings.model_fields
        return
    value, code, err = refused
    assert code == 2, (variable, value)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"loom-worker: error: {variable}:"), (value, err)
    assert "Traceback" not in err


# -- HTTP: every field of a workspace's settings ----------------------------------------------


def _bad_setting(name: str) -> Any:
    """A value of setting ``name`` that the workspace settings refuse."""
    for value in (*_candidates(WorkspaceSettings.model_fields[name]), 12345):
        try:
            parse({name: value})
        except SettingsError as e:
            assert e.field.split(".")[0] == name, e
            return value
    raise AssertionError(f"no bad value found for {name}")


@pytest.fixture
async def service(tmp_path: Path, local_backend: Any) -> AsyncIterator[Any]:
    configs = Configs(SettingsStore(tmp_path / "data"), Settings().sandbox_spec_kwargs(), Caps())
    async with running(tmp_path / "root", ToolRegistry(backend=local_backend, configs=configs)) as s:
        yield s


async def test_a_bad_value_of_any_workspace_setting_is_a_422_naming_it(service: Any) -> None:
    c = service.client
    assert (await c.post("/v1/workspaces", json={"name": "w1"})).status_code == 201
    for name in WorkspaceSettings.model_fields:
        value = _bad_setting(name)
        r = await c.patch("/v1/workspaces/w1", json={name: value})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == ["body", name], (name, value, r.text)
        r = await c.post("/v1/workspaces", json={"name": "w2", "settings": {name: value}})
        assert r.status_code == 422, (name, value, r.text)
        assert r.json()["detail"][0]["loc"][:3] == ["body", "settings", name], (name, value, r.text)
        assert not (service.root / "w2").exists()


@pytest.mark.parametrize("command", ["serve", "call"])
def test_the_commands_exit_2_with_that_line(command: str, tmp_path: Path) -> None:
    from tests.workers import cli, cli_env

    env = cli_env(str(tmp_path / "run"), tmp_path / "data", LOOM_MEMORY="1m")
    argv = (
        ["serve"]
        if command == "serve"
        else ["call", "read_file", "--args", '{"path": "a"}', "--workspace", str(tmp_path)]
    )
    p = cli(env, *argv, timeout=60)
    assert p.returncode == 2 and p.stdout == b"", p
    assert p.stderr.decode().splitlines() == ["loom-worker: error: LOOM_MEMORY: at least 64m"]


def test_a_host_path_setting_takes_a_pathlib_path() -> None:
    """The Python API's callers gave ``ca_bundle`` as a ``Path`` before it was a checked string."""
    from pathlib import Path

    s = Settings(ca_bundle=Path("/etc/ssl/certs/ca-certificates.crt"))  # type: ignore[arg-type]
    assert s.ca_bundle == "/etc/ssl/certs/ca-certificates.crt"
