"""Images a user names are pulled (sandbox/docker/images.py): against a real registry on
this machine's loopback (Debian's docker-registry, started here on a free port: the engine
trusts 127.0.0.0/8 without TLS). An image is pushed to it, removed from the engine, and
used by name through Python, the CLI and HTTP; the pull policy, the registry allowlist,
Docker's own credentials, the progress events and each kind of refusal are checked.

Only the tags these tests make are removed from the engine, never a shared image.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import subprocess
import tarfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend
from sandbox.errors import ImageNotFoundError, ImagePullError
from sandbox.pulls import PullEvent
from tests.conftest import MINIMAL_IMAGE, REQUIRE_DOCKER
from tests.docker.conftest import own_backend, require_runtime
from tests.servers import free_port, serve_app
from tests.workers import cli, cli_env, run_dir

pytestmark = pytest.mark.docker

REGISTRY_BIN = "/usr/bin/docker-registry"
USER, PASSWORD = "loom", "pw-" + uuid.uuid4().hex[:8]


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT, as image names write it
    proc: subprocess.Popen[bytes]


def _start_registry(root: Path, *, htpasswd: bool = False) -> Registry:
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "error", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    if htpasswd:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # libxcrypt's bcrypt, which the registry's htpasswd wants

        (root / "htpasswd").write_text(f"{USER}:{crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
        config["auth"] = {"htpasswd": {"realm": "loom-test", "path": str(root / "htpasswd")}}
    (root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    proc = subprocess.Popen(
        [REGISTRY_BIN, "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry ended: {proc.stderr.read().decode() if proc.stderr else ''}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code in (200, 401):
                return Registry(f"127.0.0.1:{port}", proc)
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("docker-registry did not answer")


@contextlib.contextmanager
def _registry(tmp: Path, **kwargs: Any) -> Iterator[Registry]:
    if not os.access(REGISTRY_BIN, os.X_OK):
        if REQUIRE_DOCKER:
            pytest.fail(f"REQUIRE_DOCKER=1 but {REGISTRY_BIN} is missing (apt-get install docker-registry)")
        pytest.skip(f"{REGISTRY_BIN} is missing (apt-get install docker-registry)")
    reg = _start_registry(tmp, **kwargs)
    try:
        yield reg
    finally:
        reg.proc.terminate()
        try:
            reg.proc.wait(10)
        except subprocess.TimeoutExpired:
            reg.proc.kill()
            reg.proc.wait()
        if reg.proc.stderr is not None:
            reg.proc.stderr.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with _registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture
def engine() -> Iterator[Any]:
    client = docker.from_env()
    made: list[str] = []
    client.loom_made = made  # type: ignore[attr-defined]
    try:
        yield client
    finally:
        for name in made:
            _forget(client, name)
        client.close()


def _forget(client: Any, name: str) -> None:
    """Take ``name`` off the engine: its tag and the digest reference a pull leaves (an
    untag each; the image itself goes only when nothing else names it, as with the blob
    images, which are ours alone)."""
    repo = name.rsplit(":", 1)[0]
    refs = {name}
    for image in client.images.list(name=repo):
        refs.update(d for d in image.attrs.get("RepoDigests") or [] if d.startswith(repo + "@"))
    for ref in refs:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(ref)


def _push(client: Any, name: str, source: str, auth: dict[str, str] | None = None) -> None:
    """Push ``source`` as ``name`` and take the tag off the engine again."""
    client.loom_made.append(name)
    client.images.get(source).tag(name)
    for line in client.api.push(name, stream=True, decode=True, auth_config=auth):
        assert "error" not in line, line
    client.images.remove(name)


def _pushed(client: Any, registry: Registry, source: str = MINIMAL_IMAGE, **kwargs: Any) -> str:
    """A fresh name in ``registry`` for ``source``, not on the engine."""
    name = f"{registry.host}/loom-test/img-{uuid.uuid4().hex[:10]}:v1"
    _push(client, name, source, **kwargs)
    return name


def _blob_image(client: Any, registry: Registry, size: int = 3 << 20) -> str:
    """An image whose one layer (random bytes) the engine has nowhere else: pulling it
    downloads it. Pushed, then removed from the engine entirely (it is ours)."""
    name = f"{registry.host}/loom-test/blob-{uuid.uuid4().hex[:10]}:v1"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in (("Dockerfile", b"FROM scratch\nCOPY blob /blob\n"), ("blob", os.urandom(size))):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    client.loom_made.append(name)
    client.images.build(fileobj=buf, custom_context=True, tag=name, rm=True)
    for line in client.api.push(name, stream=True, decode=True):
        assert "error" not in line, line
    client.images.remove(name)
    return name


def _has(client: Any, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


@contextlib.asynccontextmanager
async def _backend(runtime: str = "runc", **spec: Any) -> AsyncIterator[tuple[DockerBackend, list[PullEvent]]]:
    events: list[PullEvent] = []
    async with own_backend(runtime, **spec) as backend:
        backend.add_pull_listener(events.append)
        yield backend, events


# -- Python ------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_an_image_named_by_the_user_is_pulled_and_used(
    docker_ready: None, registry: Registry, engine: Any, workspace: Path, runtime: str
) -> None:
    require_runtime(runtime)
    name = _pushed(engine, registry)
    assert not _has(engine, name)
    async with _backend(runtime, image=name, registries=(registry.host,)) as (backend, events):
        box = await backend.get(workspace)
        r = await box.exec(ExecRequest("cat /etc/debian_version"))
        assert r.exit_code == 0 and r.stdout.strip()
        attrs = await backend.inspect(workspace)
        assert attrs is not None and attrs["Config"]["Image"] == name
    assert _has(engine, name)
    assert events[0].state == "pulling" and events[0].image == name and events[0].registry == registry.host
    # Every layer is the engine's already (the image is a retag): the pull fetches the manifest.
    assert events[-1].state == "done" and "Downloaded newer image" in events[-1].status
    assert [e.state for e in events].count("done") == 1


async def test_progress_counts_the_layers_and_bytes_downloaded(
    docker_ready: None, registry: Registry, engine: Any
) -> None:
    name = _blob_image(engine, registry)
    async with _backend(registries=(registry.host,)) as (backend, events):
        assert await backend.ensure_image(name) is True
        done = events[-1]
        assert (done.state, done.layers, done.layers_done) == ("done", 1, 1)
        assert done.bytes_total >= 3 << 20 and done.bytes_done == done.bytes_total  # random bytes: no compression
        assert all(e.bytes_done <= e.bytes_total for e in events)
        events.clear()
        assert await backend.ensure_image(name) is False  # on the engine now: nothing pulled
        assert events == []


async def test_one_pull_for_callers_that_need_the_same_image_at_once(
    docker_ready: None, registry: Registry, engine: Any
) -> None:
    name = _blob_image(engine, registry)
    async with _backend(registries=(registry.host,)) as (backend, events):
        results = await asyncio.gather(*(backend.ensure_image(name) for _ in range(4)))
        assert results == [True] * 4
        assert [e.state for e in events].count("done") == 1


async def test_never_pulls_nothing(docker_ready: None, registry: Registry, engine: Any, workspace: Path) -> None:
    name = _pushed(engine, registry)
    async with _backend(image=name, pull="never", registries=(registry.host,)) as (backend, events):
        box = await backend.get(workspace)
        with pytest.raises(ImageNotFoundError, match="LOOM_PULL=never") as e:
            await box.exec(ExecRequest("true"))
        assert not isinstance(e.value, ImagePullError) and name in str(e.value)
        assert await backend.inspect(workspace) is None and events == []
    assert not _has(engine, name)


async def test_always_follows_a_tag_that_moved(docker_ready: None, registry: Registry, engine: Any) -> None:
    name = _pushed(engine, registry)
    async with _backend(registries=(registry.host,)) as (backend, _events):
        assert await backend.ensure_image(name) is True
    first = engine.images.get(name).id
    _push(engine, name, "loom-test-busybox:latest")  # in the registry the tag now names another image
    engine.images.get(first).tag(name)  # and the engine still has the old one under it
    async with _backend(pull="missing", registries=(registry.host,)) as (backend, _events):
        assert await backend.ensure_image(name) is False  # the engine has one: kept
    assert engine.images.get(name).id == first
    async with _backend(pull="always", registries=(registry.host,)) as (backend, events):
        assert await backend.ensure_image(name) is True
        assert events[-1].state == "done"
    assert engine.images.get(name).id == engine.images.get("loom-test-busybox:latest").id != first


async def test_a_registry_the_operator_did_not_allow_is_refused(
    docker_ready: None, registry: Registry, engine: Any, workspace: Path
) -> None:
    name = _pushed(engine, registry)
    async with _backend(image=name) as (backend, events):  # registries: docker.io only
        box = await backend.get(workspace)
        with pytest.raises(ImagePullError) as e:
            await box.exec(ExecRequest("true"))
    assert (e.value.reason, e.value.registry, e.value.image) == ("not_allowed", registry.host, name)
    assert name in str(e.value) and "LOOM_REGISTRIES" in str(e.value) and "docker.io" in str(e.value)
    assert events == [] and not _has(engine, name)


async def test_errors_name_the_image_and_the_registrys_answer(
    docker_ready: None, registry: Registry, engine: Any
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    cases = {
        f"{registry.host}/loom-test/none-{uuid.uuid4().hex[:8]}:nope": ("not_found", registry.host, "manifest unknown"),
        f"{closed}/loom-test/x:1": ("unreachable", closed, "connection refused"),
    }
    async with _backend(registries=(registry.host, closed)) as (backend, events):
        for name, (reason, host, answer) in cases.items():
            with pytest.raises(ImagePullError) as e:
                await backend.ensure_image(name)
            assert (e.value.reason, e.value.registry) == (reason, host), e.value
            assert name in str(e.value) and host in str(e.value) and answer in str(e.value), e.value
        assert [(ev.state, ev.reason) for ev in events if ev.state != "pulling"] == [
            ("failed", "not_found"),
            ("failed", "unreachable"),
        ]
        with pytest.raises(ImagePullError) as e:
            await backend.ensure_image("Not/A Valid:name")
        assert e.value.reason == "invalid"


async def test_credentials_come_from_dockers_own_configuration(
    docker_ready: None, engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _registry(tmp_path / "reg", htpasswd=True) as private:
        name = f"{private.host}/loom-test/private-{uuid.uuid4().hex[:8]}:v1"
        _push(engine, name, MINIMAL_IMAGE, auth={"username": USER, "password": PASSWORD})
        nobody = tmp_path / "nobody"
        nobody.mkdir()
        (nobody / "config.json").write_text("{}")
        monkeypatch.setenv("DOCKER_CONFIG", str(nobody))
        async with _backend(registries=(private.host,)) as (backend, _events):
            with pytest.raises(ImagePullError) as e:
                await backend.ensure_image(name)
            assert e.value.reason == "unauthorized" and name in str(e.value), e.value
        # `docker login` writes this: the worker's SDK client reads it as the docker CLI does.
        login = tmp_path / "login"
        login.mkdir()
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        (login / "config.json").write_text(json.dumps({"auths": {private.host: {"auth": token}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(login))
        async with _backend(registries=(private.host,)) as (backend, events):
            assert await backend.ensure_image(name) is True
            assert events[-1].state == "done"
        assert _has(engine, name)


# -- CLI ---------------------------------------------------------------------------------


def test_cli_workspace_image_and_first_call_pull_with_progress(
    docker_ready: None, registry: Registry, engine: Any, tmp_path: Path, workspace: Path
) -> None:
    """`workspace set --image` pulls now (progress on stderr, result on stdout); a
    workspace's first call pulls the default image through the local worker, whose
    progress reaches the CLI's stderr; a name that cannot be had is refused (exit 2)."""
    os.chown(workspace, 1000, 1000)
    own = _pushed(engine, registry)
    default = _pushed(engine, registry)
    with run_dir() as run:
        env = cli_env(run, tmp_path / "data", LOOM_IMAGE=default, LOOM_REGISTRIES=f"docker.io,{registry.host}")
        try:
            missing = f"{registry.host}/loom-test/none:nope"
            p = cli({**env, "LOOM_CLI_DAEMON": "0"}, "workspace", "set", "-w", str(workspace), "--image", missing)
            assert p.returncode == 2, p
            assert missing in p.stderr.decode() and "no such image" in p.stderr.decode(), p.stderr
            other = tmp_path / "other"
            other.mkdir()
            os.chown(other, 1000, 1000)
            p = cli({**env, "LOOM_CLI_DAEMON": "0"}, "workspace", "set", "-w", str(other), "--image", own)
            assert p.returncode == 0, p
            err = p.stderr.decode()
            assert f"pulling {own} from {registry.host}" in err and f"pulled {own}" in err, err
            assert _has(engine, own)

            p = cli(env, "call", "shell_execute", "-w", str(workspace), "--args", '{"command": "echo hi"}')
            assert p.returncode == 0, p
            assert json.loads(p.stdout)["output"].strip() == "hi"
            err = p.stderr.decode()
            assert f"pulling {default} from {registry.host}" in err and f"pulled {default}" in err, err
        finally:
            for ws in (workspace, tmp_path / "other"):
                cli({**env, "LOOM_CLI_DAEMON": "0"}, "stop", "-w", str(ws))


# -- HTTP --------------------------------------------------------------------------------


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event = data = None
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
        if event and data:
            out.append((event, json.loads(data)))
    return out


async def test_http_pull_route_settings_and_the_event_stream(
    docker_ready: None, registry: Registry, engine: Any, tmp_path: Path
) -> None:
    from tests.docker.conftest import own_registry
    from worker.http.app import create_app
    from worker.settings import Settings

    name = _blob_image(engine, registry)
    for_settings = _pushed(engine, registry)
    token = "t-" + uuid.uuid4().hex
    headers = {"Authorization": f"Bearer {token}"}
    async with own_registry(tmp_path, registries=f"docker.io,{registry.host}") as reg:
        settings = Settings(workspace_root=tmp_path / "root", api_token=token, registries=f"docker.io,{registry.host}")
        app = create_app(settings, reg)
        async with serve_app(app) as base, httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as c:
            assert (
                await c.post("/v1/images/pull", json={"image": name}, headers={"Authorization": ""})
            ).status_code == 401
            r = await c.post("/v1/images/pull", json={"image": "two words"})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "image"]
            for bad in (".", "a/.."):  # the engine's inspect URL would become its image list
                r = await c.post("/v1/images/pull", json={"image": bad})
                assert r.status_code == 422 and "not an image reference" in r.text

            watched: list[tuple[str, dict[str, Any]]] = []

            async def watch() -> None:
                async with c.stream("GET", "/v1/images/pulls") as s:
                    buf = ""
                    async for chunk in s.aiter_text():
                        buf += chunk
                        watched[:] = _sse(buf)

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0.5)  # the stream is open before the pull starts
            r = await c.post("/v1/images/pull", json={"image": name})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = _sse(r.text)
            assert events[-1] == ("result", {"image": name, "pulled": True})
            progress = [e for kind, e in events if kind == "progress"]
            assert progress[0]["state"] == "pulling" and progress[-1]["state"] == "done"
            assert progress[-1]["bytes_total"] >= 3 << 20
            r = await c.post("/v1/images/pull", json={"image": name})
            assert _sse(r.text) == [("result", {"image": name, "pulled": False})]  # on the engine now

            missing = f"{registry.host}/loom-test/none:nope"
            kind, error = _sse((await c.post("/v1/images/pull", json={"image": missing})).text)[-1]
            assert kind == "error" and (error["reason"], error["registry"]) == ("not_found", registry.host)
            assert missing in error["message"]
            kind, error = _sse((await c.post("/v1/images/pull", json={"image": "ghcr.io/x/y:1"})).text)[-1]
            assert (kind, error["reason"], error["registry"]) == ("error", "not_allowed", "ghcr.io")

            # A workspace's settings naming an image pull it before they are stored.
            assert (await c.post("/v1/workspaces", json={"name": "w"})).status_code in (200, 201)
            r = await c.patch("/v1/workspaces/w", json={"image": "."})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "image"
            r = await c.patch("/v1/workspaces/w", json={"image": missing})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "image"]
            assert missing in r.json()["detail"][0]["msg"]
            r = await c.patch("/v1/workspaces/w", json={"image": for_settings})
            assert r.status_code == 200, r.text
            assert _has(engine, for_settings)

            for _ in range(100):
                if sum(1 for _k, e in watched if e["state"] == "done") >= 2:
                    break
                await asyncio.sleep(0.1)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        done = [e["image"] for _k, e in watched if e["state"] == "done"]
        failed = [e["image"] for _k, e in watched if e["state"] == "failed"]
        assert done == [name, for_settings] and missing in failed
