"""Image pulls as the rest of the program sees them, without the Docker SDK: the progress
event, the per-call sink for it, and the names of registries (:mod:`sandbox.docker.images`
does the pulling)."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any, Literal

#: Where the engine pulls a name without a registry from, and the other names it goes by.
DOCKER_HUB = "docker.io"
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


# An image reference as the engine parses it: the grammar of the distribution project's
# ``reference`` package (regexp.go), which Docker and containerd use; written out here
# because neither the Docker SDK nor the standard library has a checker. An image ID
# (``sha256:<hex>`` or its short hex form) fits it too.
_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|-+)"
_PATH = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?:{_HOST}/)?{_PATH}(?:/{_PATH})*(?::{_TAG})?(?:@{_DIGEST})?")
#: The engine's longest repository name.
MAX_NAME = 255


def reference_problem(image: str) -> str | None:
    """What makes ``image`` not an image reference the engine takes (``python:3.12-slim``,
    ``ghcr.io/org/app:1``, ``name@sha256:...``, an image ID), or None. A name the engine
    would refuse (upper case, ``..``, a path) is refused here first: asked about it, the
    engine can answer with another resource (``.`` lists every image)."""
    if _REFERENCE.fullmatch(image) is None:
        return f"{image!r} is not an image reference (e.g. python:3.12-slim, ghcr.io/org/app:1, name@sha256:...)"
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:  # the tag
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    if len(name) > MAX_NAME:
        return f"{image!r} is not an image reference: its name is longer than {MAX_NAME} characters"
    return None


def check_reference(image: str) -> str:
    """``image`` if :func:`reference_problem` finds nothing, for validators. Raises
    ValueError saying what is wrong."""
    problem = reference_problem(image)
    if problem is not None:
        raise ValueError(problem)
    return image


@dataclass(frozen=True)
class PullEvent:
    """How one pull is going. ``state`` is ``pulling`` until one ``done`` or ``failed``."""

    image: str
    registry: str
    state: Literal["pulling", "done", "failed"]
    layers: int = 0
    layers_done: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    #: The engine's last status line ("Downloading", "Extracting", "Pull complete"...).
    status: str = ""
    #: When ``failed``: why (an :class:`~sandbox.errors.ImagePullError` reason) and the message.
    reason: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The current call's own progress sink, set by whoever runs the call (the CLI's local
#: worker hands the events to its client, which draws them). None: only the backend's
#: listeners get them.
PULL_SINK: ContextVar[Callable[[PullEvent], None] | None] = ContextVar("loom_pull_sink", default=None)


def normalize_registry(name: str) -> str:
    """A registry as :func:`registry_of` names it (Docker Hub's aliases are ``docker.io``)."""
    name = name.strip().lower()
    return DOCKER_HUB if name in _HUB_ALIASES else name


def parse_registries(text: str) -> tuple[str, ...]:
    """``LOOM_REGISTRIES`` ("docker.io, ghcr.io, 127.0.0.1:5000"; "" for none) as a tuple.
    Raises ValueError naming an entry that is not a registry host[:port]."""
    out: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if "/" in entry or "://" in entry or any(c.isspace() for c in entry) or entry.startswith("-"):
            raise ValueError(f"registry {entry!r}: give a host or host:port as image names write it (e.g. ghcr.io)")
        out.append(normalize_registry(entry))
    return tuple(dict.fromkeys(out))
