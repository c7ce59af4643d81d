"""What mypy checks of the Docker backend (nothing imports this module): its sandbox has
every capability of :mod:`sandbox.capabilities`, and the backend every optional part of
:class:`sandbox.base.SandboxBackend`'s (kept apart from :mod:`.backend`, which is long
enough)."""

from __future__ import annotations

from ..base import (
    ConfigurableBackend,
    CpuInventory,
    Freezer,
    ImageInventory,
    PullWatcher,
    RestartCounter,
    RuntimeInventory,
    StatusReporter,
)
from ..capabilities import BackgroundProcesses, HarnessFiles, StagedWrites, Terminals, Tunnels
from .backend import DockerBackend, DockerSandbox


def _capabilities(
    box: DockerSandbox, backend: DockerBackend
) -> tuple[
    StagedWrites,
    BackgroundProcesses,
    Terminals,
    Tunnels,
    HarnessFiles,
    ConfigurableBackend,
    RuntimeInventory,
    CpuInventory,
    ImageInventory,
    PullWatcher,
    Freezer,
    StatusReporter,
    RestartCounter,
]:
    # mypy: the sandbox's capabilities, and the backend's every optional one
    return box, box, box, box, box, backend, backend, backend, backend, backend, backend, backend, backend
