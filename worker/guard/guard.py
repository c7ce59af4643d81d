"""The host's check of a workspace after every call: nothing the sandbox left there runs on
the host (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sandbox.agent.paths import open_below
from sandbox.identity import fork_volume_of
from sandbox.logs import get_logger

from . import gitconfig
from .walk import DIR_FLAGS, Action, Identity, OverBudget, Walk, chmod_logged, identity, is_git_dir, join, pinned

log = get_logger("worker.guard")

_CONFIGS = ("config", "config.worktree")
#: Names that make a tool's write a matter for the guard (see WorkspaceGuard.concerns).
_GIT_NAMES = frozenset({".git", "config", "config.worktree", "HEAD", "commondir", "gitdir", "hooks", "objects", "refs"})
TRUST_FILE = "git-trust.json"
#: Seconds a check may run on the event loop (:meth:`WorkspaceGuard.check_soon`: a
#: workspace of a few dozen directories); a longer one runs in a thread.
INLINE_BUDGET = 0.0005


class WorkspaceGuard:
    """The check of one workspace directory ``root`` (a real host path). Blocking (call it
    in a thread, or :meth:`check_soon` from the event loop); thread-safe.

    What it trusts: git configuration and hooks as they were when the guard first looked
    at the workspace (saved in ``state_dir``, so another process of the worker trusts the
    same); a later change to them is held to the rules like a new file.
    """

    def __init__(self, root: Path, state_dir: Path | None = None) -> None:
        self.root = root
        self._state = state_dir / TRUST_FILE if state_dir is not None else None
        self._fork = fork_volume_of(root)  # an overlay fork's volume (its mount comes and goes)
        self._trust: dict[str, Identity] | None = None
        self._trust_root: list[Any] | None = None  # the directory the trust is recorded for
        self._hookdirs: list[str] = []
        self._judged: dict[str, Identity] = {}  # configs already read and found clean
        # (an overlay fork's tree is its sandbox's mount: the host's inodes are not what it changes)
        self._walk = Walk(watch=self._fork is None)
        self._lock = threading.Lock()
        self._deadline: float | None = None  # of the check_quick running now
        self._unreported: list[Action] = []  # what a check_quick over its budget did
        self._inline = True  # whether check_soon tries check_quick (the last check fitted)
        self._git = gitconfig.git_binary()
        #: What the last check changed.
        self.last: list[Action] = []

    def close(self) -> None:
        """Drop the inotify watch of the workspace's directories (the workspace is dropped;
        a check after this walks every directory)."""
        with self._lock:
            self._walk.close()

    # -- the check ---------------------------------------------------------------------

    def concerns(self, path: str) -> bool:
        """Whether new content at workspace-relative ``path`` (a tool's write: no mode of
        its choosing) could be something git on the host reads to decide what to run: a
        file of a git directory (its config, HEAD, commondir, gitdir, a hook), a ``.git``
        file, or a file in a hooks directory a trusted config names. Anything else is
        data to git (an attributes file names only drivers a config defines)."""
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if any(p in _GIT_NAMES for p in parts):
            return True
        if any(path == d or path.startswith(d + "/") for d in self._hookdirs):
            return True
        # The agent follows a link that stays in the workspace: a write through one may land
        # anywhere in it, so it is looked at. (A few lstat calls, not worth a thread.)
        here = self.root
        for p in parts:
            here = here / p
            try:
                if stat.S_ISLNK(os.lstat(here).st_mode):
                    return True
            except OSError:
                return False
        return False

    def check(self) -> list[Action]:
        """Look at the whole workspace; undo what could run on the host. Returns what it
        changed (also logged). Raises OSError when the workspace cannot be opened."""
        with self._lock:
            return self._check()

    async def check_soon(self) -> list[Action]:
        """:meth:`check` from the event loop: on the loop itself while a whole check fits
        :data:`INLINE_BUDGET` (:meth:`check_quick`), else in a thread; inline again once one
        fits (the tree shrank). Raises OSError as :meth:`check` does."""
        if self._inline:
            quick = self.check_quick(INLINE_BUDGET)
            if quick is not None:
                return quick
        return await asyncio.to_thread(self._check_timed)

    def _check_timed(self) -> list[Action]:
        """:meth:`check` in check_soon's thread, which learns whether it fitted the budget
        (the first look, which takes the trust, always goes to a thread and is not judged)."""
        first = self._trust is None
        started = time.monotonic()
        actions = self.check()
        if not first:
            self._inline = time.monotonic() - started < INLINE_BUDGET
        return actions

    def check_quick(self, budget: float) -> list[Action] | None:
        """:meth:`check`, if it takes at most about ``budget`` seconds and needs no program
        (git reading a config) and no lock another thread holds; else None, and
        :meth:`check` must follow (it reports what this one already changed). For the event
        loop itself: a small workspace's check costs a few microseconds, the hop to a
        thread and back a hundred. Raises OSError as :meth:`check` does."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._deadline = time.monotonic() + budget
            try:
                return self._check()
            except OverBudget:
                return None
        finally:
            self._deadline = None
            self._lock.release()

    def _check(self) -> list[Action]:
        actions = self._unreported
        self._unreported = []
        try:
            return self._look(actions)
        except OverBudget:
            self._unreported = actions  # (check_quick: the check that follows reports them)
            raise

    def _look(self, actions: list[Action]) -> list[Action]:
        root_fd = os.open(self.root, DIR_FLAGS)
        try:
            if self._fork is not None and os.fstat(root_fd).st_dev == os.stat(self.root.parent).st_dev:
                # an overlay fork whose sandbox is stopped: the bare directory under its
                # mount, which nothing reaches; its tree is looked at once mounted
                return []
            git_dirs = list(self._walk.run(root_fd, actions, self._deadline))
            root_id = self._root_id(root_fd)
            if self._deadline is not None and (self._trust is None or root_id != self._trust_root):
                raise OverBudget("trust to take or record")  # (files written: not on the event loop)
            if self._trust is None and not self._load_trust(root_id):
                self._take_trust(root_fd, git_dirs)
            else:
                if root_id != self._trust_root:
                    # Another directory at the root's path under this process (a gVisor
                    # warm sandbox's, moved into place: sandbox.docker.slots). What was
                    # trusted stays so (by inode: nothing of the new one), recorded for
                    # it: the next process must judge what is there, not trust it.
                    self._save_trust(root_id)
                for rel in git_dirs:
                    self._git_dir(root_fd, rel, actions)
                for rel in self._hookdirs:
                    self._hooks(root_fd, rel, actions)
        finally:
            os.close(root_fd)
        self.last = actions
        if actions:
            log.warning(
                "workspace.guard",
                workspace=str(self.root),
                actions=[f"{a.path}: {a.what}" for a in actions],
            )
        return actions

    # -- git ----------------------------------------------------------------------------

    def _git_dir(self, root_fd: int, rel: str, actions: list[Action]) -> None:
        fd = open_below(root_fd, rel)
        if fd is None:
            return
        try:
            for name in _CONFIGS:
                self._config(fd, join(rel, name), name, actions)
        finally:
            os.close(fd)
        self._hooks(root_fd, join(rel, "hooks"), actions)

    def _config(self, dir_fd: int, path: str, name: str, actions: list[Action]) -> None:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return
        ident = identity(st)
        if self._trusted(path, ident) or self._judged.get(path) == ident:
            return
        if stat.S_ISLNK(st.st_mode):
            # git follows it (to anything: a file outside, a FIFO); git never makes one.
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
                actions.append(Action(path, "symlinked git config removed"))
            return
        if not stat.S_ISREG(st.st_mode) or self._git is None:
            return
        if self._deadline is not None:
            raise OverBudget("a git config to read")  # (git is a program: not on the event loop)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return
        try:
            try:
                entries = gitconfig.read(f"/proc/self/fd/{fd}", self._git, pass_fd=fd)
            except gitconfig.ConfigUnreadable:
                self._judged[path] = ident  # git on the host refuses it too: nothing runs
                return
            except OSError as e:
                log.error("workspace.guard_failed", path=path, what="read git config", error=str(e))
                return
            gitdir = self.root / path.rpartition("/")[0]
            kept = [e for e in entries if gitconfig.allowed(e.key) and self._stays_inside(gitdir, e)]
            refused = [e.key for e in entries if e not in kept]
            if not refused:
                self._judged[path] = ident
                return
            data = gitconfig.render(kept)
            tmp = f".{name}.loom-guard"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
            try:
                os.write(out, data)
                with contextlib.suppress(OSError):
                    os.fchown(out, st.st_uid, st.st_gid)
                os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o666)
            finally:
                os.close(out)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            self._judged[path] = identity(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
            actions.append(Action(path, "git config: removed " + ", ".join(sorted(set(refused)))))
        finally:
            os.close(fd)

    def _stays_inside(self, gitdir: Path, e: gitconfig.Entry) -> bool:
        """A path-valued key (``core.worktree``: where git checks files out, a submodule's
        ``../../../sub``) may not lead out of the workspace: a checkout there would write
        the sandbox's files into the host's."""
        if e.key not in gitconfig.PATH_VALUED or e.value is None:
            return True
        target = Path(os.path.normpath(gitdir / e.value))
        return target == self.root or target.is_relative_to(self.root)

    def _hooks(self, root_fd: int, rel: str, actions: list[Action]) -> None:
        """Disable every hook in directory ``rel`` that is not trusted: its execute bits
        cleared (git runs only an executable hook), a link removed."""
        parent, _, name = rel.rpartition("/")
        pfd = open_below(root_fd, parent)
        if pfd is None:
            return
        try:
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except OSError:
                return
            if stat.S_ISLNK(st.st_mode):
                if not self._trusted(rel, identity(st)):
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=pfd)
                        actions.append(Action(rel, "symlinked hooks directory removed"))
                return
            if not stat.S_ISDIR(st.st_mode):
                return
            fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
        finally:
            os.close(pfd)
        try:
            for e in os.scandir(fd):
                if e.name.endswith(".sample"):
                    continue  # (git never runs one: no lstat for it, ~14 of them per look)
                path = join(rel, e.name)
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if self._trusted(path, identity(st)):
                    continue
                if stat.S_ISLNK(st.st_mode):
                    with contextlib.suppress(OSError):
                        os.unlink(e.name, dir_fd=fd)
                        actions.append(Action(path, "symlinked hook removed"))
                elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
                    with pinned(fd, e.name, st) as proc:
                        if proc is not None:
                            mode = stat.S_IMODE(st.st_mode) & ~0o111
                            chmod_logged(proc, mode, path, "hook disabled (not executable)", actions)
        finally:
            os.close(fd)

    # -- trust ---------------------------------------------------------------------------

    def _trusted(self, path: str, ident: Identity) -> bool:
        return self._trust is not None and self._trust.get(path) == ident

    def adopt_trust(self, tree: Path) -> None:
        """The baseline of an overlay fork (``worker.snapshots.overlay``), taken when it is
        made, before its sandbox ran anything: its snapshot's ``tree`` (its lower layer),
        read, never written. Its merged tree shows those files with the same identities
        (lower and upper on one filesystem) until they change. Raises OSError."""
        with self._lock:
            root_fd = os.open(tree, DIR_FLAGS)
            try:
                self._take_trust(root_fd, _git_dirs(tree))
            finally:
                os.close(root_fd)

    def _root_id(self, root_fd: int) -> list[Any]:
        if self._fork is not None:
            # an overlay fork's root is a new mount (another device number) at each start
            # of its sandbox: it is named by its volume, made once for this fork
            return [self._fork]
        return _root_id(root_fd)

    def _load_trust(self, root_id: list[Any]) -> bool:
        """The saved baseline, if it is of this very directory (a workspace removed and made
        again at the same path, a fresh clone, is looked at afresh)."""
        if self._state is None:
            return False
        try:
            data = json.loads(self._state.read_text())
            if data["root"] != root_id:
                return False
            self._trust = {k: tuple(v) for k, v in data["files"].items()}
            self._trust_root = root_id
            self._hookdirs = [str(d) for d in data["hookdirs"]]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return True

    def _take_trust(self, root_fd: int, git_dirs: list[str]) -> None:
        """What is there now, before the sandbox ran anything, is the owner's: its git
        configs, hooks, and the hooks directories its configs name (``core.hooksPath``)."""
        trust: dict[str, Identity] = {}
        hookdirs: list[str] = []
        for rel in git_dirs:
            for name in (*_CONFIGS, "hooks"):
                trust.update(self._identities(root_fd, join(rel, name)))
            for name in _CONFIGS:
                hp = self._hooks_path(root_fd, rel, name)
                if hp is not None and hp not in hookdirs:
                    hookdirs.append(hp)
                    trust.update(self._identities(root_fd, hp))
        self._trust, self._hookdirs = trust, hookdirs
        self._save_trust(self._root_id(root_fd))

    def _save_trust(self, root_id: list[Any]) -> None:
        """Record the trust for the directory ``root_id`` (atomically). Raises OSError."""
        self._trust_root = root_id
        if self._state is not None:
            self._state.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._state.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"root": root_id, "files": self._trust, "hookdirs": self._hookdirs}, f)
            os.replace(tmp, self._state)

    def _identities(self, root_fd: int, rel: str) -> dict[str, Identity]:
        """``rel`` (and, for a directory, what is in it) by identity."""
        parent, _, name = rel.rpartition("/")
        fd = open_below(root_fd, parent)
        if fd is None:
            return {}
        out: dict[str, Identity] = {}
        try:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return {}
            out[rel] = identity(st)
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                try:
                    for e in os.scandir(sub):
                        with contextlib.suppress(OSError):
                            out[join(rel, e.name)] = identity(e.stat(follow_symlinks=False))
                finally:
                    os.close(sub)
        finally:
            os.close(fd)
        return out

    def _hooks_path(self, root_fd: int, rel: str, name: str) -> str | None:
        """The workspace-relative directory a trusted config's ``core.hooksPath`` names
        (relative: to the worktree, the parent of a ``.git``), or None."""
        if self._git is None:
            return None
        fd = open_below(root_fd, rel)
        if fd is None:
            return None
        try:
            cfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            entries = gitconfig.read(f"/proc/self/fd/{cfd}", self._git, pass_fd=cfd)
        except (gitconfig.ConfigUnreadable, OSError):
            return None
        finally:
            os.close(cfd)
        value = next((e.value for e in reversed(entries) if e.key == "core.hookspath" and e.value), None)
        if value is None:
            return None
        if value.startswith("/"):
            target = Path(os.path.normpath(value))
        else:
            base = self.root / (rel.rpartition("/")[0] if rel.split("/")[-1] == ".git" else rel)
            target = Path(os.path.normpath(base / value))
        try:
            return str(target.relative_to(self.root)) if target != self.root else None
        except ValueError:
            return None  # outside the workspace: out of the sandbox's reach


def _git_dirs(tree: Path) -> list[str]:
    """The directories under ``tree`` git may take for git directories (links not
    followed; nothing changed, unlike the guard's own walk)."""
    found = []
    for dirpath, dirs, files in os.walk(tree, followlinks=False):
        if is_git_dir({*dirs, *files}):
            rel = os.path.relpath(dirpath, tree)
            found.append("" if rel == "." else rel)
    return found


def _root_id(root_fd: int) -> list[int]:
    st = os.fstat(root_fd)
    return [st.st_dev, st.st_ino]


def as_dicts(actions: list[Action]) -> list[dict[str, str]]:
    return [asdict(a) for a in actions]
