"""The secrets store, the workspace CA and what a sandbox's spec gets (no Docker)."""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from sandbox.spec import CA_ENV_VARS
from worker.egress.ca import CA_KEY, WorkspaceCA
from worker.egress.policy import EgressPolicy
from worker.egress.provision import SecretsHost, advice
from worker.egress.secrets import PLACEHOLDER, SecretError, SecretUnavailable, parse_entry, parse_template
from worker.egress.secretstore import SecretStore
from worker.workspace_settings import Caps, Configs, SettingsStore, WorkspaceSettings

VALUE = "v4lue-" + "q" * 20


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d.resolve()


def test_a_secret_is_stored_0600_and_keeps_its_placeholder_until_deleted(tmp_path: Path, ws: Path) -> None:
    store = SecretStore(tmp_path / "data")
    one = store.set(ws, "TOKEN", hosts=["api.example.com"], header="Authorization: Bearer {value}", value=VALUE)
    assert PLACEHOLDER.fullmatch(one.placeholder.encode()) and one.placeholder.startswith("loom-secret:TOKEN:")
    path = store.path(ws)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert VALUE not in repr(one) and VALUE not in json.dumps(one.public())
    two = store.set(ws, "TOKEN", hosts=["api.example.com"], header="X-Key: {}", value="other-value-123")
    assert two.placeholder == one.placeholder and store.load(ws)["TOKEN"].secret_value() == "other-value-123"
    assert store.delete(ws, "TOKEN") and not store.delete(ws, "TOKEN")
    three = store.set(ws, "TOKEN", hosts=["api.example.com"], header="X-Key: {}", value=VALUE)
    assert three.placeholder != one.placeholder
    store.set(None, "TOKEN", hosts=["a.example.org"], query="key", value="default-value")
    store.set(None, "SHARED", hosts=["a.example.org"], query="key", value="default-value")
    eff = store.effective(ws)
    assert eff["TOKEN"].scope == "workspace" and eff["SHARED"].scope == "default"
    assert stat.S_IMODE(store.path(None).stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("field", "kw", "words"),
    [
        ("name", {"name": "PATH"}, "the worker sets"),
        ("name", {"name": "HTTPS_PROXY"}, "the worker sets"),
        ("name", {"name": "LD_PRELOAD"}, "the worker sets"),
        ("name", {"name": "SSL_CERT_FILE"}, "the worker sets"),
        ("name", {"name": "9x"}, "variable name"),
        ("hosts", {"hosts": []}, "at least one"),
        ("hosts", {"hosts": ["*.com"]}, "public suffix"),
        ("hosts", {"hosts": ["!api.example.com"]}, "denial"),
        ("hosts", {"hosts": "api.example.com"}, "a list"),
        ("header", {"header": "Authorization: Bearer"}, "exactly one"),
        ("header", {"header": "X: {value} {value}"}, "exactly one"),
        ("header", {"header": "Host: {}"}, "not a header"),
        ("header", {"header": "Bad Name: {}"}, "valid header name"),
        ("header", {"header": "X: {value}\r\nY: 1"}, "one line"),
        ("header", {"header": "X: {oops}"}, "exactly one"),
        ("value", {"value": VALUE + "\n"}, "line breaks"),
        ("value", {"value": VALUE + "\x01"}, "control"),
        ("value", {"value": ""}, "non-empty"),
        ("query", {"header": None, "query": "a b"}, "parameter name"),
    ],
)
def test_refusals_name_the_field_and_never_the_value(
    tmp_path: Path, ws: Path, field: str, kw: dict[str, object], words: str
) -> None:
    args: dict[str, object] = {"name": "TOKEN", "hosts": ["api.example.com"], "header": "X: {}", "value": VALUE}
    args.update(kw)
    store = SecretStore(tmp_path / "data")
    with pytest.raises(SecretError) as e:
        store.set(ws, args.pop("name"), **args)  # type: ignore[arg-type]
    assert e.value.field.split(".")[-1] == field and words in e.value.message, e.value
    assert VALUE not in str(e.value)
    assert not store.path(ws).exists() or "TOKEN" not in store.load(ws)


def test_templates_and_basic_credentials() -> None:
    t = parse_template("Authorization: Basic {x-access-token:value}")
    assert t.name == "Authorization" and t.user == "x-access-token"
    assert t.render("abc") == b"Basic eC1hY2Nlc3MtdG9rZW46YWJj"
    assert parse_template("X-API-Key:{}").render("k") == b"k"
    assert parse_template("Authorization: token {value} (bot)").render("k") == b"token k (bot)"


def test_a_value_file_is_read_at_each_use_and_a_hand_written_entry_works(tmp_path: Path, ws: Path) -> None:
    value_file = tmp_path / "run-secrets" / "tok"
    value_file.parent.mkdir()
    value_file.write_text("from-a-file-123\n")
    store = SecretStore(tmp_path / "data")
    path = store.path(None)
    path.parent.mkdir(parents=True)
    entry = {"hosts": ["api.example.com"], "header": "X-Key: {}", "value_file": str(value_file)}
    path.write_text(json.dumps({"secrets": {"FILED": entry}}))
    s = store.load(None)["FILED"]
    assert s.secret_value() == "from-a-file-123" and PLACEHOLDER.fullmatch(s.placeholder.encode())
    assert store.load(None)["FILED"].placeholder == s.placeholder  # derived, stable
    value_file.write_text("rotated-in-the-file\n")
    assert store.load(None)["FILED"].secret_value() == "rotated-in-the-file"
    value_file.unlink()
    with pytest.raises(SecretUnavailable):
        s.secret_value()
    with pytest.raises(SecretError):
        parse_entry("X", {**entry, "value_file": "relative/path"}, scope="default", where="f")
    path.write_text("{not json")
    with pytest.raises(SecretError):
        store.load(None)
    assert store.effective(ws) == {}  # the gateway goes on without it


def test_the_workspace_ca_signs_leaves_for_the_asked_host_only_and_keeps_its_key(tmp_path: Path) -> None:
    d = tmp_path / "data" / "workspaces" / "abc"
    ca = WorkspaceCA.open(d, "abc")
    assert stat.S_IMODE((d / CA_KEY).stat().st_mode) == 0o600 and stat.S_IMODE(d.stat().st_mode) == 0o700
    assert WorkspaceCA.open(d, "abc").pem == ca.pem  # kept, not remade
    other = WorkspaceCA.open(tmp_path / "data" / "workspaces" / "def", "def")
    assert other.pem != ca.pem  # each workspace its own
    basic = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert basic.ca and basic.path_length == 0
    ctx = ca.server_context("api.example.com")
    assert ca.server_context("api.example.com") is ctx  # cached while valid
    # a client trusting only this CA accepts it for that name, and for no other
    import socket
    import threading

    for name, ok in (("api.example.com", True), ("evil.example.com", False)):
        a, b = socket.socketpair()
        threading.Thread(target=_serve_once, args=(ctx, a), daemon=True).start()
        client = ssl.create_default_context(cadata=ca.pem.decode())
        if ok:
            with client.wrap_socket(b, server_hostname=name) as s:
                leaf = x509.load_der_x509_certificate(s.getpeercert(binary_form=True) or b"")
            lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
            assert lifetime <= datetime.timedelta(hours=24, minutes=5)
            san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert san.get_values_for_type(x509.DNSName) == ["api.example.com"]
        else:
            with pytest.raises(ssl.SSLCertVerificationError):
                client.wrap_socket(b, server_hostname=name)
        b.close()


def _serve_once(ctx: ssl.SSLContext, sock: object) -> None:
    try:
        with ctx.wrap_socket(sock, server_side=True) as s:  # type: ignore[arg-type]
            s.recv(1)
    except (OSError, ssl.SSLError):
        pass


def test_a_sandbox_allowed_out_gets_placeholders_and_the_trust_bundle_not_the_key(tmp_path: Path, ws: Path) -> None:
    data = tmp_path / "data"
    host = SecretsHost(data)
    store = SettingsStore(data)
    base_bundle = tmp_path / "base.pem"
    base_bundle.write_text("-----BEGIN CERTIFICATE-----\nbase\n-----END CERTIFICATE-----\n")
    configs = Configs(
        store,
        {"image": "i:1", "ca_bundle": str(base_bundle)},
        Caps(),
        egress_socket_dir=lambda root: tmp_path / "egress" / "key",
        secrets=host,
    )
    store.save(ws, WorkspaceSettings(egress=["api.example.com"]))
    before = configs.spec(ws)
    assert before.ca_bundle == str(base_bundle) and not before.env  # no secret yet: nothing changes
    store.load(ws)
    assert not store.changed(ws)
    placeholder = host.store.set(ws, "TOKEN", hosts=["api.example.com"], header="X: {}", value=VALUE).placeholder
    assert store.changed(ws)  # a new secret is a change of the sandbox's settings
    spec = configs.spec(ws)
    assert spec.env == {"TOKEN": placeholder}
    assert spec.environment(1000)["TOKEN"] == placeholder
    assert all(spec.environment(1000)[v] == "/etc/loom/ca-bundle.pem" for v in CA_ENV_VARS)
    bundle = Path(spec.ca_bundle or "")
    text = bundle.read_text()
    assert bundle.parent == tmp_path / "egress" and stat.S_IMODE(bundle.stat().st_mode) == 0o644
    assert text.startswith("-----BEGIN CERTIFICATE-----\nbase") and host.ca(ws).pem.decode() in text
    assert "PRIVATE KEY" not in text and VALUE not in text
    host.store.set(ws, "TOKEN", hosts=["api.example.com"], header="X: {}", value="rotated-value-1")
    assert configs.spec(ws) == spec  # a rotated value: the same sandbox
    store.save(ws, WorkspaceSettings(egress=[]))
    assert not configs.spec(ws).env  # no egress, no placeholders: nothing could use them


def test_advice_says_when_the_allowlist_keeps_a_secret_from_being_used(tmp_path: Path, ws: Path) -> None:
    s = SecretStore(tmp_path / "d").set(
        ws, "T", hosts=["api.example.com", "*.example.org"], header="X: {}", value=VALUE
    )
    assert "no egress allowlist" in advice(s, True, EgressPolicy())
    text = advice(s, False, EgressPolicy.parse(["api.example.com"]))
    assert "next request" in text and "*.example.org" in text and "api.example.com," not in text
    assert "allowlist" not in advice(s, True, EgressPolicy.parse(["api.example.com", "*.example.org"]))


def test_console_tracebacks_show_no_local_variables() -> None:
    from worker.logging import configure_logging

    buf = io.StringIO()
    configure_logging("console", "info", stream=buf)
    try:
        credential = "-".join(["local", "credential", "z" * 3])  # (the source shows no such string)
        raise ValueError("boom " + str(len(credential)))
    except ValueError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    finally:
        logging.getLogger().handlers.clear()
    assert "boom" in buf.getvalue() and "local-credential-zzz" not in buf.getvalue()


def test_the_leaf_key_never_touches_a_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    real_open = os.open

    def spy(path: object, *a: object, **kw: object) -> int:
        written.append(str(path))
        return real_open(path, *a, **kw)  # type: ignore[arg-type]

    ca = WorkspaceCA.open(tmp_path / "ca", "x")
    monkeypatch.setattr(os, "open", spy)
    ca.server_context("api.example.com")
    assert written == []  # a memfd, read through /proc/self/fd (no file is made: tempfile would os.open)
