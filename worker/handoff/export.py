"""A commit of the session's changes on a new branch, made on the host with the host's git
without touching the checkout (its index, its working tree, its HEAD).

A temporary index (``GIT_INDEX_FILE``) is filled from ``HEAD`` (``read-tree``), each
changed path is set to its content now (``hash-object -w --stdin``, which runs no filter,
and ``update-index --index-info``), and ``write-tree`` + ``commit-tree`` +
``update-ref`` (refusing an existing branch) make the commit. Only plumbing commands run:
none of them runs a hook, a filter or an fsmonitor; and git runs with a hardened
environment besides (:func:`git_env`, :data:`HARDENING`), after :mod:`.tamper` found the
session changed nothing git would act on.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import HandoffError
from .state import Change

#: Configuration on git's command line that turns off what a repository could make it run.
HARDENING = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.sshCommand=false",
    "-c",
    "core.attributesFile=/dev/null",
    "-c",
    "protocol.allow=never",
)


@dataclass(frozen=True)
class Identity:
    name: str
    email: str


def parse_identity(text: str) -> Identity:
    """``Name <mail>`` as an identity. Raises ValueError for another form."""
    name, lt, rest = text.strip().partition("<")
    if not lt or not rest.endswith(">") or not name.strip() or "<" in rest or "\n" in text:
        raise ValueError(f"not of the form 'Name <mail>': {text!r}")
    return Identity(name.strip(), rest[:-1].strip())


def git_env(index: str | None = None, who: Identity | None = None) -> dict[str, str]:
    """git's whole environment: nothing of the caller's ``GIT_*`` (``GIT_DIR``,
    ``GIT_CONFIG_PARAMETERS``, ``GIT_EXEC_PATH``... would steer it), no system or global
    config, a home with nothing in it."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
    }
    if index is not None:
        env["GIT_INDEX_FILE"] = index
    if who is not None:
        for role in ("AUTHOR", "COMMITTER"):
            env[f"GIT_{role}_NAME"] = who.name
            env[f"GIT_{role}_EMAIL"] = who.email
    return env


class HostGit:
    """The host's git on one repository (its ``.git`` directory), hardened."""

    def __init__(self, repo: Path, git: str | None = None) -> None:
        found = git or shutil.which("git")
        if found is None:
            raise HandoffError("git is not installed on the host")
        self.git = found
        self.repo = repo
        self.git_dir = repo / ".git"

    def run(self, *args: str, env: dict[str, str] | None = None, data: bytes | None = None) -> str:
        """``git args`` in the repository; its stdout. Raises HandoffError when git fails."""
        argv = [
            self.git,
            "-c",
            f"safe.directory={self.repo}",
            *HARDENING,
            f"--git-dir={self.git_dir}",
            f"--work-tree={self.repo}",
            *args,
        ]
        try:
            proc = subprocess.run(
                argv, env=env or git_env(), input=data, capture_output=True, cwd=self.repo, timeout=300, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HandoffError(f"git {args[0]} could not be run: {e}") from e
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            raise HandoffError(f"git {args[0]} failed: {err or f'exit status {proc.returncode}'}")
        return proc.stdout.decode("utf-8", "surrogateescape")


def check_branch(name: str, git: str | None = None) -> None:
    """Raises ValueError when ``name`` is not a valid new branch name."""
    exe = git or shutil.which("git") or "git"
    ok = subprocess.run(
        [exe, "check-ref-format", "--branch", name], env=git_env(), capture_output=True, check=False
    ).returncode
    if ok != 0 or name.startswith("-"):
        raise ValueError(f"not a valid branch name: {name!r}")


def commit_branch(repo: Path, branch: str, changes: list[Change], message: str, who: Identity) -> str:
    """Commit ``changes`` on top of ``HEAD`` as the new branch ``branch``; the commit's id.
    Blocking. Raises HandoffError (not a repository with a commit, the branch exists,
    git failed)."""
    if not (repo / ".git").is_dir() or (repo / ".git").is_symlink():
        raise HandoffError(f"{repo} is not the top of a git repository (no .git directory)")
    g = HostGit(repo)
    ref = f"refs/heads/{branch}"
    if g.run("for-each-ref", "--format=%(refname)", ref).strip():
        raise HandoffError(f"branch {branch} already exists")
    try:
        head = g.run("rev-parse", "--verify", "--quiet", "HEAD^{commit}").strip()
    except HandoffError:
        raise HandoffError(f"the repository at {repo} has no commit to start the branch from (HEAD)") from None
    with tempfile.TemporaryDirectory(prefix="loom-export-") as tmp:
        env = git_env(index=str(Path(tmp) / "index"), who=who)
        g.run("read-tree", head, env=env)
        lines: list[bytes] = []
        for c in changes:
            if c.old_path != c.new_path or c.new is None:
                lines.append(b"0 " + b"0" * 40 + b"\t" + c.old_path.encode("utf-8", "surrogateescape") + b"\0")
            if c.new is not None:
                oid = g.run("hash-object", "-w", "--stdin", env=env, data=c.new.data).strip()
                path = c.new_path.encode("utf-8", "surrogateescape")
                lines.append(f"{c.new.mode} {oid}\t".encode() + path + b"\0")
        if lines:
            g.run("update-index", "-z", "--index-info", env=env, data=b"".join(lines))
        tree = g.run("write-tree", env=env).strip()
        commit = g.run("commit-tree", tree, "-p", head, "-F", "-", env=env, data=message.encode()).strip()
        # The zero old value: made only if the branch does not exist (no race with another).
        g.run("update-ref", "-m", "loom-worker export", ref, commit, "0" * 40, env=env)
    return commit


async def export(repo: Path, branch: str, changes: list[Change], message: str, who: Identity) -> str:
    """:func:`commit_branch` off the event loop. Raises HandoffError."""
    return await asyncio.to_thread(commit_branch, repo, branch, changes, message, who)
