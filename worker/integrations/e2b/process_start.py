"""``Start``'s request made into a running process: who runs it, where, for how long.

- **User** (``Authorization: Basic``): none or ``user`` is E2B's sandbox user, the
  workspace's owner (a :class:`~.process_runners.BackgroundRunner`); another user of the
  image (``root``, where the workspace allows it) an :class:`~.process_runners.ExecRunner`;
  a user the image does not have ``unauthenticated`` (envd's "invalid username"), root
  where the workspace does not allow it ``permission_denied``.
- **Working directory**: ``cwd``, absolute or relative to the user's home (``~``
  expanded), default the home; E2B's home ``/home/user`` is the workspace
  (:func:`.target.to_loom`). One that does not exist is ``invalid_argument``, before
  anything runs, as envd answers.
- **Time limit**: the request's ``Connect-Timeout-Ms`` (E2B's ``timeout``), else none;
  loom's longest (``BackgroundLimits.max_timeout``) caps it.
- The command passes loom's command policy (``permission_denied`` otherwise).
"""

from __future__ import annotations

import posixpath
import shlex

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_pb as pb

from sandbox.capabilities import harness_files
from sandbox.errors import IsADirError, NotADirError, PathNotFoundError, PermissionDeniedError, UserUnsupportedError
from sandbox.harness import HarnessMixin
from sandbox.results import ExecResult

from ...background import BackgroundLimits
from ...policy.shell import check_command
from ...workspace import Workspace
from .process_runners import BackgroundRunner, ExecRunner, Runner
from .process_table import Proc
from .target import E2B_HOME, LOOM_MOUNT, Target, to_loom

#: E2B's name of the sandbox's user (the workspace's owner here).
E2B_USER = "user"
#: Largest terminal loom makes (cols and rows).
MAX_PTY = 1000


async def start_process(t: Target, request: pb.StartRequest, *, user: str | None, timeout_ms: int | None) -> Proc:
    """Start what ``request`` asks in ``t``'s sandbox as ``user`` (None: the sandbox's
    user) for ``timeout_ms`` at most (None: no limit but loom's); its :class:`Proc`, pid
    not yet given (:meth:`SandboxProcs.add <.process_table.SandboxProcs.add>`).

    Raises ConnectError (``invalid_argument``: no command, a cwd that does not exist, a
    terminal size out of range; ``unauthenticated``, ``permission_denied``: the user;
    ``unimplemented``: stdin or a PTY for another user), PolicyError, AgentError
    (``limit``: too many processes), the infrastructure errors of ``sandbox.errors``."""
    cfg = request.process if request.process is not None else pb.ProcessConfig()
    if not cfg.cmd:
        raise ConnectError(Code.INVALID_ARGUMENT, "no command: ProcessConfig.cmd is empty")
    argv = [cfg.cmd, *cfg.args]
    check_command(shlex.join(argv))
    tag = request.tag if request.has_field("tag") else None
    # (envd: a request without the field has stdin, for older SDKs)
    stdin = request.stdin if request.has_field("stdin") else True
    pty = _pty_size(request)
    ws = await t.workspace()
    limits = ws.background.limits if ws.background is not None else BackgroundLimits()
    asked = timeout_ms / 1000.0 if timeout_ms else None
    limit = min(asked, limits.max_timeout) if asked is not None else limits.max_timeout
    env = dict(cfg.envs)
    runner: Runner
    other = await _other_user(ws, user)
    if other is None:
        where = _cwd(cfg, E2B_HOME)
        cwd, outside = await _workspace_cwd(ws, where)
        if outside is None and (where == E2B_HOME or where.startswith(E2B_HOME + "/")):
            if await _home_mounted(t):
                # The workspace is mounted at /home/user too: the command starts there, so
                # `pwd` says what E2B's say (the changes are the workspace's all the same).
                if where != E2B_HOME:
                    await _dir_there(ws, to_loom(where), where)
                cwd, outside = ".", where
        try:
            runner = await BackgroundRunner.start(
                ws, argv, cwd=cwd, outside=outside, env=env, stdin=stdin, pty=pty, limit=limit
            )
        except (PathNotFoundError, NotADirError):
            raise _no_cwd(where) from None
    else:
        if pty is not None or (stdin and request.has_field("stdin")):
            raise ConnectError(
                Code.UNIMPLEMENTED,
                f"loom runs the commands of user {other!r} without {'a PTY' if pty else 'stdin'}: "
                f"run it as user {E2B_USER!r}, or without {'a PTY' if pty else 'stdin=True'}",
            )
        where = _cwd(cfg, "/root" if other == "root" else "/")
        loom_cwd = to_loom(where)
        await _check_dir(ws, loom_cwd, where)
        runner = ExecRunner(t.handle, argv, cwd=loom_cwd, env=env, user=other, limit=limit)
    return Proc(0, cfg, tag, pty is not None, runner, asked_limit=asked is not None and asked <= limits.max_timeout)


def _pty_size(request: pb.StartRequest) -> tuple[int, int] | None:
    """(cols, rows) of the terminal asked for. Raises ConnectError (``invalid_argument``)."""
    if not request.has_field("pty") or request.pty is None:
        return None
    size = request.pty.size or pb.PTY.Size()
    if not (1 <= size.cols <= MAX_PTY and 1 <= size.rows <= MAX_PTY):
        raise ConnectError(
            Code.INVALID_ARGUMENT, f"a PTY's cols and rows must be 1-{MAX_PTY}, not {size.cols}x{size.rows}"
        )
    return size.cols, size.rows


async def _other_user(ws: Workspace, user: str | None) -> str | None:
    """None for the sandbox's user; else ``user``, which this workspace may run as.
    Raises ConnectError (``unauthenticated``, ``permission_denied``)."""
    if user is None or user == E2B_USER:
        return None
    box = ws.sandbox
    if not isinstance(box, HarnessMixin):
        raise ConnectError(Code.PERMISSION_DENIED, f"this sandbox runs commands only as {E2B_USER!r}, not {user!r}")
    try:
        found = await box.as_user(user)
    except UserUnsupportedError as e:
        raise ConnectError(Code.PERMISSION_DENIED, f"user {user!r} refused: {e}") from None
    if isinstance(found, ExecResult):
        raise ConnectError(Code.UNAUTHENTICATED, f"invalid username: '{user}' (no such user in the sandbox's image)")
    return None if found is box else user


def _cwd(cfg: pb.ProcessConfig, home: str) -> str:
    """The working directory as E2B names it: ``cfg.cwd`` absolute, ``~`` expanded, or
    relative to ``home`` (its default). Raises ConnectError (``invalid_argument``)."""
    path = cfg.cwd if cfg.has_field("cwd") else ""
    if "\x00" in path:
        raise ConnectError(Code.INVALID_ARGUMENT, "cwd holds a NUL")
    if path.startswith("~"):
        if len(path) > 1 and path[1] != "/":
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"failed to expand path '{path}': cannot expand another user's home"
            )
        path = home + path[1:]
    return posixpath.normpath(posixpath.join(home, path))


async def _home_mounted(t: Target) -> bool:
    """Whether ``t``'s workspace is also mounted at E2B's home (its ``home_mount``, as
    E2B's own creates set it). Raises SettingsError, ValueError."""
    own, _ = await t.registry.workspace_settings(t.path)
    return own.home_mount == E2B_HOME


async def _workspace_cwd(ws: Workspace, where: str) -> tuple[str, str | None]:
    """(cwd relative to the workspace, None) for a directory in it, else (".", the
    absolute directory). Raises ConnectError (``invalid_argument``)."""
    loom = to_loom(where)
    if loom == LOOM_MOUNT:
        return ".", None
    if loom.startswith(LOOM_MOUNT + "/"):
        return loom[len(LOOM_MOUNT) + 1 :], None
    await _check_dir(ws, loom, where)
    return ".", loom


async def _check_dir(ws: Workspace, loom: str, where: str) -> None:
    """Whether directory ``loom`` (``where`` to E2B) exists, as envd checks before it
    starts anything. Raises ConnectError (``invalid_argument``)."""
    if loom == LOOM_MOUNT or loom.startswith(LOOM_MOUNT + "/"):
        return  # (the workspace's: its agent checks as it starts the process)
    await _dir_there(ws, loom, where)


async def _dir_there(ws: Workspace, loom: str, where: str) -> None:
    """:func:`_check_dir` of any directory, the workspace's too. Raises ConnectError
    (``invalid_argument``)."""
    try:
        await harness_files(ws.sandbox).read_path(loom, max_bytes=0)
    except IsADirError:
        return  # a directory: there
    except PermissionDeniedError:
        return  # there, not ours to read: the command's own shell says what it can
    except (PathNotFoundError, NotADirError):
        raise _no_cwd(where) from None
    raise ConnectError(Code.INVALID_ARGUMENT, f"cwd '{where}' is not a directory")


def _no_cwd(where: str) -> ConnectError:
    return ConnectError(Code.INVALID_ARGUMENT, f"cwd '{where}' does not exist")
