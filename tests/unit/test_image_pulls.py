"""Image pulls without an engine: registry names, the allowlist setting, how the engine's
answers are read, progress sums, the CLI's progress lines (tests/docker/test_image_pull.py
pulls for real)."""

from __future__ import annotations

import io

import pytest

from sandbox.docker.images import _Progress, classify, registry_of
from sandbox.pulls import PullEvent, parse_registries, reference_problem
from sandbox.spec import SandboxSpec
from worker.cli.pullbar import PullBar
from worker.settings import Settings


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("python:3.12-slim", "docker.io"),
        ("library/python", "docker.io"),
        ("docker.io/library/python:3.12", "docker.io"),
        ("index.docker.io/org/app", "docker.io"),
        ("org/app@sha256:" + "a" * 64, "docker.io"),
        ("ghcr.io/org/app:1", "ghcr.io"),
        ("localhost:5000/app", "localhost:5000"),
        ("127.0.0.1:5000/x/y:tag", "127.0.0.1:5000"),
        ("Registry.Example.com/app", "registry.example.com"),
    ],
)
def test_the_registry_of_an_image_name(image: str, registry: str) -> None:
    assert registry_of(image) == registry


@pytest.mark.parametrize("image", ["", " python", "two words", "-bad.host/x"])
def test_names_the_engine_would_not_take(image: str) -> None:
    with pytest.raises(ValueError, match="not an image name"):
        registry_of(image)


GOOD = [
    "python:3.12-slim",
    "ghcr.io/org/app:1",
    "loom-sandbox:latest",
    "localhost:5000/a/b:c",
    "127.0.0.1:5000/x",
    "[::1]:5000/x:y",
    "Registry.Example.com/app",
    "org/app@sha256:" + "a" * 64,
    "sha256:" + "a" * 64,  # an image ID
    "0555a27b9d32",  # a short one
    "a__b/c-d.e",
    "x:" + "t" * 128,
]
BAD = [
    ".",
    "..",
    "a/..",
    "../",
    "./x",
    "a/./b",
    "a..b",
    "/x",
    "x/",
    "a//b",
    "-a",
    "a-",
    "Abc",
    "x:",
    "x@",
    "x:-y",
    "x:y:z",
    "x:" + "t" * 129,
    "x@sha256:abc",
    "%2e",
    "a b",
    "a" * 256,
    "?",
    "#",
]


@pytest.mark.parametrize("image", GOOD)
def test_image_references_the_engine_takes(image: str) -> None:
    assert reference_problem(image) is None


@pytest.mark.parametrize("image", BAD)
def test_image_references_refused_before_the_engine_is_asked(image: str) -> None:
    """Asked about ``.`` or ``a/..``, the engine's inspect URL becomes its image list (an API
    fuzzer's 500); the distribution project's grammar refuses them first."""
    assert reference_problem(image) is not None
    from worker.workspace_settings import SettingsError, parse

    with pytest.raises(SettingsError) as e:
        parse({"image": image})
    assert e.value.field == "image"
    with pytest.raises(ValueError, match="image"):
        Settings(image=image)


async def test_the_puller_does_not_ask_the_engine_about_a_bad_reference() -> None:
    from sandbox.docker.images import ImagePuller
    from sandbox.errors import ImagePullError

    class NoEngine:
        def client(self) -> None:
            raise AssertionError("the engine was asked")

    puller = ImagePuller(NoEngine())  # type: ignore[arg-type]
    assert await puller.has(".") is False
    with pytest.raises(ImagePullError) as e:
        await puller.ensure("a/..", policy="missing", registries=("docker.io",))
    assert e.value.reason == "invalid" and "not an image reference" in str(e.value)


def test_the_registries_setting() -> None:
    assert parse_registries("docker.io, GHCR.io ,127.0.0.1:5000,,index.docker.io") == (
        "docker.io",
        "ghcr.io",
        "127.0.0.1:5000",
    )
    assert parse_registries("") == ()
    for bad in ("https://ghcr.io", "ghcr.io/org", "a b"):
        with pytest.raises(ValueError, match="host or host:port"):
            parse_registries(bad)
    s = Settings(pull="always", registries="ghcr.io, docker.io")
    assert (s.sandbox_spec_kwargs()["pull"], s.sandbox_spec_kwargs()["registries"]) == (
        "always",
        ("ghcr.io", "docker.io"),
    )
    with pytest.raises(ValueError, match="registries"):
        Settings(registries="https://ghcr.io")
    with pytest.raises(ValueError, match="pull"):
        Settings(pull="sometimes")  # type: ignore[arg-type]
    # How images are fetched is not what a container is: changing it replaces none.
    assert SandboxSpec(pull="never", registries=("ghcr.io",)).fingerprint() == SandboxSpec().fingerprint()
    assert SandboxSpec(registries=("Index.Docker.io", "docker.io")).registries == ("docker.io",)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("manifest for 127.0.0.1:5000/x:nope not found: manifest unknown: manifest unknown", "not_found"),
        ("pull access denied for nosuch, repository does not exist or may require 'docker login'", "not_found"),
        ("Head https://r/v2/x/manifests/1: unauthorized: authentication required", "unauthorized"),
        ("Get https://r/v2/: no basic auth credentials", "unauthorized"),
        ('Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused', "unreachable"),
        ("Get https://nosuch.example/v2/: dial tcp: lookup nosuch.example: no such host", "unreachable"),
        ("invalid reference format: repository name must be lowercase", "invalid"),
        ("something else entirely", "failed"),
    ],
)
def test_the_engines_answers_are_read(answer: str, reason: str) -> None:
    assert classify(answer) == reason


def test_progress_sums_the_layers() -> None:
    p = _Progress()
    for msg in [
        {"status": "Pulling from loom/x", "id": "v1"},
        {"status": "Pulling fs layer", "id": "a", "progressDetail": {}},
        {"status": "Already exists", "id": "b", "progressDetail": {}},
        {"status": "Downloading", "id": "a", "progressDetail": {"current": 100, "total": 400}},
    ]:
        p.feed(msg)
    e = p.event("x", "r")
    assert (e.layers, e.layers_done, e.bytes_done, e.bytes_total, e.status) == (2, 1, 100, 400, "Downloading")
    p.feed({"status": "Download complete", "id": "a"})
    p.feed({"status": "Pull complete", "id": "a"})
    p.feed({"status": "Digest: sha256:abc"})
    e = p.event("x", "r")
    assert (e.layers, e.layers_done, e.bytes_done, e.bytes_total) == (2, 2, 400, 400)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_cli_draws_a_pull() -> None:
    events = [
        PullEvent("img:1", "docker.io", "pulling", layers=2, bytes_done=0, bytes_total=0),
        PullEvent(
            "img:1", "docker.io", "pulling", layers=2, layers_done=1, bytes_done=5_000_000, bytes_total=10_000_000
        ),
        PullEvent("img:1", "docker.io", "done", layers=2, layers_done=2, bytes_done=10_000_000, bytes_total=10_000_000),
    ]
    plain = io.StringIO()
    bar = PullBar(plain)
    for e in events:
        bar(e.as_dict())  # as a local worker's frames carry them
    assert plain.getvalue() == "pulling img:1 from docker.io\npulled img:1 (10.0 MB, 2 layers)\n"
    tty = _Tty()
    bar = PullBar(tty)
    for e in events:
        bar(e)
    out = tty.getvalue()
    assert "\r\x1b[Kpulling img:1  [############............]  50%  5.0/10.0 MB  1/2 layers" in out
    assert out.endswith("\r\x1b[Kpulled img:1 (10.0 MB, 2 layers)\n")
    failed = io.StringIO()
    PullBar(failed)(PullEvent("img:2", "ghcr.io", "failed", reason="not_found", error="image img:2 could not..."))
    assert failed.getvalue() == "pull of img:2 failed: image img:2 could not...\n"
