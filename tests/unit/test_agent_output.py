"""The agent's capped capture of a command's output (``sandbox/agent/output.py``)."""

from __future__ import annotations

from sandbox.agent.output import Capped


def test_head_and_tail_are_kept_and_the_gap_said() -> None:
    c = Capped(8)
    for piece in (b"abc", b"defgh", b"ijklm"):
        c.add(piece)
    assert c.total == 13
    assert c.value() == (b"abcd\n[... 5 bytes omitted ...]\njklm", True)
    whole = Capped(100)
    whole.add(b"all of it")
    assert whole.value() == (b"all of it", False)


def test_a_cap_of_zero_keeps_nothing_and_counts_everything() -> None:
    # (the harness's exec takes max_output=0 when the output goes out as it comes)
    c = Capped(0)
    for piece in (b"abc", b"", b"defgh"):
        c.add(piece)
    assert c.total == 8
    assert c.value() == (b"\n[... 8 bytes omitted ...]\n", True)
