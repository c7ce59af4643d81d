"""Modules stay small: one of ``worker`` or ``sandbox`` over :data:`MAX_LINES` lines says
why in a ``# long module: <reason>`` line among its first :data:`NEAR_TOP` lines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
NEAR_TOP = 40
REASON = re.compile(r"^# long module: \S.{9,}")  # a reason of a few words, not a placeholder


def _modules() -> list[Path]:
    return sorted(p for top in ("worker", "sandbox") for p in (ROOT / top).rglob("*.py"))


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_long_modules_say_why() -> None:
    unexplained = []
    for path in _modules():
        name = str(path.relative_to(ROOT))
        lines = _lines(path)
        if len(lines) <= MAX_LINES:
            continue
        if not any(REASON.match(line) for line in lines[:NEAR_TOP]):
            unexplained.append(f"{name}: {len(lines)} lines")
    assert not unexplained, (
        f"over {MAX_LINES} lines without a '# long module: <reason>' line in the first {NEAR_TOP}: "
        "split them, or say why:\n" + "\n".join(unexplained)
    )


def test_the_reason_line_is_recognized() -> None:
    assert REASON.match("# long module: one state machine, split it and both halves lie")
    assert not REASON.match("# long module:")
    assert not REASON.match("# long module: todo")
