"""inspect_ai's own conformance suite against the shipped ``loom`` provider (issue 26).

The checks are imported from the installed inspect_ai (``self_check``, 44 in 0.3.285:
the test extra pins it), never copied, and run as inspect's own runner runs them: one
sandbox per configuration shared by every check, made and removed through the provider's
``task_init``/``sample_init``/``sample_cleanup``/``task_cleanup`` (found by its entry
point, as an eval finds it). Four configurations: runc and gVisor, each with the defaults
and with the documented opt-in for root (``allow_root``):

- with ``allow_root`` all 44 pass;
- with the defaults all pass but ``test_exec_as_user`` (inspect's ``adduser`` as root),
  which may only fail with inspect's ``SandboxUserUnsupportedError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from inspect_ai.util import SandboxEnvironment, SandboxUserUnsupportedError
from inspect_ai.util._sandbox import self_check
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv
from inspect_ai.util._sandbox.self_check import *  # noqa: F403  (the checks themselves)

from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import require_runtime

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]

CHECKS = [name for name in self_check.__all__ if name.startswith("test_")]


async def test_the_suite_is_the_installed_one() -> None:
    """All of inspect 0.3.285's checks are collected here (a newer inspect may add more)."""
    assert len(CHECKS) >= 44
    assert all(globals()[name] is getattr(self_check, name) for name in CHECKS)


@pytest_asyncio.fixture(
    scope="module",
    params=[("runc", False), ("runc", True), ("runsc", False), ("runsc", True)],
    ids=["runc-defaults", "runc-allow_root", "runsc-defaults", "runsc-allow_root"],
    loop_scope="module",
)
async def _provider_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    from tests.conftest import require_docker

    require_docker()
    runtime, allow_root = request.param
    require_runtime(runtime)
    provider = registry_find_sandboxenv("loom")  # through inspect's entry point, as an eval
    config = provider.config_deserialize(
        {
            "image": SANDBOX_IMAGE,
            "runtime": runtime,
            "allow_root": allow_root,
            "workspace_root": str(tmp_path_factory.mktemp("loom-inspect")),
        }
    )
    task = f"self_check_{runtime}_{'root' if allow_root else 'defaults'}"
    await provider.task_init(task, config)
    envs = await provider.sample_init(task, config, {"__sample_id__": "1"})
    env = envs["default"]
    try:
        yield env, allow_root
    finally:
        await provider.sample_cleanup(task, config, envs, False)
        await provider.task_cleanup(task, config, True)


@pytest_asyncio.fixture(loop_scope="module")
async def sandbox_env(request: pytest.FixtureRequest, _provider_env: Any) -> SandboxEnvironment:
    env, allow_root = _provider_env
    if request.node.originalname == "test_exec_as_user" and not allow_root:
        # The one expected failure with the defaults, and only this way.
        request.applymarker(pytest.mark.xfail(raises=SandboxUserUnsupportedError, strict=False))
    assert isinstance(env, SandboxEnvironment)
    return env
