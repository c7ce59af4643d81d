"""A workspace's code contexts: create, list, restart, delete, and the one a call without
a context runs in (the language's default context, created at its first use).

A context is a kernel (:mod:`sandbox.kernels`) run as a background process of the
workspace named by the context's id (``ctx-...``; the default Python context is
``ctx-python``): it counts against the workspace's background processes
(``LOOM_MAX_PROCESSES``) and the sandbox's limits, and ends with the sandbox (a new
sandbox has no contexts; the default one is made again at its first use). What its kernel
changes in the workspace between executions is recorded as the context's (``undo --call
ctx-...``); during an execution, as the execution's (see :mod:`.execute`).
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sandbox.capabilities import background, code_kernels
from sandbox.errors import AgentError
from sandbox.kernels import KERNELS, KernelInfo

from ..background import BackgroundLimits
from .model import CodeContext

if TYPE_CHECKING:
    from ..workspace import Workspace

PREFIX = "ctx-"
#: The languages a context may have (a kernel each).
LANGUAGES: tuple[str, ...] = tuple(KERNELS)
DEFAULT_LANGUAGE = "python"
_ID = re.compile(r"^ctx-[A-Za-z0-9_-]{1,60}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class CodeArgumentError(ValueError):
    """An argument of a code call refused before anything ran; ``field`` names it
    (``language``, ``timeout``, ``context``...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def default_context_id(language: str) -> str:
    """The id of ``language``'s default context (``ctx-python``)."""
    return PREFIX + language


def check_language(language: str) -> str:
    """Raises CodeArgumentError for a language no kernel here speaks."""
    if language not in KERNELS:
        raise CodeArgumentError(
            "language",
            f"{language!r} is not a language of this worker's kernels ({', '.join(LANGUAGES)}): JavaScript and "
            "TypeScript have no kernel here (see docs/code-interpreter.md)",
        )
    return language


def check_context_id(context_id: str) -> str:
    if not isinstance(context_id, str) or not _ID.match(context_id):
        raise CodeArgumentError("context", f"not a context id: {str(context_id)[:80]!r} (ctx-...)")
    return context_id


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not _ENV_KEY.match(k) or not isinstance(v, str) or "\x00" in v:
            raise CodeArgumentError("env", f"{str(k)[:80]!r} is not NAME=value (a name of letters, digits, _)")
        if k.startswith(("LD_", "LOOM_")):
            raise CodeArgumentError("env", f"{k} is the worker's to set")
        out[k] = v
    return out


def check_cwd(cwd: str) -> str:
    if not isinstance(cwd, str) or not cwd or "\x00" in cwd or cwd.startswith("/") or len(cwd) > 4096:
        raise CodeArgumentError("cwd", "a directory relative to the workspace")
    return cwd


def _context(info: KernelInfo) -> CodeContext:
    return CodeContext(id=info.id, language=info.language, cwd=info.cwd, running=info.running)


def not_found(context_id: str) -> AgentError:
    return AgentError(
        f"No code context {context_id} in this workspace (contexts end with the sandbox): create one, "
        "or leave the context out to run in the language's default context",
        code="not_found",
    )


async def create_context(
    ws: Workspace,
    *,
    language: str = DEFAULT_LANGUAGE,
    cwd: str = ".",
    env: Mapping[str, str] | None = None,
    context_id: str | None = None,
) -> CodeContext:
    """Start a new context: a kernel of ``language`` in ``cwd`` (relative to the workspace)
    with ``env`` on top of the sandbox's variables.

    Raises CodeArgumentError (a ValueError), KernelUnavailableError (the image lacks what
    the kernel needs: the message says how to add it), AgentError (``limit``: the
    workspace runs as many background processes as it may), PathNotFoundError (``cwd``),
    the infrastructure errors of any call."""
    info = await _start(ws, check_language(language), check_cwd(cwd), check_env(env), context_id)
    return _context(info)


async def _start(
    ws: Workspace, language: str, cwd: str, env: dict[str, str], context_id: str | None = None
) -> KernelInfo:
    box = code_kernels(ws.sandbox)
    cid = check_context_id(context_id) if context_id else PREFIX + secrets.token_hex(6)
    limits = ws.background.limits if ws.background is not None else BackgroundLimits()
    return await ws.start_owned(
        cid,
        f"code context: {language} kernel in {cwd}",
        lambda: box.start_kernel(
            cid, language, cwd=cwd, env=env, max_running=limits.max_processes, linger=limits.linger
        ),
    )


async def list_contexts(ws: Workspace) -> list[CodeContext]:
    """The workspace's contexts, oldest first (also those whose kernel has ended, not yet
    forgotten: ``running`` false; the next execution in one starts its kernel again)."""
    box = code_kernels(ws.sandbox)
    out: list[CodeContext] = []
    for p in await background(ws.sandbox).processes():
        if p.id.startswith(PREFIX):
            with contextlib.suppress(AgentError):
                out.append(_context(await box.kernel_info(p.id)))
    return out


async def context_info(ws: Workspace, context_id: str) -> KernelInfo:
    """Raises AgentError (``not_found``), CodeArgumentError."""
    try:
        return await code_kernels(ws.sandbox).kernel_info(check_context_id(context_id))
    except AgentError as e:
        if e.code == "not_found":
            raise not_found(context_id) from None
        raise


async def resolve(ws: Workspace, context: str | None, language: str | None) -> tuple[KernelInfo, list[str]]:
    """The context a call runs in, running: ``context``, else ``language``'s default
    (made at its first use); one whose kernel ended is started again (its state lost:
    the notes say so). Raises CodeArgumentError, AgentError (``not_found``), and what
    :func:`create_context` raises."""
    notes: list[str] = []
    if context is not None:
        info = await context_info(ws, context)
        if language is not None and check_language(language) != info.language:
            raise CodeArgumentError("language", f"context {context} is a {info.language} context, not {language}")
    else:
        lang = check_language(language or DEFAULT_LANGUAGE)
        cid = default_context_id(lang)
        try:
            info = await context_info(ws, cid)
        except AgentError as e:
            if e.code != "not_found":
                raise
            try:
                return await _start(ws, lang, ".", {}, cid), notes
            except AgentError as started:
                if started.code != "conflict":
                    raise
                info = await context_info(ws, cid)  # another worker process made it meanwhile
    if not info.running:
        info = await revive(ws, info)
        notes.append("bridge_replaced")
    return info, notes


async def resolve_context(ws: Workspace, context: str | None, language: str | None) -> CodeContext:
    """:func:`resolve` as a :class:`CodeContext`."""
    info, _notes = await resolve(ws, context, language)
    return _context(info)


async def revive(ws: Workspace, info: KernelInfo) -> KernelInfo:
    """Start a context whose kernel (its bridge) ended again, as it was made."""
    box = code_kernels(ws.sandbox)
    await box.stop_kernel(info.id)
    await ws.settle_background(prefer=info.id)
    return await _start(ws, info.language, info.workdir, dict(info.env), info.id)


async def restart_context(ws: Workspace, context_id: str) -> CodeContext:
    """A new kernel for the context (its state, variables and imports, is lost). Raises
    AgentError (``not_found``), KernelUnavailableError, the infrastructure errors."""
    info = await context_info(ws, context_id)
    if not info.running:
        return _context(await revive(ws, info))
    box = code_kernels(ws.sandbox)
    session = await box.kernel_session(info.id)
    await session.request({"op": "restart"}, "restarted", 120.0)
    return _context(info)


async def delete_context(ws: Workspace, context_id: str) -> None:
    """End the context's kernel and forget it; what it changed is recorded as its own.
    Raises AgentError (``not_found``)."""
    info = await context_info(ws, context_id)
    await code_kernels(ws.sandbox).stop_kernel(info.id)
    await ws.settle_background(prefer=info.id)
