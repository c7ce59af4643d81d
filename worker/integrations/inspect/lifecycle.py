"""The ``loom`` sandboxes' lifecycle: one registry per process, a workspace per sample and
service, and their removal, whatever ends the sample.

- **One registry** (``default_registry()``, configured by the ``LOOM_*`` environment like
  every entry point) serves every task of the process and its event loop; it is opened
  at the first task and closed when the last task of that loop has cleaned up.
- **A workspace per sample and service**: a fresh directory (``<workspace_root>/<task>-
  <sample>-<service>-<random>``, owned by the sandbox's user, mode 0755) with its own
  sandbox settings, unless the config names a fixed one (kept, files and all).
- **Removal**: ``sample_cleanup`` stops each sandbox (its container removed, its
  processes with it) and deletes the fresh workspace and its changelog; ``task_cleanup``
  does the same for any the task left (a sample whose cleanup never ran); at interpreter
  exit (Ctrl-C that ended the loop first) the containers still recorded here are removed
  with a fresh engine connection; ``inspect sandbox cleanup loom`` removes those of every
  process. Whatever escapes all of these still ends at the sandbox's idle TTL.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from sandbox.logs import get_logger

from .config import LoomSandboxConfig

if TYPE_CHECKING:
    from ...registry import ToolRegistry

log = get_logger("worker.integrations.inspect")

#: Where fresh workspaces are made when the config does not say.
DEFAULT_ROOT = Path(tempfile.gettempdir()) / "loom-inspect"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class Made:
    """A workspace this process made (or took, when fixed) for a sample."""

    path: Path
    task: str
    fresh: bool  # made for the sample: removed with it unless kept
    keep: bool


@dataclass
class Shared:
    """What the samples of one event loop share."""

    registry: ToolRegistry
    loop: asyncio.AbstractEventLoop
    tasks: set[str] = field(default_factory=set)
    made: dict[Path, Made] = field(default_factory=dict)


_shared: Shared | None = None
#: Every workspace made and not yet removed, in any loop: what the exit hook removes.
_outstanding: dict[Path, Made] = {}
_hooked = False


async def shared() -> Shared:
    """The registry of this event loop (opened on first use)."""
    global _shared, _hooked
    loop = asyncio.get_running_loop()
    if _shared is not None and _shared.loop is loop:
        return _shared
    from ...registry import default_registry

    # catalog=False: the tool catalog (tool_search, MCP servers) is the model's, not a harness's.
    _shared = Shared(default_registry(catalog=False), loop)
    if not _hooked:
        atexit.register(_at_exit)
        _hooked = True
    return _shared


async def task_started(task: str) -> None:
    (await shared()).tasks.add(task)


async def task_done(task: str, cleanup: bool) -> None:
    """The task's end: its workspaces left behind are removed (``cleanup``: else kept,
    as ``--no-sandbox-cleanup`` asks), and the registry closed after the last task."""
    global _shared
    state = _shared
    if state is None or state.loop is not asyncio.get_running_loop():
        return
    if cleanup:
        for made in [m for m in state.made.values() if m.task == task]:
            await release(made.path)
    state.tasks.discard(task)
    if not state.tasks:
        _shared = None
        with anyio.CancelScope(shield=True):
            await state.registry.aclose()


def workspace_for(cfg: LoomSandboxConfig, fixed: str | None, task: str, sample: object, service: str) -> Made:
    """The workspace directory of one service of a sample: the fixed one, or a fresh one.
    Raises OSError (the root cannot be made, the owner cannot be set)."""
    if fixed is not None:
        path = Path(fixed).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return Made(path, task, fresh=False, keep=True)
    root = Path(cfg.workspace_root).expanduser() if cfg.workspace_root else DEFAULT_ROOT
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = "-".join(_SAFE.sub("_", str(part))[:40] for part in (task, sample, service))
    path = (root / f"{name}-{secrets.token_hex(4)}").resolve()
    path.mkdir(mode=0o755)
    uid, gid = cfg.owner()
    if (uid, gid) != (os.getuid(), os.getgid()):
        os.chown(path, uid, gid)
    os.chmod(path, 0o755)  # (the umask): users of the image other than its owner may enter it
    return Made(path, task, fresh=True, keep=cfg.keep_workspace)


def track(made: Made) -> None:
    assert _shared is not None
    _shared.made[made.path] = made
    _outstanding[made.path] = made


async def release(path: Path) -> None:
    """Stop ``path``'s sandbox (its container and every process in it) and, for a fresh
    workspace not kept, delete it and what the worker kept of it (changelog, settings,
    call journal). Never raises: a cleanup that fails is logged, and the sandbox still
    ends at its idle TTL."""
    # Shielded: a sample that is being cancelled (Ctrl-C, a failed task) must still lose
    # its sandbox, and anyio cancels every await of a cancelled scope.
    with anyio.CancelScope(shield=True):
        state = _shared
        made = _outstanding.get(path)
        try:
            if state is not None:
                await state.registry.stop(path)
        except Exception as e:  # cleanup must go on (the daemon may be gone)
            log.warning("inspect.cleanup_failed", workspace=str(path), error=repr(e))
        if made is not None and made.fresh and not made.keep:
            await asyncio.to_thread(_remove, path, state.registry if state is not None else None)
        # Forgotten last: until here the exit hook still knows it.
        _outstanding.pop(path, None)
        if state is not None:
            state.made.pop(path, None)


def _remove(path: Path, registry: ToolRegistry | None) -> None:
    shutil.rmtree(path, ignore_errors=True)
    configs = registry.configs if registry is not None else None
    if configs is not None:
        from ...changelog.recorder import workspace_dir

        shutil.rmtree(workspace_dir(configs.store.data_dir, path), ignore_errors=True)


def _at_exit() -> None:
    """Interpreter exit with workspaces still recorded (the loop ended before their
    cleanup, as a second Ctrl-C does): remove their containers now."""
    left = list(_outstanding.values())
    if not left:
        return
    _outstanding.clear()

    async def stop_all() -> None:
        from ...registry import default_registry

        async with default_registry(catalog=False) as registry:
            for made in left:
                try:
                    await registry.stop(made.path)
                except Exception as e:
                    log.warning("inspect.exit_cleanup_failed", workspace=str(made.path), error=repr(e))
                if made.fresh and not made.keep:
                    _remove(made.path, registry)

    try:
        asyncio.run(stop_all())
    except Exception as e:
        log.warning("inspect.exit_cleanup_failed", error=repr(e))


async def cli_cleanup(sandbox_id: str | None) -> list[str]:
    """``inspect sandbox cleanup loom [ID]``: remove the sandboxes of the provider's
    workspaces (under :data:`DEFAULT_ROOT`, or the one ID names: a container name or a
    workspace path) and those fresh workspaces. Returns the containers removed. Raises
    the engine's errors (DaemonUnavailableError)."""
    from sandbox.docker import DockerBackend

    removed = []
    backend = DockerBackend()
    try:
        for item in await backend.list_sandboxes():
            ws = item.get("workspace") or ""
            if sandbox_id is not None:
                if sandbox_id not in (item["name"], ws):
                    continue
            elif not ws.startswith(str(DEFAULT_ROOT) + "/"):
                continue
            await backend.stop(Path(ws))
            removed.append(item["name"])
            if ws.startswith(str(DEFAULT_ROOT) + "/"):
                await asyncio.to_thread(shutil.rmtree, ws, True)
    finally:
        await backend.aclose()
    return removed
