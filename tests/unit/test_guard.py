"""The host's guard without Docker: the git config allowlist and its rewrite, the walk's
fixes and its trusted baseline, link safety; and the agents' own seccomp filter, installed
in a child process of this host."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox.agent import modeguard
from worker.guard import WorkspaceGuard, gitconfig

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git on this host")


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("core.bare", True),
        ("core.repositoryformatversion", True),
        ("extensions.objectformat", True),
        ("remote.origin.url", True),
        ("remote.origin.fetch", True),
        ("branch.main.remote", True),
        ("submodule.lib.url", True),
        ("submodule.lib.active", True),
        ("user.email", True),
        ("gc.auto", True),
        ("gc.main.reflogexpire", True),
        ("gc.recentobjectshook", False),
        ("core.fsmonitor", False),
        ("core.hookspath", False),
        ("core.sshcommand", False),
        ("core.pager", False),
        ("core.editor", False),
        ("core.alternaterefscommand", False),
        ("include.path", False),
        ("includeif.gitdir:/x/.path", False),
        ("filter.lfs.clean", False),
        ("diff.x.textconv", False),
        ("diff.external", False),
        ("merge.x.driver", False),
        ("alias.st", False),
        ("credential.helper", False),
        ("gpg.program", False),
        ("hook.pre-commit.command", False),
        ("trailer.x.command", False),
        ("remote.origin.uploadpack", False),
        ("remote.origin.vcs", False),
        ("protocol.ext.allow", False),
        ("url.ext::sh.insteadof", False),
        ("submodule.lib.update", False),
        ("sequence.editor", False),
        ("newsection.anything", False),
    ],
)
def test_the_allowlist(key: str, ok: bool) -> None:
    assert gitconfig.allowed(key) is ok


@needs_git
def test_a_rewrite_reads_back_as_the_same_entries(tmp_path: Path) -> None:
    entries = [
        gitconfig.Entry("core.bare", "false"),
        gitconfig.Entry("core.symlinks", None),
        gitconfig.Entry('remote.we"ird\\name.url', 'a "quoted" \\ value\twith\nlines'),
        gitconfig.Entry("branch.main.remote", "origin"),
    ]
    f = tmp_path / "config"
    f.write_bytes(gitconfig.render(entries))
    back = gitconfig.read(str(f), shutil.which("git") or "git")
    assert [(e.key, e.value) for e in back] == [(e.key, e.value) for e in entries]


def _git(cwd: Path, *args: str) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@needs_git
def test_the_owners_own_hooks_and_config_are_trusted_until_they_change(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _git(ws, "init", "-q")
    _git(ws, "config", "core.hooksPath", ".husky")
    (ws / ".husky").mkdir()
    hook = ws / ".husky" / "pre-commit"
    hook.write_text("#!/bin/sh\ntrue\n")
    hook.chmod(0o755)
    (ws / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    (ws / ".git" / "hooks" / "post-checkout").chmod(0o755)
    guard = WorkspaceGuard(ws, tmp_path / "state")
    assert guard.check() == []  # the first look: the owner's
    assert guard.check() == []
    # Another process of the worker trusts the same baseline.
    assert WorkspaceGuard(ws, tmp_path / "state").check() == []
    assert os.access(hook, os.X_OK) and "hookspath" in (ws / ".git" / "config").read_text().lower()
    # Then the sandbox changes them.
    hook.write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    _git(ws, "config", "core.fsmonitor", "touch /tmp/pwned")
    (ws / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (ws / ".git" / "hooks" / "pre-commit").chmod(0o755)
    done = {(a.path, a.what.split(":")[0]) for a in guard.check()}
    assert (".husky/pre-commit", "hook disabled (not executable)") in done
    assert (".git/hooks/pre-commit", "hook disabled (not executable)") in done
    assert (".git/config", "git config") in done
    assert not os.access(hook, os.X_OK)
    assert "fsmonitor" not in (ws / ".git" / "config").read_text()
    assert os.access(ws / ".git" / "hooks" / "post-checkout", os.X_OK)  # unchanged: still trusted
    # The workspace removed and cloned again at the same path (another directory): its hooks
    # are the owner's.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    _git(fresh, "init", "-q")
    shutil.rmtree(ws)
    fresh.rename(ws)
    (ws / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (ws / ".git" / "hooks" / "pre-commit").chmod(0o755)
    assert WorkspaceGuard(ws, tmp_path / "state").check() == []


@needs_git
def test_a_directory_moved_into_place_under_a_live_guard_is_never_trusted_afresh(tmp_path: Path) -> None:
    """A gVisor warm sandbox's directory replaces an empty workspace after the guard's
    first look (sandbox.docker.slots): what the sandbox then plants is judged, by this
    process and by the next one, which must not take it for the owner's baseline."""
    ws = tmp_path / "ws"
    ws.mkdir()
    guard = WorkspaceGuard(ws, tmp_path / "state")
    assert guard.check() == []  # the owner's: nothing
    slot = tmp_path / "slot-ws"
    slot.mkdir()
    os.rename(slot, ws)
    assert guard.check() == []
    _git(ws, "init", "-q")  # then the sandbox plants a hook
    hook = ws / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    hook.chmod(0o755)
    done = {(a.path, a.what.split(":")[0]) for a in WorkspaceGuard(ws, tmp_path / "state").check()}
    assert (".git/hooks/pre-commit", "hook disabled (not executable)") in done
    assert not os.access(hook, os.X_OK)


@needs_git
def test_repositories_made_later_anywhere_are_held_to_the_rules(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    guard = WorkspaceGuard(ws)
    assert guard.check() == []
    (ws / "a" / "b").mkdir(parents=True)
    _git(ws / "a" / "b", "init", "-q", "--bare", "r")
    _git(ws / "a" / "b" / "r", "config", "core.pager", "evil")
    _git(ws, "init", "-q", "n")
    (ws / "n" / ".git" / "config").unlink()
    (ws / "evil.cfg").write_text("[core]\n\tfsmonitor = evil\n")
    (ws / "n" / ".git" / "config").symlink_to(ws / "evil.cfg")
    done = {(a.path, a.what) for a in guard.check()}
    assert ("a/b/r/config", "git config: removed core.pager") in done
    assert ("n/.git/config", "symlinked git config removed") in done
    assert (ws / "evil.cfg").read_text() == "[core]\n\tfsmonitor = evil\n"  # a link is never written through


@needs_git
def test_a_worktree_outside_the_workspace_is_refused(tmp_path: Path) -> None:
    """``core.worktree`` is where git checks files out: a submodule's stays inside; one
    pointing out of the workspace would have the host's git write the sandbox's files there."""
    ws = tmp_path / "ws"
    ws.mkdir()
    guard = WorkspaceGuard(ws)
    guard.check()
    _git(ws, "init", "-q", "--bare", "m")
    _git(ws / "m", "config", "core.worktree", "../sub")
    _git(ws, "init", "-q", "--bare", "o")
    _git(ws / "o", "config", "core.worktree", "../../../home")
    done = {(a.path, a.what) for a in guard.check()}
    assert done == {("o/config", "git config: removed core.worktree")}


@needs_git
def test_a_tools_write_is_looked_at_only_where_git_could_read_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _git(ws, "init", "-q")
    _git(ws, "config", "core.hooksPath", ".husky")
    (ws / ".husky").mkdir()
    (ws / "src").mkdir()
    (ws / "h").symlink_to(".husky")
    guard = WorkspaceGuard(ws)
    guard.check()
    assert not guard.concerns("src/app.py")
    assert not guard.concerns("README.md")
    for p in (".git/config", "r/.git", "sub/HEAD", "x/hooks/pre-commit", ".husky/pre-commit", "h/pre-commit"):
        assert guard.concerns(p), p


@needs_git
def test_a_walk_that_lists_only_changed_directories_misses_nothing_a_command_makes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "deep" / "er").mkdir(parents=True)
    _git(ws / "deep", "init", "-q", "r")
    guard = WorkspaceGuard(ws)
    guard.check()
    guard.check()  # every directory known now: the next walk lists none of them again
    with open(ws / "deep" / "r" / ".git" / "config", "a") as f:  # in place: its directory unchanged
        f.write("[core]\n\tfsmonitor = evil\n")
    (ws / "deep" / "er" / "new").mkdir()
    (ws / "deep" / "er" / "new" / "f").write_bytes(b"x")
    (ws / "deep" / "er" / "new" / "f").chmod(0o4755)
    _git(ws / "deep" / "er", "init", "-q", "--bare", "b")
    _git(ws / "deep" / "er" / "b", "config", "core.pager", "evil")
    done = {(a.path, a.what) for a in guard.check()}
    assert done == {
        ("deep/r/.git/config", "git config: removed core.fsmonitor"),
        ("deep/er/new/f", "setuid/setgid bits cleared"),
        ("deep/er/b/config", "git config: removed core.pager"),
    }


def test_setid_bits_and_capabilities_are_removed_never_through_a_link(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"x")
    outside.chmod(0o4755)
    (ws / "link").symlink_to(outside)
    (ws / "d").mkdir()
    f = ws / "d" / "f"
    f.write_bytes(b"#!/bin/sh\n")
    f.chmod(0o6755)
    guard = WorkspaceGuard(ws)
    done = {(a.path, a.what) for a in guard.check()}
    assert ("d/f", "setuid/setgid bits cleared") in done
    assert stat.S_IMODE(f.stat().st_mode) == 0o755
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755  # outside the workspace: untouched


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_device_nodes_are_removed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mknod(ws / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert [(a.path, a.what) for a in WorkspaceGuard(ws).check()] == [("null", "device node removed")]
    assert not (ws / "null").exists()


@pytest.mark.parametrize("machine", sorted(modeguard.ARCHES))
def test_the_agents_filter_builds_for_each_architecture(machine: str) -> None:
    prog = modeguard.program(machine)
    assert prog is not None and 10 < len(prog) < 255
    assert modeguard.program("sparc") is None


@pytest.mark.skipif(os.uname().machine not in modeguard.ARCHES, reason="no filter for this architecture")
def test_the_agents_filter_refuses_setid_bits_and_devices(tmp_path: Path) -> None:
    """Installed in a child process of this host (the same filter every agent installs)."""
    code = textwrap.dedent(
        """
        import errno, os, sys
        from sandbox.agent import modeguard
        assert modeguard.install() is None
        os.chdir(sys.argv[1])
        def refused(fn):
            try:
                fn()
            except PermissionError:
                return True
            return False
        open("f", "w").close()
        assert refused(lambda: os.chmod("f", 0o4755))
        assert refused(lambda: os.chmod("f", 0o2755))
        assert refused(lambda: os.open("g", os.O_CREAT | os.O_WRONLY, 0o4755))
        assert refused(lambda: os.mknod("dev", 0o600 | 0o020000, os.makedev(1, 3)))
        os.chmod("f", 0o755)  # the rest works
        os.close(os.open("h", os.O_CREAT | os.O_WRONLY, 0o644))
        os.close(os.open("f", os.O_RDONLY, 0o7777))  # an open that creates nothing: its mode unread
        os.mkfifo("fifo")
        print("ok")
        """
    )
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert p.stdout == b"ok\n", p.stderr.decode()
    assert not (tmp_path / "g").exists() or not (tmp_path / "g").stat().st_mode & 0o6000


def _setuid_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"#!/bin/sh\n")
    path.chmod(0o4755)


def test_a_quick_check_does_a_small_workspaces_whole_check(tmp_path: Path) -> None:
    """On the event loop (``check_quick``): a small workspace's check done in full, its fixes
    reported as ``check`` reports them."""
    ws = tmp_path / "ws"
    ws.mkdir()
    guard = WorkspaceGuard(ws)
    assert guard.check_quick(1.0) is None  # the first look takes the trust (files written): a thread's
    assert guard.check() == []
    _setuid_file(ws / "d" / "f")
    done = guard.check_quick(1.0)
    assert done is not None and {(a.path, a.what) for a in done} == {("d/f", "setuid/setgid bits cleared")}
    assert stat.S_IMODE((ws / "d" / "f").stat().st_mode) == 0o755
    assert guard.check_quick(1.0) == []


def test_a_quick_check_over_its_budget_leaves_the_rest_and_its_report_to_the_full_check(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    guard = WorkspaceGuard(ws)
    guard.check()
    for i in range(30):
        _setuid_file(ws / f"d{i:02d}" / "f")
    # past its deadline from the start: it gives up at the first directory it would enter
    assert guard.check_quick(-1.0) is None
    done = {(a.path, a.what) for a in guard.check()}
    assert done == {(f"d{i:02d}/f", "setuid/setgid bits cleared") for i in range(30)}
    assert all(stat.S_IMODE((ws / f"d{i:02d}" / "f").stat().st_mode) == 0o755 for i in range(30))
    # and what a quick check fixed before it gave up is reported by the check that follows
    guard2 = WorkspaceGuard(ws)
    guard2.check()
    _setuid_file(ws / "f")  # in the root: fixed before the walk enters a subdirectory
    seen: list[str] = []
    real_run = guard2._walk.run

    def run_then_late(root_fd: int, actions: list, deadline: float | None = None):  # type: ignore[no-untyped-def]
        for rel in real_run(root_fd, actions, None):
            seen.append(rel)
            yield rel
        if deadline is not None:
            from worker.guard.walk import OverBudget

            raise OverBudget("late")

    guard2._walk.run = run_then_late  # type: ignore[method-assign]
    assert guard2.check_quick(1.0) is None
    assert stat.S_IMODE((ws / "f").stat().st_mode) == 0o755  # fixed by the quick check
    assert {(a.path, a.what) for a in guard2.check()} == {("f", "setuid/setgid bits cleared")}


def test_a_quick_check_never_waits_for_the_lock_or_makes_a_whole_walk(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    guard = WorkspaceGuard(ws)
    guard.check()
    with guard._lock:  # another thread's check under way
        assert guard.check_quick(1.0) is None
    guard._walk.full_at = -1e9  # a whole walk (every file stat'ed again) is due
    assert guard.check_quick(1.0) is None
    assert guard.check() == []
    assert guard.check_quick(1.0) == []


@needs_git
def test_a_quick_check_leaves_a_git_config_to_read_to_the_full_check(tmp_path: Path) -> None:
    """Reading a config runs git: never on the event loop."""
    ws = tmp_path / "ws"
    ws.mkdir()
    guard = WorkspaceGuard(ws)
    guard.check()
    _git(ws, "init", "-q", "r")
    _git(ws / "r", "config", "core.pager", "evil")
    assert guard.check_quick(1.0) is None
    assert {(a.path, a.what) for a in guard.check()} == {("r/.git/config", "git config: removed core.pager")}
    assert guard.check_quick(1.0) == []  # judged clean now: nothing for git to read


async def test_check_soon_stays_on_the_loop_while_checks_fit_and_moves_to_a_thread_when_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from worker.guard import guard as guard_module

    ws = tmp_path / "ws"
    ws.mkdir()
    guard = WorkspaceGuard(ws)
    threads: list[str] = []
    real_check = guard.check

    def check() -> list:  # type: ignore[type-arg]
        threads.append(threading.current_thread().name)
        return real_check()

    guard.check = check  # type: ignore[method-assign]
    assert await guard.check_soon() == []  # the first look (the trust taken): in a thread, not judged
    _setuid_file(ws / "d" / "f")
    assert [a.path for a in await guard.check_soon()] == ["d/f"]  # on the loop
    assert len(threads) == 1
    monkeypatch.setattr(guard_module, "INLINE_BUDGET", -1.0)  # nothing fits now
    _setuid_file(ws / "e" / "f")
    assert [a.path for a in await guard.check_soon()] == ["e/f"]
    assert len(threads) == 2 and threads[-1] != threading.current_thread().name
    await guard.check_soon()
    assert len(threads) == 3  # straight to the thread while checks do not fit
    monkeypatch.setattr(guard_module, "INLINE_BUDGET", 10.0)
    await guard.check_soon()  # one more in a thread: it fits, so the next is on the loop
    await guard.check_soon()
    assert len(threads) == 4
