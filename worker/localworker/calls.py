"""How a ``loom-worker call`` (or one ``batch`` line) runs against a registry.

The same code runs in the CLI's own process (the fallback, ``LOOM_CLI_DAEMON=0``) and in
its local worker, so both paths give the same result and exit code by construction; the
result leaves either one as ``ToolResult.to_dict()`` and is printed by the CLI with the
same :func:`~worker.result.json_line`.

Every change a call makes is recorded in its workspace's changelog under
``settings.data_dir`` before it happens, so ``loom-worker undo`` can revert it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from sandbox.base import ExecControl

from ..registry import ToolRegistry, default_registry
from ..settings import Settings
from ..streaming import ToolOutput
from ..tool import Tool, ToolError


class Changelogs:
    """One open changelog per workspace (under ``data_dir``), so CLI calls are recorded
    and can be undone with ``loom-worker undo``."""

    def __init__(self, data_dir: Path, limits: Any = None) -> None:
        self.data_dir = data_dir
        self.limits: Any = limits
        self._open: dict[Path, Any] = {}
        self._opening = threading.Lock()  # (the registry opens a workspace's in a thread)

    def recorder(self, root: Path) -> Any:
        """Raises ChangelogStorageError when the store cannot be opened."""
        from ..changelog import Changelog

        with self._opening:
            if root not in self._open:
                self._open[root] = Changelog.open(self.data_dir, root, limits=self.limits)
            return self._open[root]

    async def aclose(self) -> None:
        for cl in self._open.values():
            await cl.aclose()
        self._open.clear()


class Calls:
    """The registry CLI calls run in: the Docker backend with the changelog and the tool
    catalog (``default_registry``), or the test-only local backend (no isolation)."""

    def __init__(self, settings: Settings, backend: str = "docker") -> None:
        self.settings = settings
        self.backend = backend
        self.changelogs = Changelogs(settings.data_dir, settings.changelog_limits())
        self.registry: ToolRegistry
        if backend == "local":
            from sandbox.local import LocalProcessBackend

            self.registry = ToolRegistry(backend=LocalProcessBackend(), recorder_factory=self.changelogs.recorder)
        else:
            self.registry = default_registry(settings=settings, recorder_factory=self.changelogs.recorder)

    async def execute(
        self,
        tool: str,
        arguments: Any,
        workspace: str,
        call_id: str | None,
        *,
        check_unknown: bool = True,
    ) -> tuple[int, dict[str, Any]]:
        """Run one call; returns the exit code and the result as a dict. The exit code is
        0 when the tool succeeded, 1 when it failed, and 2 (a usage error), with
        ``check_unknown``, for a tool this registry does not have or arguments that do not
        validate against the tool's schema (the result names the field, as the model sees
        it). Never raises but on cancellation."""
        result = await self.registry.execute(tool, arguments, workspace, call_id=call_id)
        if check_unknown and not result.success:
            found = self.registry.get(tool)
            if found is None or not _valid(found, arguments):
                return 2, result.to_dict()
        return (0 if result.success else 1), result.to_dict()

    async def exec(
        self,
        workspace: str,
        command: str,
        *,
        timeout: Any,
        cwd: str,
        call_id: str | None,
        on_output: Callable[[ToolOutput], Awaitable[None]],
        control: ExecControl | None = None,
        harness: dict[str, Any] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """``loom-worker exec``: ``command`` as ``shell_execute`` runs it (recorded in the
        changelog like any call), its output handed to ``on_output`` as it comes; returns
        the exit code (:func:`exec_exit_code`) and the result as a dict. With ``harness``
        (``env``, ``user``, ``stdin`` as base64; an absolute ``cwd``) it runs through the
        harness API instead (:mod:`.harness_exec`). Never raises but on cancellation."""
        result = None
        if harness is not None:
            from .harness_exec import harness_stream

            stream = harness_stream(self.registry, workspace, command, timeout, cwd, call_id, harness, control)
        else:
            arguments = {"command": command, "timeout": timeout, "cwd": cwd}
            stream = self.registry.execute_stream(
                "shell_execute", arguments, workspace, call_id=call_id, control=control
            )
        async for item in stream:
            if isinstance(item, ToolOutput):
                await on_output(item)
            else:
                result = item
        assert result is not None
        done = result.to_dict()
        return exec_exit_code(done), done

    async def aclose(self) -> None:
        try:
            await self.registry.aclose()
        finally:
            await self.changelogs.aclose()


#: ``loom-worker exec``'s exit codes beyond the command's own, as ``timeout(1)`` and
#: ``docker`` use them.
EXIT_TIMEOUT = 124
EXIT_INFRASTRUCTURE = 125
EXIT_REFUSED = 126
EXIT_KILLED = 137
EXIT_USAGE = 2


def exec_exit_code(result: dict[str, Any]) -> int:
    """The exit code of ``loom-worker exec`` for ``shell_execute``'s result: the command's
    own; 124 when it timed out; 128+N when a signal N ended it; 137 when it was killed for
    a limit (memory, output, disk); 125 when loom-worker or its sandbox failed
    (infrastructure); 126 when the command was refused by policy; 2 for a usage error
    (bad arguments: a timeout out of range, a working directory that is not there)."""
    data = result.get("data") or {}
    outcome = data.get("outcome")
    if result.get("success"):
        return 0
    if outcome == "exit":
        code = data.get("exit_code")
        return code if isinstance(code, int) and 0 <= code <= 255 else 1
    if outcome == "timeout":
        return EXIT_TIMEOUT
    if outcome == "signal":
        sig = data.get("signal")
        return 128 + sig if isinstance(sig, int) and 0 < sig < 128 else EXIT_KILLED
    if outcome in ("oom", "output_limit", "disk_limit"):
        return EXIT_KILLED
    if data.get("error_kind") in ("infrastructure", "internal"):
        return EXIT_INFRASTRUCTURE
    if str(result.get("error") or "").startswith("Safety violation"):
        return EXIT_REFUSED
    return EXIT_USAGE


def _valid(tool: Tool, arguments: Any) -> bool:
    """Whether ``arguments`` (an object, as ``--args`` gives them) pass ``tool``'s schema."""
    if isinstance(arguments, str):  # (as the registry takes them: OpenAI's format)
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return False
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return False
    try:
        tool.validate(dict(arguments))
    except ToolError:
        return False
    return True
