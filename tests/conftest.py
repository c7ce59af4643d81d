"""Shared fixtures.

Tiers: ``tests/unit`` (no Docker; the agent runs as a host subprocess through
``LocalProcessBackend``), ``tests/contract`` (the same suite on both backends),
``tests/docker`` / ``security`` / ``faults`` / ``e2e`` (real engine).

A Docker test skips with its reason when no daemon answers; ``REQUIRE_DOCKER=1`` (set by
CI) turns that skip into a failure so nothing can pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
# The CLI's local worker outlives the command that started it: tests that run the CLI
# get the in-process path unless they ask for the worker (tests/*/test_localworker*.py
# do, and stop what they started).
os.environ.setdefault("LOOM_CLI_DAEMON", "0")
# The CLI's per-user files (local workers' sockets, the `tools` cache) go to a run
# directory of this test session, never to the user's own.
_RUN_DIR = tempfile.mkdtemp(prefix="loom-test-run-")
#: The environment this session was started with, for a program that must outlive the
#: session (dockerd, restarted by a fault test: runc keeps its state under
#: XDG_RUNTIME_DIR, and the run directory is gone when the session ends).
ORIGINAL_ENV = dict(os.environ)
os.environ["XDG_RUNTIME_DIR"] = _RUN_DIR


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the engine's fork volumes (overlay forks) whose layers this session's
    temporary directories held: tmp_path goes, the engine's volumes would stay (every
    test that forks on ext4 as root makes them, the HTTP fuzzing too)."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or _docker_problem() is not None:
        return
    try:
        from tests.docker.fork_volumes import remove_fork_volumes

        remove_fork_volumes(factory.getbasetemp())
    except Exception:  # (the engine gone: nothing to do here)
        pass


_DOCKER_TIER = Path(__file__).parent / "docker"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``LOOM_TEST_ALONE=skip`` leaves out the docker tier's tests marked ``alone``, ``only``
    keeps only those of the docker tier (scripts/test runs the docker tier two at a time,
    then these with the one-at-a-time tiers). Unset: every test."""
    which = os.environ.get("LOOM_TEST_ALONE")
    if which not in ("skip", "only"):
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        docker_tier = item.path.is_relative_to(_DOCKER_TIER)
        alone = item.get_closest_marker("alone") is not None
        (drop if docker_tier and alone == (which == "skip") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``LOOM_TEST_FAILED_FILE`` set, each failed test's node id is appended to that file
    (by the controlling process under pytest-xdist): scripts/test runs the docker tier's
    failures again alone."""
    path = os.environ.get("LOOM_TEST_FAILED_FILE")
    if path and report.failed and os.environ.get("PYTEST_XDIST_WORKER") is None:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(report.nodeid + "\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the local workers the session started, and remove its run directory."""
    from tests.workers import stop_workers

    stop_workers(_RUN_DIR)
    shutil.rmtree(_RUN_DIR, ignore_errors=True)
    # The warm pools' directory (POOL_ROOT) is a shared mount
    # while the session runs: undone, so no later container copies it and it can go.
    pools = POOL_ROOT
    if pools.is_dir():
        from sandbox.docker.hostmounts import release_root

        try:
            release_root(pools)
        except OSError:
            pass
        else:
            shutil.rmtree(pools, ignore_errors=True)
    # and gVisor's slots beside it (PoolConfig.moved_root: its claims file, a slot a
    # failed test left), no mount of their own
    shutil.rmtree(POOL_ROOT.with_name(POOL_ROOT.name + "-runsc"), ignore_errors=True)


SANDBOX_IMAGE = os.environ.get("LOOM_TEST_IMAGE", "loom-sandbox:latest")
#: The small Debian image (python3, git, ripgrep): one of the contract suite's images.
MINIMAL_IMAGE = os.environ.get("LOOM_TEST_MINIMAL_IMAGE", "loom-sandbox:minimal")
REQUIRE_DOCKER = os.environ.get("REQUIRE_DOCKER") == "1"
#: Whose the suite's sandboxes are (``SandboxSpec.owner``, the ``dev.loom.owner`` label):
#: one id per run (scripts/test sets it), so that its closing ``gc --all`` removes this
#: run's leftovers and never another run's or another installation's sandboxes.
TEST_OWNER = os.environ.get("LOOM_TEST_OWNER") or f"loom-tests-{os.getpid()}"
#: The warm pools' directory of this test process (a shared mount while the session runs):
#: one per pytest-xdist worker (scripts/test runs the contract and unit tiers two at a
#: time), so no two processes set up or undo the same mount.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
POOL_ROOT = Path("/tmp/loom-test-pools") / (TEST_OWNER + (f"-{_XDIST_WORKER}" if _XDIST_WORKER else ""))


def _docker_problem() -> str | None:
    """Why Docker tests cannot run here, or None."""
    if shutil.which("docker") is None:
        return "docker CLI not installed"
    try:
        r = subprocess.run(["docker", "image", "inspect", SANDBOX_IMAGE], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker did not answer: {e}"
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip()
        if "No such image" in err:
            return f"sandbox image {SANDBOX_IMAGE} not built (run scripts/setup)"
        return f"docker daemon not available: {err[:200]}"
    return None


_PROBLEM: str | None = None
_PROBED = False


def sandboxes_under(root: Path) -> list[str]:
    """The names of loom's sandboxes (running or not) whose workspace is under ``root``."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            "label=dev.loom.worker=1",
            "--format",
            '{{.Names}} {{.Label "dev.loom.workspace"}}',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p[0] for p in (line.split() for line in out.splitlines()) if len(p) == 2 and p[1].startswith(str(root))]


def require_docker() -> None:
    """Skip (or, under REQUIRE_DOCKER=1, fail) when the engine or image is missing."""
    global _PROBLEM, _PROBED
    if not _PROBED:
        _PROBLEM = _docker_problem()
        _PROBED = True
    if _PROBLEM:
        if REQUIRE_DOCKER:
            pytest.fail(f"REQUIRE_DOCKER=1 but {_PROBLEM}")
        pytest.skip(_PROBLEM)


#: The browser the dashboard's tests drive (Debian's chromium; scripts/setup installs it).
CHROMIUM = os.environ.get("LOOM_TEST_CHROMIUM", "/usr/bin/chromium")


def require_chromium() -> None:
    """Skip a browser test without Playwright or chromium; under REQUIRE_DOCKER=1 (CI)
    that is a failure, as for the Docker tests."""
    problem = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problem = "playwright is not installed (pip install -e '.[test]')"
    if problem is None and not os.access(CHROMIUM, os.X_OK):
        problem = f"{CHROMIUM} is not installed (scripts/setup installs Debian's chromium)"
    if problem:
        if REQUIRE_DOCKER:
            pytest.fail(f"REQUIRE_DOCKER=1 but {problem}")
        pytest.skip(problem)


def gvisor_available() -> bool:
    try:
        r = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b'"runsc"' in r.stdout


@pytest.fixture(autouse=True)
def _logging_configuration() -> Iterator[None]:
    """Each test starts with the logging configuration the session had: a command run
    in-process (``worker.cli.main``) configures structlog and the root logger for the
    whole process, at the CLI's quiet level, which would hide info events from a later
    test's ``capture_logs``."""
    import logging

    import structlog

    configured, saved = structlog.is_configured(), structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        if configured:
            structlog.configure(**saved)
        else:  # unconfigured, as a library's user has it (sandbox.logs then uses stdlib logging)
            structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A fresh empty workspace directory (real path, no symlinks in it)."""
    d = Path(tempfile.mkdtemp(prefix="loom-ws-")).resolve()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def local_backend() -> AsyncIterator[object]:
    from sandbox.local import LocalProcessBackend

    backend = LocalProcessBackend()
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.fixture(scope="session")
def docker_ready() -> None:
    require_docker()


@pytest.fixture
async def docker_backend(docker_ready: None) -> AsyncIterator[object]:
    """A DockerBackend whose containers are removed when the test ends."""
    from sandbox.docker import DockerBackend
    from sandbox.spec import SandboxSpec

    backend = DockerBackend(SandboxSpec(image=SANDBOX_IMAGE, owner=TEST_OWNER), worker_id="test")
    try:
        yield backend
    finally:
        await backend.remove_all_started()
        await backend.aclose()
