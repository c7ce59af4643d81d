"""``LoomSandboxEnvironment``: inspect_ai's ``SandboxEnvironment`` on loom-worker.

Each inspect call is one call of the harness API (:class:`worker.harness.SandboxHandle`):

====================================  =============================================================
inspect                               loom-worker
====================================  =============================================================
``sample_init``                       a workspace per service, its settings, ``files`` copied in,
                                      its sandbox started (:mod:`.lifecycle`)
``exec(cmd, input, cwd, env, user,    ``handle.exec``: argv as it is, stdin bytes, any cwd,
timeout)``                            env, user (root with ``allow_root``); changes in the
                                      workspace recorded in its changelog
``write_file`` / ``read_file``        ``handle.write_file`` / ``read_file``: any path the
                                      sandbox's user may use, bytes exactly
``sample_cleanup``, ``task_cleanup``  sandboxes stopped, fresh workspaces deleted
``cli_cleanup``                       the provider's leftover sandboxes removed
``connection``                        ``loom-worker exec -i --workspace DIR -- bash``
====================================  =============================================================

Errors as inspect names them: ``TimeoutError`` (the command's whole tree was killed at
its timeout), ``PermissionError``, ``FileNotFoundError``, ``IsADirectoryError``,
``OutputLimitExceededError`` (a stream beyond ``SandboxEnvironmentLimits``, a file beyond
the read limit), ``SandboxUserUnsupportedError`` (root without ``allow_root``),
``SandboxUnavailableError`` (the sandbox cannot be used: infrastructure).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Literal, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from inspect_ai.util._sandbox.environment import SandboxUnavailableError as InspectUnavailableError
from pydantic import BaseModel

from sandbox.errors import (
    ProtocolError,
    SandboxTimeoutError,
    SandboxUnavailableError,
    TooLargeError,
    UserUnsupportedError,
)

from ...changelog.errors import ChangelogStorageError
from ...harness import MAX_OUTPUT, ExecOutput, SandboxHandle
from . import lifecycle
from .config import load

_INFRASTRUCTURE = (SandboxUnavailableError, SandboxTimeoutError, ProtocolError, ChangelogStorageError)


@sandboxenv(name="loom")
class LoomSandboxEnvironment(SandboxEnvironment):
    """One sandbox of a sample: a loom-worker workspace and its hardened container."""

    def __init__(self, handle: SandboxHandle, workspace: Path, service: str) -> None:
        super().__init__()
        self.handle = handle
        self.workspace = workspace
        self.service = service

    # -- configuration ----------------------------------------------------------------

    @classmethod
    def config_files(cls) -> list[str]:
        return ["loom.yaml", "loom.yml"]

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return load(config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        import os

        return 2 * (os.cpu_count() or 1)

    # -- lifecycle --------------------------------------------------------------------

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        load(config)  # a bad config fails the task before any sample
        await lifecycle.task_started(task_name)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        cfg = load(config)
        state = await lifecycle.shared()
        state.tasks.add(task_name)
        envs: dict[str, SandboxEnvironment] = {}
        made_here: list[Path] = []
        sample = metadata.get("__sample_id__", "sample")
        try:
            for name, svc in cfg.service_items():
                made = lifecycle.workspace_for(cfg, svc.workspace, task_name, sample, name)
                lifecycle.track(made)
                made_here.append(made.path)
                settings = svc.settings()
                if settings:
                    await state.registry.configure_workspace(made.path, settings)
                handle = state.registry.sandbox(made.path)
                for dest, src in svc.files.items():
                    await handle.write_file(dest, Path(src).expanduser().read_bytes())
                # Started now: a sandbox that cannot start fails the sample's init, not
                # its first command, and that command does not wait for it.
                await (await state.registry.workspace(made.path)).sandbox.info()
                envs[name] = cls(handle, made.path, name)
        except BaseException:
            for path in made_here:  # nothing of a sample that could not start is left
                await lifecycle.release(path)
            raise
        return envs

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            await lifecycle.release(env.as_type(cls).workspace)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        await lifecycle.task_done(task_name, cleanup)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        removed = await lifecycle.cli_cleanup(id)
        print(f"Removed {len(removed)} loom sandbox(es)" + (f": {', '.join(removed)}" if removed else ""))

    # -- calls ------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        try:
            out = await self.handle.exec(
                cmd,
                input=input,
                cwd=cwd,
                env=env,
                user=user,
                timeout=timeout,
                max_output=min(limit, MAX_OUTPUT),
            )
        except UserUnsupportedError as e:
            raise SandboxUserUnsupportedError(str(e)) from e
        except _INFRASTRUCTURE as e:
            raise InspectUnavailableError(f"The loom sandbox cannot execute: {e}") from e
        return _result(out, timeout)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        try:
            await self.handle.write_file(file, contents)
        except _INFRASTRUCTURE as e:
            raise InspectUnavailableError(f"The loom sandbox cannot write {file}: {e}") from e

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        try:
            data = await self.handle.read_file(file, max_bytes=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE)
        except TooLargeError as e:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None) from e
        except _INFRASTRUCTURE as e:
            raise InspectUnavailableError(f"The loom sandbox cannot read {file}: {e}") from e
        return data.decode("utf-8") if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        command = ["loom-worker", "exec", "-i", "--workspace", str(self.workspace)]
        if user is not None:
            command += ["--user", user]
        return SandboxConnection(type="loom", command=shlex.join([*command, "--", "bash"]))

    def default_polling_interval(self) -> float:
        return 0.2


def _result(out: ExecOutput, timeout: int | None) -> ExecResult[str]:
    """``out`` as inspect's ExecResult, or the error inspect expects. Raises TimeoutError,
    PermissionError (the program could not be run), OutputLimitExceededError."""
    stdout = out.stdout.decode("utf-8", "replace")
    stderr = out.stderr.decode("utf-8", "replace")
    if out.outcome == "timeout":
        err = TimeoutError(f"Command timed out after {timeout} seconds")
        if stdout or stderr:
            err.truncated_output = stdout + stderr  # type: ignore[attr-defined]  # as inspect's docker sets it
        raise err
    if out.launch_error == "permission":
        raise PermissionError(f"Permission denied executing command: {stderr.strip()}")
    if out.truncated or out.outcome == "output_limit":
        raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, stdout + stderr)
    if out.returncode is not None:
        code = out.returncode
    elif out.signal is not None:
        code = 128 + out.signal  # as a shell reports a command a signal ended
    else:
        code = 137  # killed for a limit (memory, disk)
    return ExecResult(success=code == 0, returncode=code, stdout=stdout, stderr=stderr)
