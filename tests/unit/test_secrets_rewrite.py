"""What the gateway does to an intercepted request and its answer (pure functions)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.egress.rewrite import BodyScan, Masker, authority, rewrite_request
from worker.egress.secrets import Secret
from worker.egress.secretstore import SecretStore

VALUE = "the-real-value-0123"


@pytest.fixture
def secrets(tmp_path: Path) -> dict[str, Secret]:
    store = SecretStore(tmp_path)
    store.set(None, "TOKEN", hosts=["api.example.com"], header="Authorization: Bearer {value}", value=VALUE)
    store.set(None, "GIT", hosts=["git.example.com"], header="Authorization: Basic {git:value}", value="pw-12345678")
    store.set(None, "KEY", hosts=["maps.example.com"], query="key", value="k/v&=?12345")
    store.set(None, "ELSE", hosts=["else.example.com"], header="X-Else: {}", value="else-value-1234")
    return store.load(None)


def ph(secrets: dict[str, Secret], name: str) -> bytes:
    return secrets[name].placeholder.encode()


def test_the_header_is_added_or_the_placeholder_replaced_in_header_values_only(secrets: dict[str, Secret]) -> None:
    rw = rewrite_request([(b"Host", b"api.example.com")], b"/a", "api.example.com", 443, secrets)
    assert (b"Authorization", b"Bearer " + VALUE.encode()) in rw.headers and rw.target == b"/a"
    assert [(u.secret, u.verdict) for u in rw.uses] == [("TOKEN", "allowed")]
    tok = ph(secrets, "TOKEN")
    rw = rewrite_request(
        [(b"X-Token", b"t=" + tok), (b"authorization", b"mine")], b"/?q=" + tok, "api.example.com", 443, secrets
    )
    assert rw.headers[0] == (b"X-Token", b"t=" + VALUE.encode())
    assert (b"authorization", b"mine") in rw.headers and len(rw.headers) == 2  # its own kept, none added
    assert rw.target == b"/?q=" + tok
    assert any(u.verdict == "denied" and "the URL" in u.reason for u in rw.uses)
    # another host: nothing added, the placeholder goes as it is and is noted
    rw = rewrite_request([(b"Authorization", b"Bearer " + tok)], b"/", "evil.example.com", 443, secrets)
    assert rw.headers == [(b"Authorization", b"Bearer " + tok)] and not rw.masks
    assert [u.reason for u in rw.uses] == [
        "placeholder sent to evil.example.com:443, not one of its hosts: sent unchanged"
    ]
    # a port the secret is not for
    assert rewrite_request([], b"/", "api.example.com", 8443, secrets).headers == []


def test_basic_credentials_are_built_or_rewritten_inside_base64(secrets: dict[str, Secret]) -> None:
    rw = rewrite_request([], b"/info/refs", "git.example.com", 443, secrets)
    assert rw.headers == [(b"Authorization", b"Basic " + base64.b64encode(b"git:pw-12345678"))]
    mine = base64.b64encode(b"me:" + ph(secrets, "GIT"))
    rw = rewrite_request([(b"Authorization", b"Basic " + mine)], b"/", "git.example.com", 443, secrets)
    assert rw.headers == [(b"Authorization", b"Basic " + base64.b64encode(b"me:pw-12345678"))]
    assert rw.masks[base64.b64encode(b"me:pw-12345678")] == mine  # masked back should it come back


def test_a_query_parameter_is_set_or_its_placeholder_replaced(secrets: dict[str, Secret]) -> None:
    enc = b"k%2Fv%26%3D%3F12345"
    assert rewrite_request([], b"/m", "maps.example.com", 443, secrets).target == b"/m?key=" + enc
    assert rewrite_request([], b"/m?", "maps.example.com", 443, secrets).target == b"/m?key=" + enc
    key = ph(secrets, "KEY")
    assert rewrite_request([], b"/m?a=1&key=" + key, "maps.example.com", 443, secrets).target == b"/m?a=1&key=" + enc
    quoted = key.replace(b":", b"%3A")
    assert rewrite_request([], b"/m?key=" + quoted, "maps.example.com", 443, secrets).target == b"/m?key=" + enc
    rw = rewrite_request([], b"/m?key=own&x=" + key, "maps.example.com", 443, secrets)
    assert rw.target == b"/m?key=own&x=" + key and any("the URL" in u.reason for u in rw.uses)


def test_unknown_and_foreign_placeholders_are_noted_once(secrets: dict[str, Secret]) -> None:
    gone = b"loom-secret:GONE:" + b"a" * 32
    hdrs = [(b"X-A", gone), (b"X-B", gone), (b"X-C", ph(secrets, "ELSE"))]
    rw = rewrite_request(hdrs, b"/", "api.example.com", 443, secrets)
    reasons = [u.reason for u in rw.uses if u.verdict == "denied"]
    assert len(reasons) == 3  # GONE in two headers: one note for each place, ELSE once
    assert sum("no secret here (GONE)" in r for r in reasons) == 2 and [u.secret for u in rw.uses][-1] == "TOKEN"


def test_the_masker_masks_values_split_across_chunks_and_holds_back_only_a_possible_start() -> None:
    m = Masker({b"SECRETVALUE1": b"loom-secret:T:x"})
    assert m.headers([(b"X", b"a SECRETVALUE1 b")]) == [(b"X", b"a loom-secret:T:x b")]
    out = (
        m.feed(b"data: hello\n\n") + m.feed(b"xx SECRET") + m.feed(b"VALUE1 yy SEC") + m.feed(b"RETVALUE1") + m.finish()
    )
    assert out == b"data: hello\n\nxx ************ yy ************"
    streaming = Masker({b"SECRETVALUE1": b"p"})
    assert streaming.feed(b"event: 1\n\n") == b"event: 1\n\n"  # nothing held: a streamed line goes at once
    assert streaming.feed(b"ends with SECR") == b"ends with " and streaming.finish() == b"SECR"
    assert Masker({b"short": b"p"}).feed(b"short") == b"short"  # too short to mask


@given(st.lists(st.binary(max_size=40), max_size=12), st.sampled_from([b"", b"0123456789ABC"]))
def test_the_masker_keeps_every_byte_but_the_values(chunks: list[bytes], needle_in: bytes) -> None:
    needle = b"0123456789ABC"
    m = Masker({needle: b"p"})
    data = b"".join(chunks) + needle_in
    parts = [*chunks, needle_in]
    out = b"".join(m.feed(c) for c in parts) + m.finish()
    assert len(out) == len(data) and needle not in out
    assert out == data.replace(needle, b"*" * len(needle))


def test_the_body_scan_finds_a_placeholder_split_across_chunks() -> None:
    scan = BodyScan()
    p = b"loom-secret:TOKEN:" + b"b" * 32
    for chunk in (b"x" * 100 + p[:10], p[10:30], p[30:] + b"tail"):
        scan.feed(chunk)
    assert scan.found == {p}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("api.example.com", ("api.example.com", 443)),
        ("API.example.com.:8443", ("api.example.com", 8443)),
        ("[::1]:443", ("::1", 443)),
        ("a:b", None),
    ],
)
def test_authority(text: str, want: tuple[str, int] | None) -> None:
    assert authority(text, 443) == want
