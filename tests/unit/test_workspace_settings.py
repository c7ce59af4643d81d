"""Per-workspace settings without Docker: the model and its checks, the host-side store,
the registry handing each workspace its own spec (also after another process changed the
file), and the HTTP routes. The real engine's side is in tests/docker/test_environments.py."""

from __future__ import annotations

import concurrent.futures
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.spec import SandboxSpec
from tests.unit.test_http import running
from worker.registry import ToolRegistry
from worker.workspace_settings import (
    Caps,
    Configs,
    SettingsError,
    SettingsStore,
    WorkspaceSettings,
    check,
    parse,
    spec_for,
)

CAPS = Caps(max_cpus=2, max_memory=4 << 30, max_pids=1024, max_idle_ttl=3600)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"colour": "blue"}, "colour"),
        ({"memory": "lots"}, "memory"),
        ({"memory": "1m"}, "memory"),
        ({"cpus": 0}, "cpus"),
        ({"pids": 3}, "pids"),
        ({"runtime": "kata"}, "runtime"),
        ({"image": "two words"}, "image"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"env": {"LD_PRELOAD": "/workspace/x.so"}}, "env"),
        ({"env": {"LOOM_API_TOKEN": "x"}}, "env"),
        ({"ca_bundle": "relative.pem"}, "ca_bundle"),
        ({"idle_ttl": 1}, "idle_ttl"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(SettingsError) as e:
        parse(changes)
    assert e.value.field == field or e.value.field.startswith(field + "."), e.value


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"cpus": 3}, "cpus"), ({"memory": "5g"}, "memory"), ({"pids": 2048}, "pids"), ({"idle_ttl": 7200}, "idle_ttl")],
)
def test_limits_above_the_operators_caps_are_refused(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(SettingsError) as e:
        check(parse(changes), CAPS, None)
    assert e.value.field == field and "cap" in e.value.message


def test_a_runtime_the_engine_lacks_and_a_bad_ca_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="runsc is not installed"):
        check(parse({"runtime": "runsc"}), CAPS, {"runc"})
    check(parse({"runtime": "runsc"}), CAPS, {"runc", "runsc"})
    (tmp_path / "not.pem").write_text("hello")
    for path in (tmp_path / "missing.pem", tmp_path / "not.pem"):
        with pytest.raises(SettingsError) as e:
            check(parse({"ca_bundle": str(path)}), CAPS, None)
        assert e.value.field == "ca_bundle"


def test_null_removes_an_override_and_the_spec_merges_over_the_defaults() -> None:
    s = parse({"memory": "2G", "cpus": 2, "env": {"B": "2", "A": "1"}})
    assert s.memory == "2g" and list((s.env or {}).keys()) == ["A", "B"]
    s = parse({"cpus": None}, s)
    assert s.set_fields() == {"memory": "2g", "env": {"A": "1", "B": "2"}}
    spec = spec_for({"image": "img:1", "cpus": 1.0, "memory": "1g"}, s)
    assert (spec.image, spec.cpus, spec.memory, spec.env) == ("img:1", 1.0, 2 << 30, {"A": "1", "B": "2"})
    assert spec.fingerprint() != spec_for({"image": "img:1", "cpus": 1.0}, WorkspaceSettings()).fingerprint()


def test_the_store_is_on_the_host_private_and_atomic(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    store = SettingsStore(tmp_path / "data")
    assert store.load(ws) == WorkspaceSettings()
    store.save(ws, parse({"image": "a:1"}))
    path = store.path(ws)
    assert not path.is_relative_to(ws)  # never inside the workspace
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"image": "a:1", "workspace": str(ws)}
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]  # no temp file left
    # Another process (another store) changes it: this one notices with one stat.
    assert not store.changed(ws)
    other = SettingsStore(tmp_path / "data")
    other.save(ws, parse({"image": "b:2"}))
    assert store.changed(ws) and store.load(ws).image == "b:2"
    path.write_text("{not json")
    with pytest.raises(SettingsError, match="not JSON"):
        store.load(ws)


class _Backend:
    """A backend that records the specs it is given (what DockerBackend.configure does)."""

    def __init__(self) -> None:
        self.specs: dict[Path, SandboxSpec | None] = {}
        self.gets = 0

    async def configure(self, workspace: Path, spec: SandboxSpec | None) -> bool:
        changed = self.specs.get(workspace) != spec
        self.specs[workspace] = spec
        return changed

    async def get(self, workspace: Path) -> Any:
        self.gets += 1
        return object()

    async def runtimes(self) -> set[str]:
        return {"runc"}

    async def cpu_count(self) -> int:
        return 2

    async def has_image(self, image: str) -> bool:
        return not image.startswith("missing")

    async def ensure_image(self, image: str) -> bool:
        """As DockerBackend.ensure_image: an image it cannot have is an ImagePullError."""
        from sandbox.errors import ImagePullError

        if image.startswith("missing"):
            raise ImagePullError(
                f"image {image} could not be pulled from docker.io: not found",
                image=image,
                registry="docker.io",
                reason="not_found",
            )
        return False

    async def stop(self, workspace: Path) -> bool:
        return False

    async def aclose(self) -> None:
        pass


async def test_each_workspace_gets_its_own_spec_and_changes_are_seen(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    backend = _Backend()
    configs = Configs(SettingsStore(tmp_path / "data"), {"image": "default:1"}, CAPS)
    registry = ToolRegistry(backend=backend, configs=configs)  # type: ignore[arg-type]
    done = await registry.configure_workspace(a, {"image": "a:1", "memory": "2g"})
    assert done.changed and "recreated" in done.message and done.effective["image"] == "a:1"
    ws_a = await registry.workspace(str(a))
    await registry.workspace(str(b))
    assert backend.specs[a] is not None and backend.specs[a].image == "a:1"
    assert backend.specs[b] is not None and backend.specs[b].image == "default:1"
    assert await registry.workspace(str(a)) is ws_a  # unchanged: the cached workspace
    # Another process changes a's settings: the next call uses them.
    SettingsStore(tmp_path / "data").save(a, parse({"image": "a:2"}))
    ws_a2 = await registry.workspace(str(a))
    assert ws_a2 is not ws_a and backend.specs[a] is not None and backend.specs[a].image == "a:2"
    assert ws_a2.recorder is ws_a.recorder  # the changelog stays
    with pytest.raises(SettingsError, match="runtime"):
        await registry.configure_workspace(a, {"runtime": "runsc"})  # this engine has runc only
    assert (await registry.workspace_settings(a))[0].image == "a:2"  # nothing changed
    assert not (await registry.configure_workspace(a, {"image": "a:2"})).changed


@pytest.fixture
async def settings_service(tmp_path: Path) -> AsyncIterator[Any]:
    configs = Configs(SettingsStore(tmp_path / "data"), {"image": "default:1"}, CAPS)
    async with running(tmp_path / "root", ToolRegistry(backend=_Backend(), configs=configs)) as s:  # type: ignore[arg-type]
        yield s


async def test_http_create_show_change_and_refuse(settings_service: Any) -> None:
    c = settings_service.client
    r = await c.post("/v1/workspaces", json={"name": "big", "settings": {"memory": "64g"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "settings", "memory"]
    assert not (settings_service.root / "big").exists()  # nothing was created
    r = await c.post("/v1/workspaces", json={"name": "gone", "settings": {"image": "missing:1"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "settings", "image"]
    assert "missing:1" in r.json()["detail"][0]["msg"] and not (settings_service.root / "gone").exists()
    r = await c.post("/v1/workspaces", json={"name": "odd", "settings": {"colour": "blue"}})
    assert r.status_code == 422 and "colour" in json.dumps(r.json()["detail"])
    r = await c.post("/v1/workspaces", json={"name": "w1", "settings": {"image": "x:1", "env": {"A": "1"}}})
    assert r.status_code == 201, r.text
    r = await c.get("/v1/workspaces/w1")
    assert r.status_code == 200
    assert r.json()["settings"] == {"image": "x:1", "env": {"A": "1"}} and r.json()["effective"]["image"] == "x:1"
    r = await c.patch("/v1/workspaces/w1", json={"image": None, "cpus": 2})
    assert r.status_code == 200 and r.json()["recreate"] is True and "files" in r.json()["message"]
    assert r.json()["settings"] == {"cpus": 2.0, "env": {"A": "1"}} and r.json()["effective"]["image"] == "default:1"
    r = await c.patch("/v1/workspaces/w1", json={"egress": ["pypi", "*.co.uk"]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "egress"
    assert "'*.co.uk'" in r.json()["detail"][0]["msg"]
    r = await c.patch("/v1/workspaces/w1", json={"egress": ["pypi", "!upload.pypi.org"]})
    assert r.status_code == 200 and r.json()["effective"]["egress"] == ["pypi", "!upload.pypi.org"]
    assert r.json()["recreate"] is False and "new connections at once" in r.json()["message"]
    r = await c.patch("/v1/workspaces/w1", json={"egress": None})
    assert r.status_code == 200 and r.json()["effective"]["egress"] == []
    r = await c.patch("/v1/workspaces/w1", json={"image": "missing:2"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "image"
    r = await c.patch("/v1/workspaces/w1", json={"pids": 99999})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "pids"
    r = await c.patch("/v1/workspaces/w1", json={"cpus": 3})
    assert r.status_code == 422 and "LOOM_MAX_CPUS" in r.json()["detail"][0]["msg"]
    assert (await c.get("/v1/workspaces/w1")).json()["settings"]["cpus"] == 2.0  # unchanged
    assert (await c.get("/v1/workspaces/nope")).status_code == 404
    # The sandbox never sees them: they are in the data directory, not the workspace.
    assert os.listdir(settings_service.root / "w1") == []


async def test_allow_root_is_refused_where_the_sandbox_would_run_as_root(settings_service: Any) -> None:
    """A root-owned workspace (no LOOM_UID) already runs its owner's commands as uid 0:
    allow_root there would keep root's capabilities. Refused when set, naming the field,
    not at every later start as an infrastructure failure (an API fuzzer found the 503)."""
    c = settings_service.client
    r = await c.post("/v1/workspaces", json={"name": "r", "settings": {"allow_root": True}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "settings", "allow_root"]
    assert "root's" in r.json()["detail"][0]["msg"]
    assert not (settings_service.root / "r").exists()  # nothing was created
    assert (await c.post("/v1/workspaces", json={"name": "w"})).status_code == 201
    r = await c.patch("/v1/workspaces/w", json={"allow_root": True})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "allow_root"
    assert "allow_root" not in (await c.get("/v1/workspaces/w")).json()["settings"]  # nothing stored
    os.chown(settings_service.root / "w", 1000, 1000)  # another owner: the sandbox's user is 1000
    r = await c.patch("/v1/workspaces/w", json={"allow_root": True})
    assert r.status_code == 200 and r.json()["settings"] == {"allow_root": True}
    assert (await c.patch("/v1/workspaces/w", json={"cpus": 1})).status_code == 200  # kept on later changes


async def test_cpus_the_engine_cannot_give_are_refused_when_set(tmp_path: Path) -> None:
    """The engine refuses a CPU limit above its host's CPUs, and gVisor takes 40 s to
    start below 0.1 CPU: both would fail every later start, so both are refused here."""
    ws = tmp_path / "ws"
    ws.mkdir()
    configs = Configs(SettingsStore(tmp_path / "data"), {"image": "default:1"}, Caps(max_cpus=8))
    registry = ToolRegistry(backend=_Backend(), configs=configs)  # type: ignore[arg-type]
    with pytest.raises(SettingsError) as refused:
        await registry.configure_workspace(ws, {"cpus": 3})
    assert refused.value.field == "cpus" and "engine's 2 CPUs" in refused.value.message
    with pytest.raises(SettingsError) as refused:
        await registry.configure_workspace(ws, {"cpus": 0.05})
    assert refused.value.field == "cpus" and "0.1" in refused.value.message
    assert (await registry.workspace_settings(ws))[0].cpus is None  # nothing stored
    assert (await registry.configure_workspace(ws, {"cpus": 2})).settings.cpus == 2


def _combined(tmp_path: Path) -> tuple[Path, bytes]:
    """A bundle as some hosts keep one: a certificate with its private key in one file."""
    from worker.pem import certificates

    cert = certificates(Path("/etc/ssl/certs/ca-certificates.crt").read_bytes()).split(b"-----END CERTIFICATE-----")[0]
    cert += b"-----END CERTIFICATE-----\n"
    key = b"-----BEGIN PRIVATE KEY-----\nTUlJRXZRSUJBREFOQmdrcWhraUc5dzBC\n-----END PRIVATE KEY-----\n"
    path = tmp_path / "combined.pem"
    path.write_bytes(b"# the site's certificate and key\n" + cert + key)
    return path, cert


def test_a_sandbox_gets_a_copy_of_the_certificates_only(tmp_path: Path) -> None:
    from worker.pem import trusted_copy

    path, cert = _combined(tmp_path)
    copy = Path(trusted_copy(str(path), tmp_path / "trust"))
    assert copy.read_bytes() == cert and b"PRIVATE KEY" not in copy.read_bytes()
    assert copy.stat().st_mode & 0o777 == 0o644 and (tmp_path / "trust").stat().st_mode & 0o777 == 0o711
    assert trusted_copy(str(path), tmp_path / "trust") == str(copy)  # the same certificates, the same file
    # Many sandboxes starting at once with one bundle: every writer gets the one copy.
    fresh = tmp_path / "fresh"
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        made = set(pool.map(lambda _: trusted_copy(str(path), fresh), range(64)))
    assert len(made) == 1 and os.listdir(fresh) == [Path(made.pop()).name]  # no temporary file left
    # Swapped for a link to another file after it was checked: the copy is what was read.
    path.unlink()
    path.symlink_to("/etc/shadow")
    assert copy.read_bytes() == cert
    with pytest.raises(OSError, match="no PEM certificate"):
        trusted_copy(str(path), tmp_path / "trust")  # and a copy now would hold nothing of it


async def test_the_backend_is_given_the_copy_not_the_named_file(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    path, cert = _combined(tmp_path)
    backend = _Backend()
    configs = Configs(SettingsStore(tmp_path / "data"), {"image": "default:1"}, CAPS)
    registry = ToolRegistry(backend=backend, configs=configs)  # type: ignore[arg-type]
    done = await registry.configure_workspace(ws, {"ca_bundle": str(path)})
    assert done.effective["ca_bundle"] == str(path)  # what the operator named
    await registry.workspace(str(ws))
    given = backend.specs[ws.resolve()]
    assert given is not None and given.ca_bundle is not None
    assert Path(given.ca_bundle).parent == tmp_path / "data" / "trust"
    assert Path(given.ca_bundle).read_bytes() == cert
