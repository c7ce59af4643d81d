"""``--with-scratch`` when the sandbox cannot archive its ``/tmp`` and ``$HOME``: a limit of
the sandbox's own (its process limit, the archive's time or size) is a limit refusal
(ScratchLimitError, a SnapshotLimitError: HTTP 409, kind "limit"), a missing or failing
``tar`` is the sandbox's (ScratchError: 409, kind "caller"), and only a command that ended
another way (a signal, the sandbox lost) stays a snapshot failure (503). Found by the HTTP
fuzzer: a sandbox at its pids limit made a snapshot answer 503."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.results import ExecResult
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
