"""The terminal API's checks of its arguments, before anything starts."""

from __future__ import annotations

import signal

import pytest

from sandbox.protocol import env_problem
from worker.terminals import TerminalArgumentError, check_size, new_terminal_id, open_terminal, signal_number


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


def test_env_names_and_values_an_environment_cannot_hold_are_named() -> None:
    assert env_problem(None) is None and env_problem({"A_1": "x=y", "LANG": ""}) is None
    assert "not a variable name" in (env_problem({"A=B": "1"}) or "")
    assert "not a variable name" in (env_problem({"": "1"}) or "")
    assert "not a variable name" in (env_problem({"A\x00": "1"}) or "")
    assert "NUL" in (env_problem({"A": "x\x00"}) or "")


async def test_open_terminal_refuses_a_bad_env_before_it_starts_anything() -> None:
    class NoWorkspace:  # any use of the workspace fails the test
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the workspace was used ({name}) for a refused env")

    with pytest.raises(TerminalArgumentError, match="env: 'A=B'"):
        await open_terminal(NoWorkspace(), env={"A=B": "1"})  # type: ignore[arg-type]
