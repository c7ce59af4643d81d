"""A loom service serving E2B's API on the real engine, for the official E2B SDKs.

``e2b_server`` starts ``loom-worker serve``'s app (loom's routes and E2B's, a token) in a
thread of its own, so that the SDK's synchronous client can be called from the test's
thread, and points the SDK at it the way a user does: ``E2B_API_URL``,
``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` in the environment. ``e2b_server_runtime`` does
the same under each runtime (runc, gVisor)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE, TEST_OWNER
from tests.docker.conftest import require_runtime
from tests.servers import free_port
from worker.owner import OWNER_FILE
from worker.settings import Settings

TOKEN = "e2b-tests-token"


@dataclass
class E2BServer:
    url: str
    token: str
    root: Path  # the workspaces' directory: <root>/<sandbox id> is a sandbox's files
    data: Path
    settings: Settings

    def workspace(self, sandbox_id: str) -> Path:
        return self.root / sandbox_id


def _serve(settings: Settings) -> Iterator[str]:
    import uvicorn

    from worker.cli.service import e2b_routes
    from worker.http import create_app

    routes = e2b_routes(settings)
    assert routes, "the e2b integration is not installed (pip install -e '.[e2b]')"
    app = create_app(settings, routes=routes)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on", ws="wsproto")
    )
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.serve())
        except BaseException as e:  # (reported to the test below)
            failed.append(e)

    thread = threading.Thread(target=run, name="e2b-server", daemon=True)
    thread.start()
    while not server.started:
        if failed or not thread.is_alive():
            raise RuntimeError(f"the server did not start: {failed}")
        thread.join(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)


def _settings(tmp_path: Path, runtime: str, **more: object) -> Settings:
    root, data = tmp_path / "root", tmp_path / "data"
    root.mkdir(parents=True)
    data.mkdir()
    (data / OWNER_FILE).write_text(TEST_OWNER + "\n")
    # No sandboxes made ahead (LOOM_E2B_WARM_SANDBOXES) unless a test asks: they would
    # start containers beside every test's own.
    more = {"e2b_warm_sandboxes": 0, **more}
    return Settings(
        workspace_root=root,
        data_dir=data,
        image=SANDBOX_IMAGE,
        runtime=runtime,
        catalog=False,
        api_token=TOKEN,
        e2b_api=True,
        uid=1000,
        gid=1000,
        **more,
    )  # type: ignore[arg-type]


@pytest.fixture
def e2b_settings() -> dict[str, object]:
    """More settings for the server (a test overrides this fixture)."""
    return {}


def _start(
    tmp_path: Path, runtime: str, monkeypatch: pytest.MonkeyPatch, more: dict[str, object]
) -> Iterator[E2BServer]:
    settings = _settings(tmp_path, runtime, **more)
    gen = _serve(settings)
    url = next(gen)
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", TOKEN)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    try:
        yield E2BServer(url, TOKEN, settings.workspace_root, settings.data_dir, settings)
    finally:
        next(gen, None)


@pytest.fixture
def e2b_server(
    docker_ready: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, e2b_settings: dict[str, object]
) -> Iterator[E2BServer]:
    """The service under runc, the SDK pointed at it."""
    yield from _start(tmp_path, "runc", monkeypatch, e2b_settings)


@pytest.fixture(params=["runc", "runsc"])
def e2b_server_runtime(
    request: pytest.FixtureRequest,
    docker_ready: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    e2b_settings: dict[str, object],
) -> Iterator[E2BServer]:
    """The service under each runtime, the SDK pointed at it."""
    require_runtime(request.param)
    yield from _start(tmp_path, request.param, monkeypatch, e2b_settings)


__all__ = ["TOKEN", "E2BServer"]
