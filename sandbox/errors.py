"""The sandbox error tree.

::

    SandboxError                       base of everything this package raises
    ├── SandboxUnavailableError        infrastructure: the box cannot be used right now
    │   ├── DaemonUnavailableError     the Docker daemon does not answer
    │   ├── ImageNotFoundError         the sandbox image is not built   (also LookupError)
    │   │   └── ImagePullError         it could not be pulled: ``reason`` says why
    │   ├── ImageUnusableError         the image cannot be a sandbox (no /bin/sh)
    │   ├── RuntimeUnavailableError    runsc requested but not in effect (fail closed)
    │   └── SandboxLostError           the agent or container died / stopped answering mid-call
    ├── SandboxTimeoutError            the host-side deadline passed     (also TimeoutError)
    ├── ProtocolError                  the agent sent something malformed (untrusted input)
    ├── TunnelClosedError              a tunnel to a sandbox port has ended (also ConnectionResetError)
    └── AgentError                     the agent refused a request; ``code`` says why
        ├── PathNotFoundError          (also FileNotFoundError)
        ├── PathEscapeError            the path leaves /workspace or crosses a refused link
        │                              (also PermissionError)
        ├── NotAFileError              a directory, FIFO, socket or device where a file is needed
        │   └── IsADirError            a directory                      (also IsADirectoryError)
        ├── NotADirError               (also NotADirectoryError)
        ├── PermissionDeniedError      the sandbox's user may not      (also PermissionError)
        ├── InWorkspaceError           a harness's write that belongs to the workspace (its
        │                              changelog): the message is the workspace-relative path
        ├── UserUnsupportedError       ``exec(user=...)`` this sandbox's settings do not allow
        ├── ConflictError              a precondition (expected content hash) did not hold
        ├── TooLargeError              a size cap was hit
        ├── InvalidPatternError        a search regex that does not compile (also ValueError)
        └── KernelUnavailableError     the image cannot run a code context's kernel: ``missing``
                                       names what it lacks, the message how to add it

Foreign errors (docker SDK, OS, JSON) are translated into this tree once, where they are
caught (``sandbox.docker`` and ``sandbox.connection``); nothing above this package ever
sees a ``docker.errors`` type.

Which channel an error belongs to: ``AgentError`` subclasses are the *model's* problem (a
bad path, a missing file) and become ``success=false`` tool results; the
``SandboxUnavailableError`` family and ``ProtocolError`` are infrastructure failures.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every error raised by the ``sandbox`` package."""


class SandboxUnavailableError(SandboxError):
    """The sandbox cannot be used right now (infrastructure, not the model's fault)."""


class DaemonUnavailableError(SandboxUnavailableError):
    """The Docker daemon did not answer."""


class ImageNotFoundError(SandboxUnavailableError, LookupError):
    """The configured sandbox image does not exist on the engine."""


class ImagePullError(ImageNotFoundError):
    """The image is not on the engine and could not be pulled. ``reason``: ``not_found``,
    ``unauthorized``, ``not_allowed`` (its registry is not one the operator allows),
    ``unreachable``, ``invalid`` (not an image name) or ``failed``; ``registry`` is where
    it would come from (``docker.io`` for a name without one)."""

    def __init__(self, message: str, *, image: str, registry: str, reason: str) -> None:
        super().__init__(message)
        self.image = image
        self.registry = registry
        self.reason = reason


class ImageUnusableError(SandboxUnavailableError):
    """The image exists but cannot be a sandbox (it has no ``/bin/sh``, for one)."""


class RuntimeUnavailableError(SandboxUnavailableError):
    """The requested OCI runtime (gVisor ``runsc``) is not registered or not in effect."""


class SandboxLostError(SandboxUnavailableError):
    """The in-container agent or the container itself went away during a call."""


class SandboxTimeoutError(SandboxError, TimeoutError):
    """The host-side deadline for one request passed without an answer."""


class ProtocolError(SandboxError):
    """The agent's answer was malformed or violated the protocol's limits."""


class TunnelClosedError(SandboxError, ConnectionResetError):
    """A write to a tunnel (:mod:`sandbox.tunnel`) that has ended: the server closed it,
    it was reset, or the sandbox was lost."""


class AgentError(SandboxError):
    """The agent refused a request. ``code`` is the machine-readable reason."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class PathNotFoundError(AgentError, FileNotFoundError):
    """Nothing is at the path (also a ``FileNotFoundError``)."""

    code = "not_found"


class PathEscapeError(AgentError, PermissionError):
    """The path leaves ``/workspace`` or crosses a refused link (also a ``PermissionError``)."""

    code = "escape"


class NotAFileError(AgentError):
    """A directory, FIFO, socket or device where a regular file is needed."""

    code = "not_a_file"


class IsADirError(NotAFileError, IsADirectoryError):
    """A directory where a regular file is needed (also an ``IsADirectoryError``)."""

    code = "is_a_directory"


class PermissionDeniedError(AgentError, PermissionError):
    """The sandbox's user may not do this (a 0444 file, another user's directory, a
    read-only file system), as its shell would be refused (also a ``PermissionError``)."""

    code = "permission"


class InWorkspaceError(AgentError):
    """A write through the sandbox's file API (:meth:`~sandbox.capabilities.HarnessFiles.write_path`)
    whose target is in the workspace: it was not made, so that the caller makes it through
    the workspace's changelog. The message is the workspace-relative path."""

    code = "in_workspace"


class UserUnsupportedError(AgentError):
    """A command asked to run as a user this sandbox may not switch to (root, unless the
    workspace allows it; any user on a backend without users)."""

    code = "user_unsupported"


class NotADirError(AgentError, NotADirectoryError):
    """Something other than a directory where one is needed (also a ``NotADirectoryError``)."""

    code = "not_a_directory"


class ConflictError(AgentError):
    """A precondition did not hold (the expected content hash, an absent path)."""

    code = "conflict"


class TooLargeError(AgentError):
    """A size cap was hit."""

    code = "too_large"


class InvalidPatternError(AgentError, ValueError):
    """A search regex that does not compile (also a ``ValueError``)."""

    code = "invalid_pattern"


class KernelUnavailableError(AgentError):
    """The sandbox's image cannot run a code context's kernel (no python3, or one without
    ipykernel and jupyter_client; a kernel that would not start). ``missing`` names the
    modules it lacks; the message says how to add them."""

    code = "kernel_unavailable"

    def __init__(self, message: str, *, missing: list[str] | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.missing = list(missing or [])


_BY_CODE: dict[str, type[AgentError]] = {
    cls.code: cls
    for cls in (
        PathNotFoundError,
        PathEscapeError,
        NotAFileError,
        IsADirError,
        PermissionDeniedError,
        InWorkspaceError,
        UserUnsupportedError,
        NotADirError,
        ConflictError,
        TooLargeError,
        InvalidPatternError,
    )
}


def agent_error(code: str, message: str) -> AgentError:
    """Build the ``AgentError`` subclass matching an agent's error ``code``."""
    cls = _BY_CODE.get(code, AgentError)
    return cls(message, code=code)
