"""Shell words in linear time: the tokenizer under :mod:`worker.policy.shell`.

It splits a command as ``shlex.shlex(command, posix=True, punctuation_chars=";&|()<>`")``
with ``whitespace_split`` does (the blocklist's rules were written against those tokens),
with two differences that follow the shell: a newline outside quotes is a ``;`` token of
its own (shlex saw the newlines the policy had replaced by `` ; `` before, also inside
quotes); a ``#`` starts a comment only where a word would start (shlex also cut a word at
it: ``a#b``) and the comment ends with its line (shlex's ran to the end of the text,
hiding whatever came on the next lines); a backslash before a newline continues the line,
as in ``sh``.

Why our own and not shlex: shlex reads one character at a time and grows each token by
string concatenation on an attribute, which CPython cannot do in place: a 1 MiB quoted
argument took seconds (quadratic), and even short tokens cost ~1 µs a character. Here
every run of ordinary characters, quoted text and punctuation is matched by one compiled
regular expression (in C), and a word's pieces are joined once: linear in the length of
the command, a 1 MiB command in milliseconds. No maintained library does this job
(``bashlex`` builds a full parse tree and is slower than shlex).
"""

from __future__ import annotations

import re

#: shlex's punctuation characters (one token per run of them, as shlex makes).
PUNCTUATION = ";&|()<>`"
_BLANK = " \t\r"
#: A run of characters that neither separate, quote nor escape.
_RUN = re.compile(r"[^ \t\r\n;&|()<>`'\"\\]+")
_PUNCT = re.compile(r"[;&|()<>`]+")
_BLANKS = re.compile(r"[ \t\r]+")
#: Inside double quotes: everything up to the closing quote or a backslash.
_DQ = re.compile(r'[^"\\]*')


def split(command: str) -> list[str] | None:
    """The tokens of ``command``, or None when a quote is not closed or it ends with a
    lone backslash (as shlex raises ValueError for both).

    Separators and redirections come out as tokens (``;``, ``&&``, ``|``, ``>>``,
    ``$`` then ``(`` for a command substitution); quotes are removed and escapes
    applied as in a POSIX shell's words.
    """
    tokens: list[str] = []
    parts: list[str] = []
    word = False  # a word is open (possibly empty: '' or "")
    i = 0
    n = len(command)
    find = command.find
    while i < n:
        c = command[i]
        if c in _BLANK:
            if word:
                tokens.append("".join(parts))
                parts.clear()
                word = False
            i = _BLANKS.match(command, i).end()  # type: ignore[union-attr]
        elif c == "\n":
            if word:
                tokens.append("".join(parts))
                parts.clear()
                word = False
            tokens.append(";")
            i += 1
        elif c == "#" and not word:  # a comment starts a word; inside one it is a letter
            j = find("\n", i)
            i = n if j < 0 else j
        elif c in PUNCTUATION:
            if word:
                tokens.append("".join(parts))
                parts.clear()
                word = False
            m = _PUNCT.match(command, i)
            assert m is not None
            tokens.append(m.group())
            i = m.end()
        elif c == "'":
            j = find("'", i + 1)
            if j < 0:
                return None
            parts.append(command[i + 1 : j])
            word = True
            i = j + 1
        elif c == '"':
            word = True
            i += 1
            while True:
                m = _DQ.match(command, i)
                assert m is not None
                if m.end() > i:
                    parts.append(m.group())
                i = m.end()
                if i >= n:
                    return None
                if command[i] == '"':
                    i += 1
                    break
                if i + 1 >= n:  # a backslash, and nothing after it
                    return None
                nxt = command[i + 1]
                if nxt in '"\\':
                    parts.append(nxt)
                elif nxt != "\n":  # backslash-newline: a continued line, both removed
                    parts.append("\\" + nxt)
                i += 2
        elif c == "\\":
            if i + 1 >= n:
                return None
            nxt = command[i + 1]
            if nxt != "\n":
                parts.append(nxt)
                word = True
            i += 2
        else:
            m = _RUN.match(command, i)
            assert m is not None
            parts.append(m.group())
            word = True
            i = m.end()
    if word:
        tokens.append("".join(parts))
    return tokens
