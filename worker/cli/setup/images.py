"""The images ``loom-worker setup`` makes sure of, and what it builds them from.

Two images are the worker's own, built from the build contexts shipped in the package
(``worker/images``: the repository's ``images/runtime``, ``images/sandbox`` and
``images/base``, so a ``pip install`` has them):

- the **agent runtime** (``LOOM_AGENT_RUNTIME_IMAGE``, ``images/runtime``), mounted into
  every sandbox;
- the **default sandbox image** (``LOOM_IMAGE``) when it is one of ours: a local name
  starting with ``loom-`` (``loom-sandbox:latest`` is the practical variant, a tag
  ``minimal`` the minimal one). Any other image (``python:3.12-slim``) is pulled, as the
  pull policy allows. A practical image (or offline base) built from an older recipe,
  one without what a code context needs (``Recipe.probe``), is built again.

Both build ``FROM`` a Debian bookworm base, the first of these the engine can get:

1. ``--base IMAGE`` when given (pulled if missing, as the policy allows), and nothing else;
2. the offline base already on the engine (``loom-base:bookworm``, ``loom-base-dev:bookworm``
   for the practical sandbox: what ``scripts/setup`` builds), which needs no network;
3. ``debian:bookworm-slim``, on the engine or pulled (policy ``missing`` or ``always``);
   the Dockerfiles install their packages with apt;
4. the offline base built here from Debian packages with debootstrap
   (``images/base/build-base.sh``), when this runs as root with debootstrap installed:
   for a machine that reaches a Debian mirror but no container registry.

Otherwise the step fails, saying what each way answered.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

from .engine import CommandError, DockerCLI

Status = Literal["ok", "done", "skip", "note", "FAIL"]
PullPolicy = Literal["missing", "never", "always"]
PULL_POLICIES: tuple[PullPolicy, ...] = ("missing", "never", "always")

#: The base pulled where a registry can be reached.
REGISTRY_BASE = "debian:bookworm-slim"
#: The offline bases (images/base/build-base.sh): minimal, and with the practical packages.
OFFLINE_BASE = "loom-base:bookworm"
OFFLINE_DEV_BASE = "loom-base-dev:bookworm"


@dataclass
class Step:
    """One line of the report: ``[status] what: detail`` and, for a failure, how to fix it."""

    status: Status
    what: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Recipe:
    """How one of our images is built: its build context (a directory of ``worker/images``),
    its build arguments, and the offline base that already has its packages."""

    what: str
    context: str
    build_args: dict[str, str] = field(default_factory=dict)
    dev: bool = False  # its offline base is the practical one (build-base.sh --dev)
    #: A command that succeeds in an image (or offline base) of this recipe's current
    #: version: one built from an older recipe (a package list that grew) fails it and is
    #: built again.
    probe: tuple[str, ...] = ()

    @property
    def offline_base(self) -> str:
        return OFFLINE_DEV_BASE if self.dev else OFFLINE_BASE


RUNTIME = Recipe("agent runtime image", "runtime")
#: What the practical image has beyond the minimal one's commands since issue 41: a Python
#: code context's kernel and its libraries (images/sandbox/Dockerfile's ``mods``).
PRACTICAL_PROBE = ("python3", "-c", "import ipykernel, jupyter_client, matplotlib, pandas, numpy")


def sandbox_recipe(image: str) -> Recipe | None:
    """The recipe of ``image`` when it is one of ours (a local name starting with
    ``loom-``: no registry serves those), else None (it is pulled)."""
    name = image.split("@", 1)[0]
    name, tag = name.rsplit(":", 1) if ":" in name.rsplit("/", 1)[-1] else (name, "latest")
    if "/" in name or not name.startswith("loom-"):
        return None
    if tag == "minimal":
        return Recipe("sandbox image", "sandbox", {"VARIANT": "minimal"})
    return Recipe("sandbox image", "sandbox", {"VARIANT": "practical"}, dev=True, probe=PRACTICAL_PROBE)


def context_dir(name: str) -> Traversable:
    """A build context shipped in the package (``worker/images/<name>``)."""
    return resources.files("worker") / "images" / name


class Images:
    """Makes images present on one engine; each method returns its :class:`Step`."""

    def __init__(
        self,
        docker: DockerCLI,
        *,
        pull: PullPolicy = "missing",
        base: str | None = None,
        offline_bases: tuple[str, str] = (OFFLINE_BASE, OFFLINE_DEV_BASE),
        say: Callable[[str], None] = lambda _line: None,
        is_root: bool | None = None,
    ) -> None:
        self.docker = docker
        self.pull_policy = pull
        self.base = base
        self.offline_bases = offline_bases
        self.say = say  # a progress line before a long step
        self.is_root = os.geteuid() == 0 if is_root is None else is_root
        self._pulled: dict[str, str | None] = {}  # ref -> None (pulled) or why not

    # -- what the worker needs -------------------------------------------------------------------

    def ensure(self, image: str, recipe: Recipe | None) -> Step:
        """``image`` on the engine: already there, built from ``recipe``, or pulled."""
        what = f"{recipe.what if recipe else 'sandbox image'} {image}"
        stale = ""
        if self.docker.has_image(image) and not (recipe is None and self.pull_policy == "always"):
            if recipe is None or not recipe.probe or self.docker.probe(image, recipe.probe):
                return Step("ok", what, "already there")
            stale = " again: it was built from an older recipe (it lacks what a code context needs)"
        if recipe is None:
            why = self._pull(image)
            if why is None:
                return Step("done", what, f"pulled (pull policy {self.pull_policy})")
            return Step(
                "FAIL",
                what,
                f"not on this engine and not pulled: {why}",
                f"pull or load it yourself (`docker pull {image}`, `docker load -i FILE`), or set LOOM_IMAGE "
                "to an image this engine has",
            )
        base = self.choose_base(recipe)
        if isinstance(base, Step):
            return Step("FAIL", what, base.detail, base.fix)
        base_ref, how = base
        self.say(f"building {what} from {base_ref} ({how}): the first build can take minutes")
        started = time.monotonic()
        try:
            with ExitStack() as stack:
                context = stack.enter_context(resources.as_file(context_dir(recipe.context)))
                self.docker.build(Path(context), image, {"BASE": base_ref, **recipe.build_args})
        except CommandError as e:
            return Step(
                "FAIL", what, f"docker build from {base_ref} failed:\n{_indent(str(e))}", "-v shows the whole build"
            )
        return Step("done", what, f"built{stale} from {base_ref} ({how}) in {time.monotonic() - started:.0f} s")

    # -- bases ------------------------------------------------------------------------------------

    def choose_base(self, recipe: Recipe) -> tuple[str, str] | Step:
        """The base to build ``recipe`` from and how it was got, or a failed Step saying what
        each way answered."""
        if self.base is not None:
            if self.docker.has_image(self.base) and self.pull_policy != "always":
                return self.base, "--base, on this engine"
            why = self._pull(self.base)
            if why is None:
                return self.base, "--base, pulled"
            return Step("FAIL", "base", f"--base {self.base}: {why}", "give a base this engine has or can pull")
        offline = self.offline_bases[1] if recipe.dev else self.offline_bases[0]
        if self.docker.has_image(offline):
            if not recipe.probe or self.docker.probe(offline, recipe.probe):
                return offline, "the offline base, on this engine"
            # An offline base from an older package list: build-base.sh (below) sees its
            # stamp differ and builds it again; a registry's base installs with apt.
        reasons: list[str] = []
        if self.docker.has_image(REGISTRY_BASE) and self.pull_policy != "always":
            return REGISTRY_BASE, "on this engine"
        why = self._pull(REGISTRY_BASE)
        if why is None:
            return REGISTRY_BASE, "pulled"
        reasons.append(f"{REGISTRY_BASE}: {why}")
        why = self._debootstrap(offline, recipe.dev)
        if why is None:
            return offline, "built with debootstrap"
        reasons.append(f"debootstrap: {why}")
        return Step(
            "FAIL",
            "base",
            "no base image to build from: " + "; ".join(reasons),
            f"make a registry reachable (to pull {REGISTRY_BASE}), or run `loom-worker setup` as root with "
            "debootstrap installed (`apt-get install debootstrap`), or put a Debian bookworm image on this "
            "engine (`docker load -i FILE`) and pass it as --base",
        )

    def _pull(self, ref: str) -> str | None:
        """Pull ``ref`` as the policy allows, once per run: None when pulled, else why not."""
        if ref not in self._pulled:
            if self.pull_policy == "never":
                self._pulled[ref] = "not pulled: the pull policy is never (LOOM_PULL / --pull)"
            else:
                self.say(f"pulling {ref}")
                try:
                    self.docker.pull(ref)
                    self._pulled[ref] = None
                except CommandError as e:
                    self._pulled[ref] = "pull failed: " + _last_line(str(e))
        return self._pulled[ref]

    def _debootstrap(self, tag: str, dev: bool) -> str | None:
        """Build the offline base ``tag`` with images/base/build-base.sh: None when built,
        else why not."""
        if not self.is_root:
            return "needs root (debootstrap and docker import of a root filesystem)"
        if shutil.which("debootstrap") is None:
            return "not installed (apt-get install debootstrap)"
        if shutil.which("bash") is None:
            return "bash is not installed"
        self.say(f"building the offline base {tag} from Debian packages (debootstrap); this takes several minutes")
        try:
            with ExitStack() as stack:
                base_dir = Path(stack.enter_context(resources.as_file(context_dir("base"))))
                argv = ["bash", str(base_dir / "build-base.sh"), *(["--dev"] if dev else []), tag]
                self.docker.run(argv, env=self._script_env())
        except CommandError as e:
            return "build-base.sh failed: " + _last_line(str(e))
        return None

    def _script_env(self) -> dict[str, str]:
        env = dict(self.docker.env)
        if self.docker.executable is not None:  # the script calls `docker`: the same one
            env["PATH"] = f"{Path(self.docker.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def _indent(text: str) -> str:
    return "\n".join("       | " + line for line in text.splitlines())
