"""E2B's official SDK against a cluster's front door (``loom-worker serve --ray`` with E2B's
routes), on the tier's real cluster: ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` are the front
door's address, ``E2B_API_KEY`` its token, as a user sets them.

Three sandboxes are created once for the module (two slots a node: they land on at least
two nodes); each test uses them. The parts that need a route of E2B's API that is not
served yet (the control plane's list, envd's processes and files are being written) are
tests of their own, skipped with the route named until it is.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import free_port

from .conftest import NAMESPACE, RayCluster

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "ray-e2b-token"


@dataclass
class Front:
    url: str
    routes: set[tuple[str, str]]  # (method, path) of E2B's routes the nodes serve
    mounts: set[str]  # the paths of E2B's mounted apps (envd's Connect-RPC services)

    def require(self, method: str, path: str) -> None:
        """Fail when the nodes do not serve E2B's ``method path`` (every route this test uses
        is served: a missing one is a regression, never a reason to pass by skipping)."""
        if (method, path) not in self.routes and not any(path.startswith(m + "/") for m in self.mounts):
            pytest.fail(f"E2B's {method} {path} is not served by the nodes (worker/integrations/e2b)")


@dataclass
class Placed:
    sbx: Any  # e2b.Sandbox
    node: str
    path: Path  # its workspace, on its node


def _serve(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn in a thread of its own (the SDK's client is synchronous)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.serve())
        except BaseException as e:  # (reported below)
            failed.append(e)

    thread = threading.Thread(target=run, name="e2b-front-door", daemon=True)
    thread.start()
    while not server.started:
        if failed or not thread.is_alive():
            raise RuntimeError(f"the front door did not start: {failed}")
        thread.join(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)


@pytest.fixture(scope="module")
def front(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """The front door with E2B's routes, the SDK pointed at it."""
    from starlette.routing import Mount, Route

    from worker.cli.service import e2b_routes
    from worker.integrations.ray.cli import front_door
    from worker.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("front"), api_token=TOKEN, catalog=False, e2b_api=True)
    routes = e2b_routes(settings)
    assert routes, "the e2b integration is not installed (pip install -e '.[e2b]')"
    served = {(m, r.path) for r in routes if isinstance(r, Route) for m in r.methods or ()}
    mounts = {r.path for r in routes if isinstance(r, Mount)}
    with pytest.MonkeyPatch.context() as mp:
        for url in _serve(front_door(settings, ray_cluster.address, NAMESPACE, routes)):
            mp.setenv("E2B_API_URL", url)
            mp.setenv("E2B_SANDBOX_URL", url)
            mp.setenv("E2B_API_KEY", TOKEN)
            mp.delenv("E2B_DOMAIN", raising=False)
            mp.delenv("E2B_DEBUG", raising=False)
            yield Front(url, served, mounts)


async def _where(sandbox_id: str) -> tuple[str, Path]:
    from worker.integrations.ray import ClusterRegistry

    async with ClusterRegistry(namespace=NAMESPACE) as cluster:
        ws = await cluster.get_workspace(sandbox_id)
    assert ws.state == "ready" and ws.node and ws.path, ws
    return ws.node, Path(ws.path)


async def _workspaces() -> set[str]:
    from worker.integrations.ray import ClusterRegistry

    async with ClusterRegistry(namespace=NAMESPACE) as cluster:
        return {w.id for w in await cluster.list_workspaces()}


async def _delete(sandbox_ids: set[str]) -> None:
    from worker.integrations.ray import ClusterRegistry
    from worker.service import WorkspaceNotFound

    async with ClusterRegistry(namespace=NAMESPACE) as cluster:
        for sid in sandbox_ids:
            try:
                await cluster.delete_workspace(sid, delete_files=True)
            except WorkspaceNotFound:
                pass  # (its kill freed it)


@pytest.fixture(scope="module")
def tag() -> str:
    """This module's sandboxes' metadata value (the list's filter)."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def placed(front: Front, tag: str) -> Iterator[list[Placed]]:
    """Three sandboxes created through the front door, and where each landed."""
    from e2b import Sandbox

    before = asyncio.run(_workspaces())
    made: list[Any] = []
    try:
        for i in range(3):
            made.append(Sandbox.create(metadata={"test": tag, "n": str(i)}))
        yield [Placed(s, *asyncio.run(_where(s.sandbox_id))) for s in made]
    finally:
        for s in made:
            try:
                s.kill()
            except Exception:  # (killed by a test already)
                pass
        # Every workspace the nodes' control planes made meanwhile (a killed sandbox's is
        # kept, as a workspace is), so that the tier's other tests find their slots free.
        asyncio.run(_delete({s.sandbox_id for s in made} | (asyncio.run(_workspaces()) - before)))


def test_sandboxes_land_on_several_nodes_and_connect(ray_cluster: RayCluster, placed: list[Placed]) -> None:
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException

    from worker.auth import Access

    assert len({p.node for p in placed}) >= 2, [p.node for p in placed]
    front_access = Access(TOKEN)
    for p in placed:
        sid = p.sbx.sandbox_id
        # Its workspace is under its node's root: made there, by that node's control plane.
        assert p.path.parent == ray_cluster.roots[p.node] and p.path.is_dir(), (p.node, p.path)
        # The access token the client holds is the front door's (the node's never leaves it).
        assert p.sbx._envd_access_token == front_access.envd_token(sid)
        again = Sandbox.connect(sid)
        assert again.sandbox_id == sid and again._envd_access_token == front_access.envd_token(sid)
    with pytest.raises(NotFoundException):
        Sandbox.connect("i" + "0" * 20)


def test_the_list_is_every_nodes(front: Front, placed: list[Placed], tag: str) -> None:
    from e2b import Sandbox, SandboxQuery

    front.require("GET", "/v2/sandboxes")
    ids = {p.sbx.sandbox_id for p in placed}
    listed = Sandbox.list(query=SandboxQuery(metadata={"test": tag})).next_items()
    assert [s.sandbox_id for s in listed if s.sandbox_id in ids] == [s.sandbox_id for s in listed]
    assert {s.sandbox_id for s in listed} == ids
    assert [s.started_at for s in listed] == sorted((s.started_at for s in listed), reverse=True)  # newest first
    assert {s.metadata["n"] for s in listed} == {"0", "1", "2"}
    # Pages of two: the first names the next, the second is the last; nothing twice.
    pager = Sandbox.list(query=SandboxQuery(metadata={"test": tag}), limit=2)
    first = pager.next_items()
    assert len(first) == 2 and pager.has_next
    second = pager.next_items()
    assert len(second) == 1 and not pager.has_next
    assert [s.sandbox_id for s in first + second] == [s.sandbox_id for s in listed]
    one = Sandbox.list(query=SandboxQuery(metadata={"test": tag, "n": "1"})).next_items()
    assert [s.metadata["n"] for s in one] == ["1"]
    # The front door's own checks and a node's refusal, in E2B's shape.
    with httpx.Client(base_url=front.url, headers={"X-API-KEY": TOKEN}) as c:
        r = c.get("/v2/sandboxes", params={"limit": 0})
        assert r.status_code == 400 and r.json()["code"] == 400 and "limit" in r.json()["message"], r.text
        r = c.get("/v2/sandboxes", params={"nextToken": "not-ours"})
        assert r.status_code == 400 and "nextToken" in r.json()["message"], r.text
        r = c.get("/v2/sandboxes", params={"state": "no-such-state"})
        assert r.status_code == 400 and r.json()["code"] == 400, r.text


def test_envd_reaches_each_sandbox_on_its_node(front: Front, placed: list[Placed]) -> None:
    front.require("GET", "/health")
    with httpx.Client(base_url=front.url) as c:
        for p in placed:
            sid = p.sbx.sandbox_id
            r = c.get("/health", headers={"E2b-Sandbox-Id": sid, "X-Access-Token": p.sbx._envd_access_token})
            assert r.status_code in (200, 204), r.text
        # Another sandbox's access token does not open it.
        a, b = placed[0].sbx, placed[1].sbx
        r = c.get("/health", headers={"E2b-Sandbox-Id": a.sandbox_id, "X-Access-Token": b._envd_access_token})
        assert r.status_code == 401, r.text


def test_commands_and_files_run_in_the_sandbox_on_its_node(front: Front, placed: list[Placed]) -> None:
    front.require("POST", "/process.Process/Start")
    for p in placed:
        # What the command writes is the workspace on its node.
        r = p.sbx.commands.run(f"echo {p.sbx.sandbox_id} > where.txt")
        assert r.exit_code == 0, r
        assert (p.path / "where.txt").read_text() == p.sbx.sandbox_id + "\n"
    # A command's output streams through the front door as it is printed: its first line
    # arrives while the command still waits for the input sent only then.
    sbx = placed[0].sbx
    handle = sbx.commands.run("echo ready; read x; echo got $x", background=True, stdin=True)
    out = ""
    for stdout, _stderr, _pty in handle:
        out += stdout or ""
        if out == "ready\n":
            handle.send_stdin("in\n")
    assert out == "ready\ngot in\n", out
    assert handle.wait().exit_code == 0


def test_a_signed_file_url_reaches_the_sandbox_that_signed_it(front: Front, placed: list[Placed]) -> None:
    front.require("GET", "/files")
    for p in placed:
        p.sbx.files.write("signed.txt", f"from {p.sbx.sandbox_id}")
        url = p.sbx.download_url("signed.txt")
        assert "signature=" in url
        with httpx.Client() as c:
            r = c.get(url)  # no header, no key: the signature names the sandbox
            assert r.status_code == 200 and r.text == f"from {p.sbx.sandbox_id}", r.text
            r = c.get(url.replace("signature=v1_", "signature=v1_x"))
            assert r.status_code in (401, 403), r.text


def test_run_code_reaches_the_sandboxs_kernel_on_its_node(front: Front, placed: list[Placed]) -> None:
    from e2b_code_interpreter import Sandbox as CodeSandbox

    front.require("POST", "/execute")
    p = placed[1]
    code = CodeSandbox.connect(p.sbx.sandbox_id)  # (port 49999 of the same sandbox)
    seen: list[str] = []
    run = code.run_code(
        "open('code.txt', 'w').write('from the kernel'); x = 40 + 2\nprint('out'); x", on_stdout=seen.append
    )
    assert run.error is None and run.text == "42" and "".join(str(s) for s in seen).strip() == "out", run
    assert code.run_code("x + 1").text == "43"  # the kernel's state kept
    assert (p.path / "code.txt").read_text() == "from the kernel"


def test_a_sandbox_from_a_snapshot_is_refused_not_handed_out_unreachable(front: Front, placed: list[Placed]) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    front.require("POST", "/sandboxes/{sandbox_id}/snapshots")
    before = {s.sandbox_id for s in Sandbox.list().next_items()}
    snap = placed[0].sbx.create_snapshot()  # (carried to the sandbox's node: made there)
    # A create naming it is placed like any other: on another node its template is unknown
    # there; on the snapshot's node the sandbox is made without a slot, so it is killed and
    # refused, saying so. Either way no sandbox is handed out that no request could reach.
    with pytest.raises(SandboxException) as e:
        Sandbox.create(snap.snapshot_id)
    assert "snapshot" in str(e.value) or "template" in str(e.value), e.value
    assert {s.sandbox_id for s in Sandbox.list().next_items()} == before


def test_kill_reaches_the_sandboxs_node(placed: list[Placed]) -> None:
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException

    gone = placed[-1].sbx
    gone.kill()
    with pytest.raises(NotFoundException):
        Sandbox.connect(gone.sandbox_id)
    # The others are unaffected.
    assert Sandbox.connect(placed[0].sbx.sandbox_id).sandbox_id == placed[0].sbx.sandbox_id
