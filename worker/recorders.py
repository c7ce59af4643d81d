"""What records a workspace's changes: the :class:`ChangeRecorder` protocol (the
changelog, :mod:`worker.changelog`, implements it), :class:`NullRecorder` (records
nothing), and the token a recorder hands from ``before_shell`` to ``after_shell``."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from sandbox.base import ExecResult, Sandbox, ScanRequest, ScanResult, WriteResult


class ScanToken:
    """The base of a ``before_shell`` token carrying the scan to send with the command and
    the command's intent (the changelog's :class:`worker.changelog.shellscan.ShellToken`).
    A recorder's token is one when its class derives from this: a nominal class, since
    ``isinstance`` on a runtime-checkable Protocol with attributes costs ~15 us, and a
    command asks twice."""

    scan: ScanRequest | None
    intent: str | None


def scan_token(token: object) -> ScanToken | None:
    """``token`` when it is a :class:`ScanToken`, else None (the null recorder's)."""
    return token if isinstance(token, ScanToken) else None


@runtime_checkable
class ChangeRecorder(Protocol):
    """What the changelog (issue 4) implements; :class:`NullRecorder` is the no-op default."""

    async def write(
        self,
        sandbox: Sandbox,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None,
        expect_absent: bool,
        tool: str,
        call_id: str | None,
        subtask_id: str | None,
        guess_sha256: str | None = None,
    ) -> WriteResult:
        """Record ``path``'s before-image, then write ``data`` through ``sandbox``.
        ``guess_sha256`` is what the file probably holds (the worker's last sight of it):
        a recorder may try it first to save reading the file, never rely on it. (Passed
        only when there is one: a recorder of this protocol's first version takes no such
        argument.)

        Raises what ``Sandbox.write`` raises (ConflictError, PathEscapeError, ...).
        """
        ...

    async def before_shell(
        self,
        sandbox: Sandbox,
        *,
        piggyback: bool = False,
        pending: ScanResult | None = None,
        attribute: dict[str, Any] | None = None,
        intent: dict[str, Any] | None = None,
    ) -> object:
        """Snapshot what is needed to see a command's changes; returns a token.

        With ``piggyback`` the token may carry a ``scan`` (:class:`ScanRequest`) for the
        caller to send with the command; ``pending`` is the scan such a command handed
        back unrun (:class:`ScanFirst`); changes found before the command are recorded as
        ``attribute``'s (a background process's record) when given."""
        ...

    async def sync_background(self, sandbox: Sandbox, record: dict[str, Any]) -> list[str]:
        """Record the changes since the last scan as ``record``'s; return their paths."""
        ...

    async def after_shell(
        self,
        sandbox: Sandbox,
        token: object,
        *,
        tool: str,
        command: str,
        call_id: str | None,
        subtask_id: str | None,
        result: ExecResult | None = None,
    ) -> list[str]:
        """Record what the command changed; returns those workspace-relative paths."""
        ...


@runtime_checkable
class KeepsReserve(Protocol):
    """A recorder that keeps free space to record changes (the changelog): a caller that
    answers before a change starts (a stream's status) may ask it first."""

    def check_reserve(self, what: str) -> None:
        """Refuse ``what`` when there is not the room. Raises ReserveError, storage errors."""
        ...


class NullRecorder:
    """Records nothing: writes go straight to the sandbox, shell changes are not tracked."""

    async def write(
        self,
        sandbox: Sandbox,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None,
        expect_absent: bool,
        tool: str,
        call_id: str | None,
        subtask_id: str | None,
        guess_sha256: str | None = None,
    ) -> WriteResult:
        return await sandbox.write(path, data, expect_sha256=expect_sha256, expect_absent=expect_absent)

    async def before_shell(
        self,
        sandbox: Sandbox,
        *,
        piggyback: bool = False,
        pending: ScanResult | None = None,
        attribute: dict[str, Any] | None = None,
        intent: dict[str, Any] | None = None,
    ) -> object:
        return None

    async def sync_background(self, sandbox: Sandbox, record: dict[str, Any]) -> list[str]:
        return []

    async def after_shell(
        self,
        sandbox: Sandbox,
        token: object,
        *,
        tool: str,
        command: str,
        call_id: str | None,
        subtask_id: str | None,
        result: ExecResult | None = None,
    ) -> list[str]:
        return []
