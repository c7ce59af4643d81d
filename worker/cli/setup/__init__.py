"""``loom-worker setup``: on a machine that already has Docker, build or fetch what the
worker needs, and say what was done.

Steps, each reported as ``[ok]`` (already there), ``[done]`` (built, pulled, written now),
``[skip]`` (not needed, and why), ``[note]`` or ``[FAIL]`` (what is missing, and how to
get it):

1. the engine answers (at ``LOOM_DOCKER_HOST`` / ``DOCKER_HOST`` / the default socket: the
   one the worker uses), through the ``docker`` command;
2. the agent runtime image (``LOOM_AGENT_RUNTIME_IMAGE``), built from the package's
   ``images/runtime`` if missing;
3. the default sandbox image (``LOOM_IMAGE``): built from ``images/sandbox`` if it is one
   of ours and missing, else pulled as the pull policy allows (:mod:`.images` says from
   which base, and in which order it tries them);
4. gVisor: whether a runtime for ``LOOM_GVISOR_PLATFORM`` is registered with the engine and
   how to add it. Only with ``--register-gvisor`` is the engine's ``daemon.json`` written
   (one runtime per gVisor platform), and the engine is never reloaded by this command
   (:mod:`.gvisor`).

It is idempotent: a second run finds everything there and builds nothing. Nothing is
ever removed. Exit 0 when the worker has what it needs, 1 when something is missing (the
``[FAIL]`` lines name it), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, cast

from ..common import path_arg

if TYPE_CHECKING:
    from pathlib import Path

    from ...settings import Settings
    from .images import Step

EXIT_STATUS = (
    "Exit status: 0 the worker has what it needs; 1 something is missing (the [FAIL] lines say what); 2 usage error."
)


def _say(text: str) -> None:
    print(text, flush=True)


def _print(step: Step) -> None:
    _say(f"[{step.status}] {step.what}: {step.detail}")
    if step.fix and step.status in ("FAIL", "note"):
        _say(f"       fix: {step.fix}")


def _echo(line: str) -> None:
    sys.stderr.write(f"       | {line}\n")
    sys.stderr.flush()


def run_setup(
    settings: Settings,
    *,
    image: str | None = None,
    runtime_image: str | None = None,
    base: str | None = None,
    pull: str | None = None,
    register_gvisor: str | None = None,
    daemon_json: Path | None = None,
    show_output: bool = False,
) -> int:
    """Do the steps, printing each; the exit status (0 nothing missing, 1 something is).
    ``register_gvisor``: None leaves daemon.json alone; "" registers the runsc found on
    PATH; a path registers that binary. ``show_output`` echoes builds and pulls to stderr."""
    from . import gvisor
    from .engine import CommandError, DockerCLI
    from .images import PULL_POLICIES, RUNTIME, Images, PullPolicy, Step, sandbox_recipe

    docker = DockerCLI(settings.docker_host, echo=_echo if show_output else None)
    # LOOM_PULL is the worker's pull policy (the `pull` setting, where this build has it).
    policy = str(pull or getattr(settings, "pull", None) or "missing")
    if policy not in PULL_POLICIES:
        print(f"loom-worker: error: pull policy {policy!r}: one of {', '.join(PULL_POLICIES)}", file=sys.stderr)
        return 2
    image = image or settings.image
    runtime_image = runtime_image or settings.agent_runtime_image
    steps: list[Step] = []

    def report(step: Step) -> None:
        steps.append(step)
        _print(step)

    _say(f"loom-worker setup: what the worker needs, on the engine at {docker.host}")
    if not docker.available:
        report(
            Step(
                "FAIL",
                "docker",
                "the docker command is not installed (not on PATH)",
                "install Docker Engine (https://docs.docker.com/engine/install/) or Docker Desktop",
            )
        )
        return 1
    try:
        version = docker.server_version()
    except CommandError as e:
        fix = "start the engine (`sudo systemctl start docker`, or Docker Desktop), or set LOOM_DOCKER_HOST"
        if "permission denied" in str(e).lower():
            fix = "join the docker group (`sudo usermod -aG docker $USER`, then log in again), or run as root"
        report(Step("FAIL", "docker engine", f"does not answer: {e}", fix))
        return 1
    report(Step("ok", "docker engine", f"{version} answers (docker {docker.client_version()})"))

    images = Images(docker, pull=cast("PullPolicy", policy), base=base, say=lambda m: _say(f"[..] {m}"))
    report(images.ensure(runtime_image, RUNTIME))
    report(images.ensure(image, sandbox_recipe(image)))

    registered: Step | None = None
    if register_gvisor is not None:
        runsc = gvisor.find_runsc(register_gvisor or None)
        if runsc is None:
            where = register_gvisor or "on PATH or in " + ", ".join(gvisor.KNOWN_PATHS)
            registered = Step("FAIL", "gVisor (runsc)", f"no runsc binary {where}", f"install it: {gvisor.INSTALL}")
        else:
            registered = gvisor.register(daemon_json or gvisor.DAEMON_JSON, runsc)
        report(registered)
    try:
        runtimes = docker.runtimes()
    except CommandError as e:
        report(Step("FAIL", "gVisor (runsc)", f"cannot ask the engine for its runtimes: {e}"))
    else:
        if registered is not None and registered.status in ("ok", "done") and gvisor.RUNTIME not in runtimes:
            if registered.status == "ok":  # in the file, but the engine has not read it
                report(Step("note", "gVisor (runsc)", "in daemon.json, not loaded by the engine yet", gvisor.RELOAD))
        else:
            report(gvisor.status(runtimes, settings.runtime, getattr(settings, "gvisor_platform", "systrap")))

    failed = [s for s in steps if s.status == "FAIL"]
    if failed:
        _say(f"setup incomplete: {len(failed)} thing(s) missing (the [FAIL] lines above)")
        return 1
    _say("ready: `loom-worker demo` shows a sandbox at work; `loom-worker doctor` checks everything")
    return 0


def _cmd_setup(args: argparse.Namespace, settings: Settings) -> int:
    from .. import verbosity

    return run_setup(
        settings,
        image=args.image,
        runtime_image=args.runtime_image,
        base=args.base,
        pull=args.pull,
        register_gvisor=args.register_gvisor,
        daemon_json=args.daemon_json,
        show_output=verbosity.level() in ("info", "debug"),
    )


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "setup",
        help="Build or fetch what the worker needs on this Docker engine (images; says what it did).",
        description=(
            "On a machine that has Docker: check the engine answers, build the agent runtime image and the "
            "default sandbox image when missing (from a Debian base this engine has, can pull, or can build with "
            "debootstrap as root), and say whether gVisor is registered. Idempotent: a second run builds "
            "nothing. Nothing is removed; daemon.json is written only with --register-gvisor."
        ),
        epilog=EXIT_STATUS,
    )
    p.add_argument("--image", metavar="IMAGE", help="The sandbox image to make sure of (default LOOM_IMAGE).")
    p.add_argument(
        "--runtime-image",
        metavar="IMAGE",
        help="The agent runtime image to make sure of (default LOOM_AGENT_RUNTIME_IMAGE).",
    )
    p.add_argument(
        "--base",
        metavar="IMAGE",
        help="Build from this Debian bookworm image only (default: the offline base if present, else "
        "debian:bookworm-slim, else debootstrap).",
    )
    p.add_argument(
        "--pull",
        choices=("missing", "never", "always"),
        help="Pull policy for images and bases (default LOOM_PULL, else missing).",
    )
    p.add_argument(
        "--register-gvisor",
        nargs="?",
        const="",
        metavar="RUNSC",
        help="Register runsc (this binary, else the one on PATH) as a runtime in daemon.json; the engine must then "
        "be reloaded (not done here). Needs root.",
    )
    p.add_argument(
        "--daemon-json",
        type=path_arg,
        metavar="PATH",
        help="The engine's configuration file for --register-gvisor (default /etc/docker/daemon.json).",
    )
    p.set_defaults(func=_cmd_setup)
