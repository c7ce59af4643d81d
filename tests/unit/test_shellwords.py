"""The policy's tokenizer: shlex's words in linear time (issue 26)."""

from __future__ import annotations

import shlex
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.policy import shell as shellpolicy
from worker.policy import shellwords
from worker.tool import PolicyError


def _shlex(command: str) -> list[str] | None:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=shellwords.PUNCTUATION)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


# Every character class the tokenizer tells apart, but '#' and newlines (where it follows
# the shell instead of shlex: tested below).
_ALPHABET = "ab -;&|()<>`'\"\\$x\t{}=*~/é\x0b,"


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=_ALPHABET, max_size=30))
def test_same_tokens_as_shlex(command: str) -> None:
    assert shellwords.split(command) == _shlex(command)


@pytest.mark.parametrize(
    ("command", "tokens"),
    [
        ("ls\nrm -rf /", ["ls", ";", "rm", "-rf", "/"]),
        ("echo x # a comment\nrm -rf /", ["echo", "x", ";", "rm", "-rf", "/"]),
        ("echo a#b", ["echo", "a#b"]),
        ("echo 'a\nb'", ["echo", "a\nb"]),
        ("echo a\\\nb", ["echo", "ab"]),
        ('echo "a\\\nb"', ["echo", "ab"]),
        ("echo ''", ["echo", ""]),
        ("echo 'open", None),
        ("echo \\", None),
    ],
)
def test_newlines_and_comments_as_the_shell_reads_them(command: str, tokens: list[str] | None) -> None:
    assert shellwords.split(command) == tokens


def test_a_comment_no_longer_hides_the_next_line() -> None:
    with pytest.raises(PolicyError):
        shellpolicy.check_command("echo ok # fine\nrm -rf /")


def _seconds(command: str, rounds: int = 5) -> float:
    """The check's CPU time (this process's: other processes' load shifts it less than
    a wall clock), the best of ``rounds``."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        shellpolicy.check_command(command)
        best = min(best, time.process_time() - started)
    return best


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda n: "printf '%s' '" + "a" * n + "' | wc -c", id="quoted-data-piped"),
        pytest.param(lambda n: "cat <<'EOF' | wc -l\n" + "x = 1  # y\n" * (n // 11) + "EOF", id="heredoc"),
        pytest.param(lambda n: " | ".join(["grep -v foo"] * (n // 14)), id="many-commands"),
        pytest.param(lambda n: "echo " + "a\\ b" * (n // 4) + " 2>/dev/null", id="escapes"),
    ],
)
def test_the_check_is_linear_in_the_command_length(make: object) -> None:
    """The time of a 1 MiB command against a 64 KiB one (16 times longer): about 16 for a
    linear check (15-19 measured here, quiet), 256 for a quadratic one (shlex's tokens
    were). A ratio, never a wall-clock bound: the machine's load shifts both alike."""
    assert callable(make)
    small, big = make(64 << 10), make(1 << 20)
    ratio = _seconds(big) / _seconds(small)
    assert ratio < 64, f"{ratio:.0f}x the time for 16x the length"
