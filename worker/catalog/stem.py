"""The FTS5 ``porter unicode61`` tokenizer, reproduced in Python for match explanations.

FAST search asks SQLite only for the best rows by BM25; which query word matched which
field (``match_reason`` and confidence) is worked out here, on those few rows, instead
of with FTS5 ``highlight()`` on every matching row (which cost most of a query). For
that to agree with the index, a field's tokens must be what FTS5 indexed: split like
``unicode61`` (letters and digits are token characters, everything else separates; no
camelCase or ``_`` splitting beyond that), folded to lower case without diacritics,
then stemmed with SQLite's own Porter stemmer (``ext/fts5/fts5_tokenize.c``: the
classic algorithm, byte-wise on UTF-8, tokens under 3 or over 64 bytes unstemmed).

ASCII text is reproduced exactly (tests compare against SQLite's ``fts5vocab``). Exotic
Unicode (folds outside Latin, private-use characters) may differ; the only consequence
is a less precise ``match_reason``, never a wrong result set: which rows match is
always decided by FTS5 itself.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache

_ASCII_TOKEN = re.compile(r"[a-z0-9]+")
# Python's [^\W_] is letters and numbers (unicode61's default "L* N*"); combining
# diacritics continue a token, as in unicode61.
_TOKEN = re.compile(r"[^\W_](?:[^\W_]|[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\ufe20-\ufe2f])*")
_MAX_TOKEN = 64  # FTS5_PORTER_MAX_TOKEN, in bytes


# -- Porter stemmer (as in SQLite's fts5_tokenize.c) -----------------------------------


def _vowel(c: str, y_is_vowel: bool) -> bool:
    return c in "aeiou" or (y_is_vowel and c == "y")


def _gobble_vc(s: str, start: int, end: int, prev_cons: bool) -> int:
    """Index just past the first vowel-then-consonant run in ``s[start:end]``, else 0."""
    cons = prev_cons
    i = start
    while i < end:
        cons = not _vowel(s[i], cons)
        if not cons:
            break
        i += 1
    i += 1
    while i < end:
        cons = not _vowel(s[i], cons)
        if cons:
            return i + 1
        i += 1
    return 0


def _m_gt0(s: str, n: int) -> bool:
    return _gobble_vc(s, 0, n, False) != 0


def _m_gt1(s: str, n: int) -> bool:
    k = _gobble_vc(s, 0, n, False)
    return bool(k) and _gobble_vc(s, k, n, True) != 0


def _m_eq1(s: str, n: int) -> bool:
    k = _gobble_vc(s, 0, n, False)
    return bool(k) and _gobble_vc(s, k, n, True) == 0


def _o_star(s: str, n: int) -> bool:
    """Ends consonant-vowel-consonant, the last not w, x or y."""
    if s[n - 1] in "wxy":
        return False
    mask = 0
    cons = False
    for i in range(n):
        cons = not _vowel(s[i], cons)
        mask = (mask << 1) + cons
    return (mask & 7) == 5


def _m_gt1_s_or_t(s: str, n: int) -> bool:
    return s[n - 1] in "st" and _m_gt1(s, n)


def _has_vowel(s: str, n: int) -> bool:
    return any(_vowel(s[i], i > 0) for i in range(n))


_Rule = tuple[str, Callable[[str, int], bool], str]
# Within a step the first suffix that matches (the word strictly longer than it) decides,
# whether or not its condition then holds, exactly as the C else-if chains do.
_STEP2: tuple[_Rule, ...] = tuple(
    (suf, _m_gt0, rep)
    for suf, rep in (
        ("ational", "ate"),
        ("tional", "tion"),
        ("enci", "ence"),
        ("anci", "ance"),
        ("izer", "ize"),
        ("logi", "log"),
        ("bli", "ble"),
        ("alli", "al"),
        ("entli", "ent"),
        ("eli", "e"),
        ("ousli", "ous"),
        ("ization", "ize"),
        ("ation", "ate"),
        ("ator", "ate"),
        ("alism", "al"),
        ("iveness", "ive"),
        ("fulness", "ful"),
        ("ousness", "ous"),
        ("aliti", "al"),
        ("iviti", "ive"),
        ("biliti", "ble"),
    )
)
_STEP3: tuple[_Rule, ...] = tuple(
    (suf, _m_gt0, rep)
    for suf, rep in (
        ("ical", "ic"),
        ("ness", ""),
        ("icate", "ic"),
        ("iciti", "ic"),
        ("ful", ""),
        ("ative", ""),
        ("alize", "al"),
    )
)
_STEP4: tuple[_Rule, ...] = tuple(
    (suf, _m_gt1_s_or_t if suf == "ion" else _m_gt1, "")
    for suf in ("al ance ence er ic able ible ant ement ment ent ion ou ism ate iti ous ive ize".split())
)


def _apply(s: str, rules: tuple[_Rule, ...]) -> tuple[str, bool]:
    """(word, whether a rule was applied) after the first rule whose suffix matches."""
    n = len(s)
    for suf, cond, rep in rules:
        k = len(suf)
        if n > k and s.endswith(suf):
            if cond(s, n - k):
                return s[: n - k] + rep, True
            return s, False
    return s, False


def _porter(s: str) -> str:
    n = len(s)
    # Step 1a
    if s[-1] == "s":
        if s[-2] == "e":
            if (n > 4 and s[-4:-2] == "ss") or (n > 3 and s[-3] == "i"):
                s = s[:-2]
            else:
                s = s[:-1]
        elif s[-2] != "s":
            s = s[:-1]
    # Step 1b
    applied = False
    n = len(s)
    if n > 3 and s.endswith("eed"):
        if _m_gt0(s, n - 3):
            s = s[:-1]
    elif n > 2 and s.endswith("ed"):
        if _has_vowel(s, n - 2):
            s, applied = s[:-2], True
    elif n > 3 and s.endswith("ing"):
        if _has_vowel(s, n - 3):
            s, applied = s[:-3], True
    if applied:
        n = len(s)
        if n > 2 and s[-2:] in ("at", "bl", "iz"):
            s += "e"
        else:
            c = s[-1]
            if not _vowel(c, False) and c not in "lsz" and n > 1 and c == s[-2]:
                s = s[:-1]
            elif _m_eq1(s, n) and _o_star(s, n):
                s += "e"
    # Step 1c
    if s[-1] == "y" and _has_vowel(s, len(s) - 1):
        s = s[:-1] + "i"
    # Steps 2 to 4
    s = _apply(s, _STEP2)[0]
    s = _apply(s, _STEP3)[0]
    s = _apply(s, _STEP4)[0]
    # Step 5a
    n = len(s)
    if s[-1] == "e" and (_m_gt1(s, n - 1) or (_m_eq1(s, n - 1) and not _o_star(s, n - 1))):
        s = s[:-1]
    # Step 5b
    n = len(s)
    if n > 1 and s[-1] == "l" and s[-2] == "l" and _m_gt1(s, n - 1):
        s = s[:-1]
    return s


@lru_cache(maxsize=65536)
def stem(token: str) -> str:
    """The Porter stem of one folded token, as FTS5's ``porter`` tokenizer makes it."""
    if token.isascii():
        return token if not 3 <= len(token) <= _MAX_TOKEN else _porter(token)
    # The C stemmer works on UTF-8 bytes; non-ASCII bytes are consonants to it.
    raw = token.encode()
    if not 3 <= len(raw) <= _MAX_TOKEN:
        return token
    return _porter(raw.decode("latin-1")).encode("latin-1").decode("utf-8", "replace")


# -- unicode61 tokens --------------------------------------------------------------------


@lru_cache(maxsize=8192)
def _fold_char(c: str) -> str:
    """A non-ASCII character as unicode61 folds it: a Latin letter loses its diacritics
    ("é" -> "e"), a lone diacritic is dropped, final sigma is sigma; others are kept."""
    if unicodedata.combining(c):
        return ""
    if c == "\u03c2":
        return "\u03c3"
    d = unicodedata.normalize("NFD", c)
    if len(d) > 1 and d[0].isascii() and all(unicodedata.combining(x) for x in d[1:]):
        return d[0]
    return c


def tokens(text: str) -> list[str]:
    """The folded (not yet stemmed) tokens ``unicode61`` makes of ``text``."""
    low = text.lower()
    if low.isascii():
        return _ASCII_TOKEN.findall(low)
    out = []
    for t in _TOKEN.findall(low):
        if not t.isascii():
            t = "".join(_fold_char(c) if ord(c) > 127 else c for c in t)
        if t:
            out.append(t)
    return out


def stems(text: str) -> list[str]:
    """The terms FTS5 (``porter unicode61``) indexes for ``text``, in order."""
    return [stem(t) for t in tokens(text)]


def padded(text: str) -> str:
    """``text``'s terms as ``" a b c "``: a phrase ``" a b "`` occurs in it as a substring
    exactly when FTS5 would match it as a phrase."""
    low = text.lower()
    if low.isascii():  # the common case, without the Unicode folding of tokens()
        return " " + " ".join(map(stem, _ASCII_TOKEN.findall(low))) + " "
    return " " + " ".join(map(stem, tokens(text))) + " "
