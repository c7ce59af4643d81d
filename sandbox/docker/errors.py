"""Docker's errors, translated into :mod:`sandbox.errors` here and nowhere else.

Idempotent daemon calls (inspect, create, start, info) are retried on what looks like a
daemon hiccup (a broken connection, a 5xx); a 4xx, and any command, never is.
"""

from __future__ import annotations

import docker.errors
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import RequestException
from requests.exceptions import Timeout as RequestsTimeout
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from ..errors import DaemonUnavailableError, ImageNotFoundError, SandboxUnavailableError

#: What :func:`translate` takes: everything the SDK (or requests, under it) raises. (A
#: read timeout is requests' own ``Timeout``, not a ``ConnectionError``: without the base
#: class here it reached the model as an internal error.)
SDK_ERRORS = (docker.errors.DockerException, RequestException)


def transient(exc: BaseException) -> bool:
    """Daemon hiccups worth retrying: connection errors and 5xx, never 4xx."""
    if isinstance(exc, RequestsConnectionError):
        return True
    if isinstance(exc, docker.errors.APIError):
        code = exc.status_code or 0
        return code >= 500 and "No such" not in str(exc)
    return False


retry_daemon = retry(
    retry=retry_if_exception(transient),
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=0.1, max=2.0),
    reraise=True,
)


def unanswered(what: str, detail: object) -> str:
    """The message of an engine that did not answer ``what`` in time."""
    return (
        f"{what}: the Docker daemon did not answer in time ({detail}); it may be overloaded "
        "(many sandboxes starting at once) — try again, or start fewer at once (LOOM_MAX_PARALLEL_STARTS)"
    )


def translate(exc: Exception, what: str) -> Exception:
    """The :mod:`sandbox.errors` exception for the SDK's ``exc`` raised while doing ``what``."""
    if isinstance(exc, docker.errors.ImageNotFound):
        return ImageNotFoundError(
            f"{what}: image not found ({exc.explanation}). The project's images (loom-sandbox:*, "
            "loom-agent-runtime:latest) are built by scripts/setup (step 3: images/base/build-base.sh, then "
            "`docker build` of images/sandbox and images/runtime); an image of your own must be on this engine "
            "(`docker build -t NAME .`, `docker load -i FILE`) or pulled from a registry the worker may use "
            "(LOOM_PULL, LOOM_REGISTRIES)"
        )
    if isinstance(exc, RequestsTimeout) and not isinstance(exc, RequestsConnectionError):
        # Never retried (transient() is False): the engine may have done what was asked
        # (a create, a start) and only its answer is late.
        return DaemonUnavailableError(unanswered(what, exc))
    if isinstance(exc, RequestException | docker.errors.DockerException) and not isinstance(
        exc, docker.errors.APIError
    ):
        return DaemonUnavailableError(f"{what}: the Docker daemon does not answer ({exc})")
    if isinstance(exc, docker.errors.APIError):
        return SandboxUnavailableError(f"{what}: {exc.explanation or exc}")
    return SandboxUnavailableError(f"{what}: {exc}")
