"""The Docker CLI, as ``loom-worker setup`` drives it: is the engine there, which images
and runtimes it has, pull, build, on **the engine the worker uses**.

Why the ``docker`` program and not the Docker SDK: building needs a build context sent
as a tarball, BuildKit where it is installed (the classic builder where it is not), the
user's registry credentials, credential helpers and proxies from ``~/.docker/config.json``,
and pull progress; the CLI does all of that and is installed wherever the engine is. The
worker's own engine calls stay in :mod:`sandbox.docker`, the one module that imports the
SDK.

The worker reaches the engine at ``LOOM_DOCKER_HOST``, else ``DOCKER_HOST``, else the
default socket, and never through the CLI's *contexts* (``docker context use``): so the CLI
is run with ``DOCKER_HOST`` set to that same address, and what is built here is what the
worker finds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Where the Docker SDK (and so the worker) looks when neither LOOM_DOCKER_HOST nor
#: DOCKER_HOST says otherwise (``docker.from_env``).
DEFAULT_HOST = "unix:///var/run/docker.sock"
#: Lines of a failed command's output kept for its error message.
TAIL = 25


class CommandError(Exception):
    """A ``docker`` command failed; the message is the end of its output."""


class DockerCLI:
    """``docker`` subcommands against one engine.

    ``echo``, when given, receives each line of a long command's output (builds, pulls,
    debootstrap) as it comes; otherwise the output is kept and only its end is shown when
    the command fails.
    """

    def __init__(
        self,
        docker_host: str | None = None,
        *,
        executable: str | None = None,
        echo: Callable[[str], None] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.executable = executable or shutil.which("docker")
        env = dict(os.environ if environ is None else environ)
        env["DOCKER_HOST"] = docker_host or env.get("DOCKER_HOST") or DEFAULT_HOST
        env.pop("DOCKER_CONTEXT", None)  # DOCKER_HOST decides, as for the worker
        self.env = env
        self.host = env["DOCKER_HOST"]
        self.echo = echo
        self._buildkit: bool | None = None

    @property
    def available(self) -> bool:
        return self.executable is not None

    # -- quick questions ---------------------------------------------------------------------

    def _quick(self, *args: str) -> subprocess.CompletedProcess[str]:
        if self.executable is None:
            raise CommandError("the docker command is not installed (not on PATH)")
        return subprocess.run(
            [self.executable, *args], env=self.env, capture_output=True, text=True, timeout=120, check=False
        )

    def server_version(self) -> str:
        """The engine's version. Raises CommandError with the engine's (or the CLI's) answer
        when it does not answer."""
        p = self._quick("version", "--format", "{{.Server.Version}}")
        version = p.stdout.strip()
        if p.returncode != 0 or not version:
            raise CommandError((p.stderr or p.stdout).strip() or f"docker version exited {p.returncode}")
        return version

    def client_version(self) -> str:
        p = self._quick("version", "--format", "{{.Client.Version}}")
        return p.stdout.strip() or "?"

    def runtimes(self) -> dict[str, Any]:
        """The engine's OCI runtimes (``docker info``'s ``Runtimes``). Raises CommandError."""
        p = self._quick("info", "--format", "{{json .Runtimes}}")
        if p.returncode != 0:
            raise CommandError(p.stderr.strip())
        value = json.loads(p.stdout or "{}")
        return value if isinstance(value, dict) else {}

    def has_image(self, ref: str) -> bool:
        """Whether ``ref`` is on the engine (nothing is pulled)."""
        return self._quick("image", "inspect", "--format", "{{.Id}}", ref).returncode == 0

    def probe(self, image: str, argv: Sequence[str]) -> bool:
        """Whether ``argv`` succeeds in a throwaway container of ``image`` (no network)."""
        p = self._quick("run", "--rm", "--network", "none", "--entrypoint", argv[0], image, *argv[1:])
        return p.returncode == 0

    def buildkit(self) -> bool:
        """Whether ``docker build`` can use BuildKit (the buildx plugin is installed).
        Without it the classic builder is asked for (``DOCKER_BUILDKIT=0``): a recent CLI
        refuses to build otherwise."""
        if self._buildkit is None:
            self._buildkit = self._quick("buildx", "version").returncode == 0
        return self._buildkit

    # -- long commands -------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        """Run ``argv`` (the first word as it is: ``docker`` is not added), its output to
        :attr:`echo` or kept. Raises CommandError with the end of the output when it fails."""
        tail: deque[str] = deque(maxlen=TAIL)
        proc = subprocess.Popen(
            list(argv),
            env=dict(env or self.env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        with proc:
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                if self.echo is not None:
                    self.echo(line)
        if proc.returncode != 0:
            raise CommandError("\n".join(tail).strip() or f"{argv[0]} exited {proc.returncode}")

    def pull(self, ref: str) -> None:
        """``docker pull ref``. Raises CommandError with the registry's answer."""
        if self.executable is None:
            raise CommandError("the docker command is not installed (not on PATH)")
        self.run([self.executable, "pull", ref])

    def build(self, context: Path, tag: str, build_args: Mapping[str, str]) -> None:
        """``docker build -t tag`` of ``context`` (its ``Dockerfile``). Raises CommandError."""
        if self.executable is None:
            raise CommandError("the docker command is not installed (not on PATH)")
        argv = [self.executable, "build", "-t", tag]
        for key, value in build_args.items():
            argv += ["--build-arg", f"{key}={value}"]
        env = dict(self.env)
        if not self.buildkit():
            env["DOCKER_BUILDKIT"] = "0"
        self.run([*argv, str(context)], env=env)
