"""The Python ``porter unicode61`` tokenizer (worker.catalog.stem) agrees with SQLite's.

FAST search explains matches from terms computed in Python; these tests compare them
term for term with what FTS5 itself indexes (read back through ``fts5vocab``)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest
import yaml

from worker.catalog.stem import padded, stem, stems, tokens

FIXTURE = Path(__file__).parent.parent / "fixtures" / "catalog_tools.yaml"

ROOTS = (
    "connect relat gener hop fil happ sky agre feed conflat troubl siz fall hiss fizz fail cry run controll "
    "roll rate ceas probat electr format sensit adjust depend adopt homolog commun activ angular effect "
    "bowdler valen hesit digit conform radic differ vile analog predic oper feud decis call triplic "
    "revive allow infer airlin gyroscop defens irrit replac plaster bled motor sing tann pony tie caress"
).split()
SUFFIXES = (
    " s es ies sses ed eed ing ational tional enci anci izer logi bli alli entli eli ousli ization ation "
    "ator alism iveness fulness ousness aliti iviti biliti icate ative alize iciti ical ful ness al ance "
    "ence er ic able ible ant ement ment ent ion sion tion ou ism ate iti ous ive ize e y ly ll at bl iz"
).split(" ")
CLASSIC = (
    "caresses ponies ties caress cats feed agreed plastered bled motoring sing conflated troubled sized "
    "hopping tanned falling hissing fizzed failing filing happy sky relational conditional rational "
    "valenci hesitanci digitizer conformabli radicalli differentli vileli analogousli vietnamization "
    "predication operator feudalism decisiveness hopefulness callousness formaliti sensitiviti "
    "sensibiliti triplicate formative formalize electriciti electrical hopeful goodness revival "
    "allowance inference airliner gyroscopic adjustable defensible irritant replacement adjustment "
    "dependent adoption homologou communism activate angulariti homologous effective bowdlerize probate "
    "rate cease controll roll generalizations oscillators yes eye ayes by bye aye ed ing eed xed"
).split()


def sqlite_terms(texts: list[str]) -> list[list[str]]:
    """The terms FTS5 ``porter unicode61`` indexes for each text, in order."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE f USING fts5(x, tokenize='porter unicode61')")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(f, 'instance')")
    db.executemany("INSERT INTO f(rowid, x) VALUES (?, ?)", list(enumerate(texts)))
    out: list[list[str]] = [[] for _ in texts]
    for doc, term in db.execute("SELECT doc, term FROM v ORDER BY doc, offset"):
        out[doc].append(term)
    db.close()
    return out


def vocabulary() -> list[str]:
    rnd = random.Random(6)
    words = {r + s for r in ROOTS for s in SUFFIXES} | set(CLASSIC)
    # Random words over a vowel-heavy alphabet reach the measure and *o conditions in
    # every combination; lengths cover the unstemmed (< 3, > 64 bytes) ends too.
    alphabet = "aeiouybcdlmnrstwxz"
    for _ in range(4000):
        words.add("".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 14))))
    words |= {"x" * 64 + "ing", "a" * 63 + "ing", "ab", "a", "x86", "2fa", "k8s", "ipv6ing"}
    doc = yaml.safe_load(FIXTURE.read_text())
    for t in doc["tools"]:
        words.update(tokens(t["name"] + " " + t["description"]))
    return sorted(words)


def test_stem_matches_sqlite_porter() -> None:
    words = vocabulary()
    assert len(words) > 5000
    expected = sqlite_terms(words)
    wrong = [(w, e, [stem(w)]) for w, e in zip(words, expected, strict=True) if e != [stem(w)]]
    assert wrong == []


@pytest.mark.parametrize(
    "text",
    [
        "readFile snake_case kebab-case CamelCaseName",
        '["file_io","search","web_search"]',
        "Send messages to Slack channels; v2.1 API (beta) -- 100% done!",
        "Café résumé naïve Ångström ÉCOLE crème brûlée",
        "e\u0301cole cafe\u0301s",  # combining accents
        "Σίσυφος ΟΔΟΣ Ελλάδα",
        "Привет мир файлы",
        "名前 ファイル 検索する",
        "emoji 🎉 party ⚙️ settings",
        "straße ÜBER-cool ñandú",
        "",
        "___ --- ...",
        "connections' connecting\u2019s",
    ],
)
def test_tokens_match_sqlite_unicode61(text: str) -> None:
    assert stems(text) == sqlite_terms([text])[0]


def test_random_mixed_text_matches_sqlite() -> None:
    rnd = random.Random(11)
    alphabet = "abcdeéfgiloñrstyÜßØø_- .,'0123456789Ab"
    texts = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40))) for _ in range(2000)]
    expected = sqlite_terms(texts)
    assert [t for t, e in zip(texts, expected, strict=True) if stems(t) != e] == []


def test_padded_phrases_do_not_match_inside_words() -> None:
    field = padded("Send notifications to the on-call engineers")
    assert field == " send notif to the on call engin "
    assert padded("notification") in field and padded("engineering") in field
    assert padded("on-call") in field  # a phrase: consecutive terms
    assert padded("call on") not in field and padded("not") not in field and padded("end") not in field
