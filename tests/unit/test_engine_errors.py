"""The engine's errors as the rest of the worker sees them (sandbox.docker.errors)."""

from __future__ import annotations

import docker.errors
import pytest
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import ReadTimeout

from sandbox.docker.engine import Engine
from sandbox.errors import DaemonUnavailableError, SandboxUnavailableError


async def test_an_engine_that_does_not_answer_in_time_is_the_daemons_failure_and_not_retried() -> None:
    calls = []

    def slow() -> None:
        calls.append(1)
        raise ReadTimeout("UnixHTTPConnectionPool(host='localhost', port=None): Read timed out. (read timeout=60)")

    engine = Engine(client_factory=object)
    with pytest.raises(DaemonUnavailableError, match="start sandbox: the Docker daemon did not answer in time"):
        await engine.call("start sandbox", slow)
    # Its answer is late, not lost: a create or start may have happened, so never again.
    assert calls == [1]
    await engine.aclose()


async def test_a_broken_connection_is_retried_then_the_daemons_failure() -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise RequestsConnectionError("Connection aborted.")

    engine = Engine(client_factory=object)
    with pytest.raises(DaemonUnavailableError, match="does not answer"):
        await engine.call("inspect sandbox", broken)
    assert len(calls) == 4
    await engine.aclose()


async def test_an_api_error_names_the_call() -> None:
    def refused() -> None:
        raise docker.errors.APIError("409 Client Error: Conflict", explanation="name in use")

    engine = Engine(client_factory=object)
    with pytest.raises(SandboxUnavailableError, match="create sandbox: name in use") as e:
        await engine.call("create sandbox", refused)
    assert not isinstance(e.value, DaemonUnavailableError)
    await engine.aclose()
