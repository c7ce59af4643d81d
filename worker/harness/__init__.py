"""The harness API (issue 26): a workspace's sandbox as an evaluation harness drives it,
beside the model's workspace-scoped tools. See :mod:`worker.harness.handle`."""

from .handle import SandboxHandle
from .results import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_READ,
    DEFAULT_TIMEOUT,
    MAX_OUTPUT,
    MAX_READ,
    MAX_STDIN,
    MAX_TIMEOUT,
    MAX_WRITE,
    ExecOutput,
    FileWritten,
)

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_MAX_READ",
    "DEFAULT_TIMEOUT",
    "MAX_OUTPUT",
    "MAX_READ",
    "MAX_STDIN",
    "MAX_TIMEOUT",
    "MAX_WRITE",
    "ExecOutput",
    "FileWritten",
    "SandboxHandle",
]
