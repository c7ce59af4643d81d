"""The terminal API's checks of its arguments, before anything starts."""

from __future__ import annotations

import signal

import pytest

from worker.terminals import TerminalArgumentError, check_size, new_terminal_id, signal_number


def test_signals_by_number_and_by_name() -> None:
    assert signal_number(2) == signal.SIGINT
    assert signal_number("INT") == signal_number("SIGINT") == signal_number("int") == signal.SIGINT
    assert signal_number("winch") == signal.SIGWINCH
    for bad in (0, 65, -1, True, "NOPE", "SIG_DFL", "", "1", None, 2.0):
        with pytest.raises(TerminalArgumentError):
            signal_number(bad)  # type: ignore[arg-type]


def test_sizes_are_1_to_1000_and_the_error_names_the_field() -> None:
    check_size(1, 1)
    check_size(1000, 1000)
    for cols, rows, field in ((0, 24, "cols"), (80, 1001, "rows"), (True, 24, "cols"), (80, 2.5, "rows")):
        with pytest.raises(TerminalArgumentError, match=field):
            check_size(cols, rows)  # type: ignore[arg-type]


def test_ids_are_terminal_ids() -> None:
    a, b = new_terminal_id(), new_terminal_id()
    assert a != b and a.startswith("term-") and len(a) == 17
