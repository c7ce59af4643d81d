"""``--with-scratch`` when the sandbox cannot archive its ``/tmp`` and ``$HOME``: a limit of
the sandbox's own (its process limit, the archive's time or size) is a limit refusal
(ScratchLimitError, a SnapshotLimitError: HTTP 409, kind "limit"), a missing or failing
``tar`` is the sandbox's (ScratchError: 409, kind "caller"), and only a command that ended
another way (a signal, the sandbox lost) stays a snapshot failure (503). Found by the HTTP
fuzzer: a sandbox at its pids limit made a snapshot answer 503. The same at a fork, whose
sandbox unpacks the archive: its ``/tmp`` or ``$HOME`` too small or the unpack too slow is
a limit, ``tar`` failing otherwise the sandbox's (409 both; the forks are removed)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.results import ExecResult, ProcessInfo, ProcessOutput
from worker.http.errors import TABLE
from worker.snapshots import ScratchError, ScratchLimitError, SnapshotError, SnapshotLimitError, scratch

pytestmark = pytest.mark.asyncio


class _Box:
    def __init__(self, result: ExecResult, out: bytes = b"") -> None:
        self.result, self.out = result, out

    async def exec(self, request: Any, on_output: Any = None, **_: Any) -> ExecResult:
        if on_output is not None and self.out:
            on_output("stdout", self.out)
        return self.result


def _ended(outcome: str, code: int | None = None, stderr: bytes = b"") -> ExecResult:
    return ExecResult(exit_code=code, stdout=b"", stderr=stderr, outcome=outcome, duration_ms=1.0, truncated=False)  # type: ignore[arg-type]


def _row(e: Exception) -> tuple[str, int]:
    row = next(r for r in TABLE if isinstance(e, r.error))
    return row.kind, row.status


async def test_an_archive_is_what_tar_wrote() -> None:
    assert await scratch.capture(_Box(_ended("exit", 0), b"tar bytes")) == b"tar bytes"  # type: ignore[arg-type]
    assert await scratch.capture(_Box(_ended("exit", 1), b"x")) == b"x"  # type: ignore[arg-type]  # (a file changed)


@pytest.mark.parametrize(
    ("result", "raised", "says", "kind", "status"),
    [
        (_ended("exit", 2, b"/bin/sh: 1: Cannot fork"), ScratchLimitError, "process limit", "limit", 409),
        (
            _ended("exit", 126, b"/bin/sh: Resource temporarily unavailable\n"),
            ScratchLimitError,
            "process limit",
            "limit",
            409,
        ),
        (_ended("timeout"), ScratchLimitError, "took longer", "limit", 409),
        (_ended("output_limit"), ScratchLimitError, "larger than", "limit", 409),
        (_ended("oom"), ScratchLimitError, "memory limit", "limit", 409),
        (_ended("exit", 127, b"sh: 1: tar: not found"), ScratchError, "tar: not found", "caller", 409),
        (
            _ended("exit", 2, b"tar: ./tmp/x: Cannot open: Permission denied"),
            ScratchError,
            "exit code 2",
            "caller",
            409,
        ),
        (_ended("sandbox_lost"), SnapshotError, "sandbox_lost", "infrastructure", 503),
    ],
)
async def test_what_stopped_the_archive_decides_the_error(
    result: ExecResult, raised: type[Exception], says: str, kind: str, status: int
) -> None:
    with pytest.raises(SnapshotError) as caught:
        await scratch.capture(_Box(result))  # type: ignore[arg-type]
    assert type(caught.value) is raised
    assert says in str(caught.value)
    assert _row(caught.value) == (kind, status)
    assert isinstance(caught.value, SnapshotLimitError) == (kind == "limit")


class _Tar:
    """A fork's sandbox unpacking an archive: its ``tar`` ends as told (or never)."""

    def __init__(self, outcome: str | None, code: int | None, stderr: bytes = b"") -> None:
        self.outcome, self.code, self.stderr = outcome, code, stderr
        self.fed = 0
        self.killed = False

    def _info(self) -> ProcessInfo:
        running = self.outcome is None and not self.killed
        return ProcessInfo(
            id="p",
            command="tar",
            pid=1,
            started=0.0,
            running=running,
            exit_code=self.code,
            outcome=self.outcome,  # type: ignore[arg-type]
        )

    async def start_process(self, process_id: str, command: str, **_: Any) -> ProcessInfo:
        assert command.startswith("tar ")
        return self._info()

    async def process_input(self, process_id: str, data: bytes, *, eof: bool = False) -> int:
        self.fed += len(data)
        return len(data)

    async def process_output(self, process_id: str, **_: Any) -> ProcessOutput:
        return ProcessOutput(self._info(), b"", self.stderr, (0, 0), (0, 0), not self._info().running)

    async def process_kill(self, process_id: str, **_: Any) -> ProcessInfo:
        self.killed = True
        return self._info()


@pytest.mark.parametrize(
    ("tar", "raised", "says", "kind"),
    [
        (
            _Tar("exit", 2, b"tar: ./tmp/big: Wrote only 4096 of 10240 bytes\ntar: No space left on device\n"),
            ScratchLimitError,
            "too small for it",
            "limit",
        ),
        (_Tar("timeout", 137), ScratchLimitError, "took longer than the 5 s", "limit"),
        (_Tar("exit", 2, b"tar: This does not look like a tar archive"), ScratchError, "tar's exit code 2", "caller"),
        (_Tar("signal", 137), ScratchError, "tar's exit code 137", "caller"),
    ],
)
async def test_what_stopped_the_unpack_decides_the_error(
    monkeypatch: pytest.MonkeyPatch, tar: _Tar, raised: type[Exception], says: str, kind: str
) -> None:
    monkeypatch.setattr(scratch, "background", lambda _box: tar)
    with pytest.raises(SnapshotError) as caught:
        await scratch.unpack(object(), b"x" * 3_000_000, timeout=5)  # type: ignore[arg-type]
    assert type(caught.value) is raised
    assert says in str(caught.value) and "fork's /tmp and $HOME" in str(caught.value)
    assert _row(caught.value) == (kind, 409)
    assert tar.fed == 3_000_000  # (fed in chunks, the whole archive)


async def test_an_unpack_that_outlasts_its_time_is_killed_and_a_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    tar = _Tar(None, None)  # (never ends by itself)
    monkeypatch.setattr(scratch, "background", lambda _box: tar)
    with pytest.raises(ScratchLimitError, match=r"took longer than the 0\.05 s"):
        await scratch.unpack(object(), b"archive", timeout=0.05)  # type: ignore[arg-type]
    assert tar.killed


async def test_an_unpack_that_ends_well_raises_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    tar = _Tar("exit", 0)
    monkeypatch.setattr(scratch, "background", lambda _box: tar)
    await scratch.unpack(object(), b"archive")  # type: ignore[arg-type]
