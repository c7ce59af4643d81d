"""The harness API: one workspace's sandbox as an evaluation harness drives it.

The model's tools (Spec 05: ``read_file``, ``write_file``, ``shell_execute``...) stay in
the workspace: their paths are workspace-relative and a path outside is a "Safety
violation". A harness (inspect_ai's ``SandboxEnvironment``, a CI script, a grader) works
on the sandbox as a whole: it reads ``/tmp/result.json``, writes a fixture into
``$HOME``, runs a command in ``/usr/bin`` as another user with its own stdin, and moves
bytes, not text. :class:`SandboxHandle` is that API, kept apart from the tools so that
no tool list a model sees ever offers it (``registry.sandbox(workspace)`` in Python,
``/v1/workspaces/{id}/sandbox/...`` over HTTP, ``loom-worker exec``/``cp``, the inspect
provider):

- :meth:`SandboxHandle.exec`: a shell string or an argv, any stdin (bytes), cwd, env,
  user, timeout and output cap; commands of any length;
- :meth:`SandboxHandle.read_file`: any file the sandbox's user can read, as bytes;
- :meth:`SandboxHandle.write_file`: where that user can write, with its permissions;
- :meth:`SandboxHandle.open_terminal`: a program on a pseudo-terminal (:mod:`worker.terminals`);
- :meth:`SandboxHandle.run_code` / :meth:`~SandboxHandle.run_code_stream`: code in a
  context whose state lasts (:mod:`worker.kernels`), and the contexts themselves.

What changes inside the workspace is recorded in its changelog as always (a command's
changes by the usual scans, a write before it happens), under the call's ``call_id``, so
it can be undone; what changes elsewhere (``/tmp``, ``$HOME``) is the sandbox's scratch
space and is not recorded (the results say which: ``files_changed``, ``recorded``). The
command policy applies to commands here too: in inspect, the model's own commands come
this way.
"""

from __future__ import annotations

import contextlib
import posixpath
import secrets
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sandbox.base import ExecControl, ExecRequest, OutputCallback, ProcessInfo
from sandbox.capabilities import harness_files
from sandbox.errors import InWorkspaceError, PathEscapeError, SandboxLostError, TooLargeError
from sandbox.protocol import env_problem

from .. import kernels
from .. import terminals as terms
from ..kernels.toolresult import execution_result
from ..policy.shell import check_command
from ..result import ToolResult
from ..terminals import Terminal
from ..tool import PolicyError
from ..workspace import Workspace
from .results import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_READ,
    DEFAULT_TIMEOUT,
    HARD_OUTPUT_LIMIT,
    MAX_OUTPUT,
    MAX_READ,
    MAX_STDIN,
    MAX_TIMEOUT,
    MAX_WRITE,
    ExecOutput,
    FileWritten,
)

if TYPE_CHECKING:
    from ..calls import CallJournal


class HarnessArgumentError(ValueError):
    """An argument of a harness call refused before anything ran (an empty command, a
    path with a NUL, a timeout or size out of range)."""


class Registry(Protocol):
    """What the handle needs of a :class:`~worker.registry.ToolRegistry` (named here, not
    imported: the registry makes handles)."""

    journal: CallJournal | None

    async def workspace(self, path: Path | str) -> Workspace: ...


class SandboxHandle:
    """``workspace``'s sandbox, for a harness (see the module docstring). Made by
    :meth:`ToolRegistry.sandbox <worker.registry.ToolRegistry.sandbox>`; the sandbox
    starts at the first call. Every call of one workspace takes turns with the tools'
    mutations (its changelog's order); commands run one at a time per user."""

    def __init__(self, registry: Registry, workspace: Path | str) -> None:
        self.registry = registry
        self.workspace = workspace

    async def _ws(self) -> Workspace:
        return await self.registry.workspace(self.workspace)

    # -- paths ----------------------------------------------------------------------

    @staticmethod
    def absolute(path: str, mount: str) -> str:
        """``path`` as the sandbox names it: relative to the workspace (``mount``), or
        absolute; ``..`` resolved lexically. Raises HarnessArgumentError (a ValueError) for an empty path or a NUL."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise HarnessArgumentError("a path is a non-empty string without NUL")
        return posixpath.normpath(posixpath.join(mount, path))

    @staticmethod
    def _in_workspace(abspath: str, mount: str) -> str | None:
        if abspath == mount:
            return "."
        prefix = mount.rstrip("/") + "/"
        return abspath[len(prefix) :] if abspath.startswith(prefix) else None

    # -- exec -----------------------------------------------------------------------

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
        call_id: str | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ExecOutput:
        """Run ``cmd`` (a shell string for ``sh -c``, or an argv run as it is) in the
        sandbox and wait for its end. ``input``: its stdin (text is UTF-8; default
        ``/dev/null``; at most 64 MiB); ``cwd``: relative to the workspace or any
        absolute directory (default: the workspace); ``env``: variables on top of the
        sandbox's; ``user``: a user of the image, or ``root`` where the workspace allows
        it; ``timeout`` in seconds (default 3600, at most 86400); ``max_output``: bytes
        kept of each stream (default 10 MiB, at most 16 MiB). ``on_output``/``control``:
        as ``Sandbox.exec``.

        A timeout, a limit or a refusal by the command policy is an :class:`ExecOutput`
        (``outcome``), never an exception. Raises HarnessArgumentError (a ValueError: bad arguments),
        UserUnsupportedError (a user this workspace may not run as), the infrastructure
        errors of ``sandbox.errors`` (SandboxUnavailableError, SandboxLostError when the
        sandbox died with the command), ChangelogStorageError.
        """
        argv, text = _command(cmd)
        stdin = input.encode("utf-8") if isinstance(input, str) else input
        if stdin is not None and len(stdin) > MAX_STDIN:
            raise HarnessArgumentError(
                f"input of {len(stdin)} bytes is more than {MAX_STDIN}: write it to a file first"
            )
        limit = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        if not 0 < limit <= MAX_TIMEOUT:
            raise HarnessArgumentError(f"timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds")
        if not 0 <= max_output <= MAX_OUTPUT:
            raise HarnessArgumentError(f"max_output must be 0-{MAX_OUTPUT} bytes")
        variables = _env(env)
        call_id = call_id or "call_" + secrets.token_hex(8)
        started = time.perf_counter()
        ws = await self._ws()
        workdir = self.absolute(cwd or ".", ws.sandbox.workspace_mount)
        try:
            check_command(text)
        except PolicyError as e:
            out = ExecOutput(126, b"", (e.message + "\n").encode(), "refused", 0.0, call_id=call_id)
            self._journal(ws, "sandbox.exec", _exec_brief(text, workdir, user, stdin), out, started)
            return out
        request = ExecRequest(
            text,
            cwd=workdir,
            timeout=limit,
            max_output=max_output,
            any_cwd=True,
            output_limit=max(HARD_OUTPUT_LIMIT, 4 * max_output),
            argv=argv,
            env=variables or None,
            stdin=stdin,
            user=user,
        )
        res, changed = await ws.run_shell(
            request, tool="sandbox.exec", call_id=call_id, on_output=on_output, control=control
        )
        if res.outcome == "sandbox_lost":
            raise SandboxLostError(
                "the sandbox was lost while running the command: " + res.stderr.decode("utf-8", "replace").strip()
            )
        out = ExecOutput(
            res.exit_code,
            res.stdout,
            res.stderr,
            res.outcome,
            res.duration_ms,
            truncated=res.truncated,
            stdout_bytes=res.stdout_bytes,
            stderr_bytes=res.stderr_bytes,
            signal=res.signal,
            launch_error=res.launch_error,
            call_id=call_id,
            files_changed=changed,
        )
        self._journal(ws, "sandbox.exec", _exec_brief(text, workdir, user, stdin), out, started)
        return out

    # -- files ----------------------------------------------------------------------

    # -- terminals ------------------------------------------------------------------

    async def open_terminal(
        self,
        command: Sequence[str] | None = None,
        *,
        cols: int = 80,
        rows: int = 24,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
    ) -> Terminal:
        """A new terminal of ``cols`` x ``rows`` running ``command`` (an argv; None: the
        sandbox user's login shell), ``cwd`` relative to the workspace, ``env`` on top of
        the sandbox's; attached (see :class:`worker.terminals.Terminal`: ``output()``,
        ``write``, ``resize``, ``signal``, ``kill``, ``close``). What it changes in the
        workspace is recorded as the terminal's (see :mod:`worker.terminals`).

        Raises TerminalArgumentError (a ValueError: a size out of 1-1000, an empty
        command), PolicyError (the command policy refuses ``command``), AgentError
        (``limit``: too many background processes), PathNotFoundError (``cwd``), the
        infrastructure errors of ``sandbox.errors``."""
        argv = list(command) if command is not None else None
        if argv is not None:
            check_command(shlex.join(argv))
        ws = await self._ws()
        return await terms.open_terminal(ws, argv, cols=cols, rows=rows, cwd=cwd, env=_env(env))

    async def attach_terminal(self, terminal_id: str, *, since: int | None = None) -> Terminal:
        """Reattach to a terminal: its output from offset ``since`` (None: the scrollback
        it keeps) replayed, then as it comes. Raises AgentError (``not_found``)."""
        return await terms.attach(await self._ws(), terminal_id, since=since)

    async def terminals(self) -> list[ProcessInfo]:
        """The workspace's terminals, running or recently ended, oldest first."""
        return await terms.list_terminals(await self._ws())

    async def kill_terminal(self, terminal_id: str) -> ProcessInfo:
        """End a terminal (everything it started) and record its changes. Raises
        AgentError (``not_found``)."""
        return await terms.kill_terminal(await self._ws(), terminal_id)

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_MAX_READ) -> bytes:
        """The bytes of the file at ``path`` (relative to the workspace, or absolute:
        anything the sandbox's user can read, links followed). Raises
        PathNotFoundError (a FileNotFoundError), PermissionDeniedError (a
        PermissionError), IsADirError (an IsADirectoryError), NotAFileError (a FIFO, a
        device), TooLargeError when the file is larger than ``max_bytes`` (default
        100 MiB, at most 1 GiB), HarnessArgumentError (a ValueError), and the infrastructure errors."""
        if not 0 <= max_bytes <= MAX_READ:
            raise HarnessArgumentError(f"max_bytes must be 0-{MAX_READ}")
        ws = await self._ws()
        target = self.absolute(path, ws.sandbox.workspace_mount)
        got = await harness_files(ws.sandbox).read_path(target, max_bytes=max_bytes)
        if got.truncated:
            raise TooLargeError(
                f"{path} is {got.size} bytes, more than the {max_bytes} bytes this read may return", code="too_large"
            )
        return got.data

    async def write_file(
        self, path: str, data: bytes | str, *, mode: int | None = None, call_id: str | None = None
    ) -> FileWritten:
        """Write ``data`` (text is UTF-8) to ``path`` (relative to the workspace, or
        absolute) as the sandbox's user: parents made, an existing file replaced unless
        its mode refuses that user (0444), a new one with ``mode``. Inside the workspace
        the change is recorded in its changelog (undoable under ``call_id``), elsewhere
        it is not (``recorded``). Raises PermissionDeniedError (a PermissionError: a
        read-only file or file system, another user's directory), IsADirError (an
        IsADirectoryError), NotAFileError, HarnessArgumentError (a ValueError: more than 1 GiB), and the
        infrastructure errors."""
        content = data.encode("utf-8") if isinstance(data, str) else data
        if len(content) > MAX_WRITE:
            raise HarnessArgumentError(f"{len(content)} bytes is more than the {MAX_WRITE} bytes one write may carry")
        call_id = call_id or "call_" + secrets.token_hex(8)
        started = time.perf_counter()
        ws = await self._ws()
        mount = ws.sandbox.workspace_mount
        target = self.absolute(path, mount)
        rel = self._in_workspace(target, mount)
        out: FileWritten | None = None
        if rel is not None:
            try:
                out = await self._recorded(ws, rel, target, content, call_id)
            except PathEscapeError:
                pass  # a link out of the workspace on the way: the sandbox's own files
        if out is None:
            try:
                w = await harness_files(ws.sandbox).write_path(target, content, mode=mode)
                out = FileWritten(w.path, w.size, w.created, recorded=False, call_id=call_id)
            except InWorkspaceError as e:  # a link into the workspace: recorded after all
                rel = str(e)
                out = await self._recorded(ws, rel, posixpath.join(mount, rel), content, call_id)
        brief = {"path": path, "data": f"[{len(content)} bytes]", "recorded": out.recorded}
        self._journal(ws, "sandbox.write_file", brief, out, started)
        return out

    @staticmethod
    async def _recorded(ws: Workspace, rel: str, shown: str, content: bytes, call_id: str) -> FileWritten:
        if rel == ".":
            from sandbox.errors import IsADirError

            raise IsADirError(f"Is a directory: {shown}", code="is_a_directory")
        res = await ws.write(rel, content, tool="sandbox.write_file", call_id=call_id)
        return FileWritten(shown, res.size, res.created, recorded=True, call_id=call_id)

    # -- code contexts --------------------------------------------------------------

    async def create_code_context(
        self, language: str = kernels.DEFAULT_LANGUAGE, cwd: str = ".", env: Mapping[str, str] | None = None
    ) -> kernels.CodeContext:
        """A new context: a kernel of ``language`` (``python``) whose state lasts between
        executions, started in ``cwd`` (relative to the workspace) with ``env`` on top of
        the sandbox's variables. It counts against the workspace's background processes
        and ends with the sandbox.

        Raises CodeArgumentError (a ValueError naming the field), KernelUnavailableError
        (the image lacks what the kernel needs: the message says what and how to add it),
        AgentError (``limit``: too many background processes), PathNotFoundError
        (``cwd``), the infrastructure errors of ``sandbox.errors``."""
        return await kernels.create_context(await self._ws(), language=language, cwd=cwd, env=env)

    async def code_context(
        self, context: str | kernels.CodeContext | None = None, language: str | None = None
    ) -> kernels.CodeContext:
        """The context code would run in: ``context``, else ``language``'s default context
        (Python's when both are None), made now if it was not; one whose kernel had ended
        is started again. Raises as :meth:`run_code_stream` before it runs anything."""
        cid = _context_id(context) if context is not None else None
        return await kernels.resolve_context(await self._ws(), cid, language)

    async def code_contexts(self) -> list[kernels.CodeContext]:
        """The workspace's contexts, oldest first (the default ones among them once used)."""
        return await kernels.list_contexts(await self._ws())

    async def restart_code_context(self, context: str | kernels.CodeContext) -> kernels.CodeContext:
        """A new kernel for ``context`` (its variables and imports are lost). Raises
        AgentError (``not_found``), CodeArgumentError."""
        return await kernels.restart_context(await self._ws(), _context_id(context))

    async def delete_code_context(self, context: str | kernels.CodeContext) -> None:
        """End ``context``'s kernel. Raises AgentError (``not_found``), CodeArgumentError."""
        await kernels.delete_context(await self._ws(), _context_id(context))

    async def check_reserve(self, what: str = "the execution") -> None:
        """Refuse ``what`` before it starts when the workspace's changelog lacks the room it
        keeps to record changes (:meth:`Workspace.check_reserve
        <worker.workspace.Workspace.check_reserve>`): so a stream's caller answers a status,
        not a first line. Raises ReserveError, ChangelogStorageError."""
        (await self._ws()).check_reserve(what)

    async def run_code_stream(
        self,
        code: str,
        context: str | kernels.CodeContext | None = None,
        language: str | None = None,
        timeout: float = kernels.DEFAULT_TIMEOUT,
        call_id: str | None = None,
        *,
        tool: str = "sandbox.run_code",
        hold: contextlib.AsyncExitStack | None = None,
    ) -> AsyncIterator[kernels.CodeEvent]:
        """Run ``code`` in ``context`` (else ``language``'s default context, made at its
        first use; else Python's) and yield what it prints (:class:`OutputMessage
        <worker.kernels.OutputMessage>`) and displays (:class:`Result
        <worker.kernels.Result>`) as they come, then its :class:`Execution
        <worker.kernels.Execution>` (always last). Past ``timeout`` seconds the kernel is
        interrupted (its state kept), and restarted if that does not stop it (its state
        lost): ``Execution.outcome``/``message`` say which. What the code changes in the
        workspace is recorded under ``call_id`` (undoable), one line in the call journal
        under ``tool``. A consumer that stops early leaves the execution running to its end
        (its journal line written then); what ``hold`` holds (a service slot) is released at
        that end, not when the consumer leaves (:func:`worker.kernels.stream`).

        The code's own failures (an exception, a timeout, a kernel that died) are in the
        Execution, never raised. Raises CodeArgumentError (a ValueError naming the field),
        AgentError (``not_found``: no such context), KernelUnavailableError, the
        infrastructure errors of ``sandbox.errors``, ChangelogStorageError."""
        call_id = call_id or "call_" + secrets.token_hex(8)
        cid = _context_id(context) if context is not None else None
        started = time.perf_counter()
        ws = await self._ws()

        def journal(ex: kernels.Execution) -> None:  # (in the execution's task: a consumer may have left)
            self._journal_code(ws, tool, code, ex, started)

        async for ev in kernels.stream(
            ws,
            code,
            context=cid,
            language=language,
            timeout=timeout,
            call_id=call_id,
            tool=tool,
            on_end=journal,
            hold=hold,
        ):
            yield ev

    async def run_code(
        self,
        code: str,
        context: str | kernels.CodeContext | None = None,
        language: str | None = None,
        timeout: float = kernels.DEFAULT_TIMEOUT,
        call_id: str | None = None,
        *,
        tool: str = "sandbox.run_code",
        on_event: Callable[[kernels.CodeEvent], Awaitable[None]] | None = None,
    ) -> kernels.Execution:
        """:meth:`run_code_stream` waited for: its :class:`Execution <worker.kernels.Execution>`
        (the outputs and displays in it); ``on_event`` is awaited with each output and
        display as it comes, then the Execution. Raises as :meth:`run_code_stream`."""
        call_id = call_id or "call_" + secrets.token_hex(8)
        cid = _context_id(context) if context is not None else None
        started = time.perf_counter()
        ws = await self._ws()
        ex = await kernels.run(
            ws, code, context=cid, language=language, timeout=timeout, call_id=call_id, tool=tool, emit=on_event
        )
        self._journal_code(ws, tool, code, ex, started)
        return ex

    # -- the call journal -----------------------------------------------------------

    def _journal_code(self, ws: Workspace, tool: str, code: str, ex: kernels.Execution, t0: float) -> None:
        journal = self.registry.journal
        if journal is None:
            return
        # As run_code's result: its record then keeps what the execution showed (the timeline's outputs).
        result = execution_result(ex)
        brief = {"code": code, "context": ex.context_id}
        duration = (time.perf_counter() - t0) * 1000.0
        journal.record(
            ws.root, tool, brief, result.capped(), duration, call_id=ex.call_id, subtask_id=None, root=ws.root
        )

    def _journal(
        self, ws: Workspace, name: str, brief: dict[str, Any], out: ExecOutput | FileWritten, t0: float
    ) -> None:
        """One line in the workspace's call journal (the dashboard's timeline), as every
        tool call has."""
        journal = self.registry.journal
        if journal is None:
            return
        if isinstance(out, ExecOutput):
            data = {"outcome": out.outcome if out.outcome != "refused" else "exit", "exit_code": out.returncode}
            what = f"exit code {out.returncode}" if out.outcome == "exit" else out.outcome
            result = ToolResult(out.success, what, data, list(out.files_changed), None if out.success else what)
            call_id = out.call_id
        else:
            files = [posixpath.relpath(out.path, ws.sandbox.workspace_mount)] if out.recorded else []
            result = ToolResult.ok(f"wrote {out.size} bytes to {out.path}", None, files)
            call_id = out.call_id
        duration = (time.perf_counter() - t0) * 1000.0
        journal.record(ws.root, name, brief, result.capped(), duration, call_id=call_id, subtask_id=None, root=ws.root)


def _context_id(context: str | kernels.CodeContext) -> str:
    return context.id if isinstance(context, kernels.CodeContext) else context


def _command(cmd: str | Sequence[str]) -> tuple[list[str] | None, str]:
    """``(argv or None, the command as text)``. Raises HarnessArgumentError for an empty one."""
    if isinstance(cmd, str):
        if not cmd.strip() or "\x00" in cmd:
            raise HarnessArgumentError("the command is empty or holds a NUL")
        return None, cmd
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv) or not argv[0]:
        raise HarnessArgumentError("argv is a non-empty list of strings without NUL")
    return argv, shlex.join(argv)


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(env or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in out.items()):
        raise HarnessArgumentError("env: names and values are strings")
    if (problem := env_problem(out)) is not None:
        raise HarnessArgumentError(f"env: {problem}")
    return out


def _exec_brief(text: str, cwd: str, user: str | None, stdin: bytes | None) -> dict[str, Any]:
    brief: dict[str, Any] = {"command": text, "cwd": cwd}
    if user is not None:
        brief["user"] = user
    if stdin is not None:
        brief["stdin"] = f"[{len(stdin)} bytes]"
    return brief
