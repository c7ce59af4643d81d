"""Nothing a sandbox plants in a workspace runs when git on the host is used there.

Each plant is a command run in the sandbox (through the registry, as an agent's
``shell_execute``) that tries to make git run a command of its choosing: through config
(fsmonitor, hooksPath, include, filter and textconv drivers, sshCommand, uploadpack, a
symlinked config), hooks, and every way git finds a repository (``gitdir:`` files,
``commondir``, linked worktrees, submodules, an implicit bare repository, a ``.git`` moved
into place), in repositories the developer made before the sandbox started (plain, with a
linked worktree, with a submodule, with a trusted ``core.hooksPath``) and in ones the
sandbox makes. Then the host's real git runs there as a developer would (``status``,
``diff``, ``log``, ``commit``, ``fetch``; a global config with ``safe.directory=*``): the
planted command would touch a marker file outside the workspace, which must not exist.

And the other way round: an ordinary git session in the sandbox (init, add, commit,
branch, checkout, merge, rebase, stash, worktree add, submodule add of a local repository,
gc, fetch from a local remote) works, the guard leaves it alone, and the changelog has it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from tests.docker.conftest import own_registry

pytestmark = pytest.mark.docker

UID = 1000

#: What every plant's command starts with: git's identity and defaults in the sandbox's $HOME.
PRELUDE = (
    "set -e; git config --global user.name agent; git config --global user.email agent@sandbox; "
    "git config --global init.defaultBranch main; git config --global protocol.file.allow always; "
)

#: (name, layout made on the host first, command in the sandbox, host git's directory).
#: ``{M}`` is the marker's path (outside the workspace), ``{R}`` a command creating it.
PLANTS: list[tuple[str, str, str, str]] = [
    # -- repositories that existed before the sandbox started ---------------------------
    ("fsmonitor in the existing config", "plain", "git config core.fsmonitor '{R}' || true", "."),
    (
        "commondir redirect of the existing .git",
        "plain",
        "mkdir -p .evil && cp -r .git/objects .git/refs .evil/ && printf '[core]\\n\\tfsmonitor = {R}\\n' "
        "> .evil/config && echo ../.evil > .git/commondir",
        ".",
    ),
    (
        "the owner's trusted core.hooksPath: its hook rewritten",
        "husky",
        "printf '#!/bin/sh\\n{R}\\n' > .husky/pre-commit && chmod +x .husky/pre-commit",
        ".",
    ),
    (
        "existing linked worktree: commondir to a planted config",
        "worktree",
        "mkdir -p .evil && cp -r .git/objects .git/refs .evil/ && printf '[core]\\n\\tfsmonitor = {R}\\n' "
        "> .evil/config && echo ../../../.evil > .git/worktrees/wt/commondir",
        "wt",
    ),
    (
        "existing submodule: its config under .git/modules",
        "submodule",
        "git -C sub config core.fsmonitor '{R}' && printf '#!/bin/sh\\n{R}\\n' > .git/modules/sub/hooks/pre-commit "
        "&& chmod +x .git/modules/sub/hooks/pre-commit",
        ".",
    ),
    (
        "existing repository: a nested .git file pointing at a planted git dir",
        "plain",
        "mkdir -p nest .g && git init -q --bare .g/r && git -C .g/r config core.bare false && "
        "git -C .g/r config core.fsmonitor '{R}' && echo 'gitdir: ../.g/r' > nest/.git",
        "nest",
    ),
    # -- repositories the sandbox makes ----------------------------------------------------
    ("new repo: core.fsmonitor", "none", "git init -q r && git -C r config core.fsmonitor '{R}'", "r"),
    (
        "new repo: core.hooksPath and hooks",
        "none",
        "git init -q r && mkdir r/h && for h in pre-commit post-commit reference-transaction post-index-change; do "
        "printf '#!/bin/sh\\n{R}\\n' > r/h/$h; chmod +x r/h/$h; cp r/h/$h r/.git/hooks/$h; done && "
        "git -C r config core.hooksPath h",
        "r",
    ),
    (
        "new repo: include.path of a planted file",
        "none",
        "git init -q r && printf '[core]\\n\\tfsmonitor = {R}\\n' > evil.cfg && "
        "git -C r config include.path ../../evil.cfg",
        "r",
    ),
    (
        "new repo: clean filter and diff textconv drivers",
        "none",
        "git init -q r && echo data > r/f.txt && git -C r add f.txt && git -C r commit -qm one && echo more >> r/f.txt "
        "&& printf '* filter=x diff=x\\n' > r/.gitattributes && git -C r config filter.x.clean '{R}; cat' && "
        "git -C r config filter.x.smudge cat && git -C r config diff.x.textconv 'sh -c \"{R}; cat \\$0\"' && "
        "git -C r config diff.external '{R}'",
        "r",
    ),
    (
        "new repo: core.sshCommand and remote uploadpack",
        "none",
        "git init -q r && git -C r remote add origin ssh://example.invalid/x && git -C r config core.sshCommand '{R}' "
        "&& git -C r remote add up ./ && git -C r config remote.up.uploadpack '{R}; git-upload-pack' && "
        "git -C r config protocol.ext.allow always && git -C r remote add ex 'ext::sh -c {R}'",
        "r",
    ),
    (
        "new repo: a symlinked config",
        "none",
        "git init -q r && printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = {R}\\n' > evil.cfg && "
        "rm r/.git/config && ln -s ../../evil.cfg r/.git/config",
        "r",
    ),
    (
        "new repo: an implicit bare repository",
        "none",
        "git init -q --bare b && git -C b config core.bare false && git -C b config core.worktree .. && "
        "git -C b config core.fsmonitor '{R}'",
        "b",
    ),
    (
        "new repo: a linked worktree's config.worktree",
        "none",
        "git init -q r && cd r && git commit -q --allow-empty -m one && git worktree add -q ../w && "
        "git config extensions.worktreeConfig true && git config --worktree core.fsmonitor '{R}' && "
        "cd ../w && git config --worktree core.fsmonitor '{R}' && "
        # (the sandbox's git writes /workspace/...: relative, as git 2.48 can, the host finds it)
        "printf 'gitdir: ../r/.git/worktrees/w\\n' > .git",
        "w",
    ),
    (
        "new repo: a submodule's config",
        "none",
        "git init -q lib && git -C lib commit -q --allow-empty -m lib && git init -q r && cd r && "
        "git submodule -q add ../lib lib && git commit -qm sub && git -C lib config core.fsmonitor '{R}'",
        "r",
    ),
    (
        "a .git moved into place after the checks of an earlier call",
        "none",
        "mkdir -p r && echo x > r/x && git init -q tmp && git -C tmp config core.fsmonitor '{R}' && "
        "mv tmp/.git r/.git && rmdir tmp 2>/dev/null || true",
        "r",
    ),
]


def _host_git(cwd: Path, home: Path) -> list[str]:
    """The host's git in ``cwd`` as a developer runs it; returns what each command said."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
    out = []
    for cmd in (
        "git status",
        "git diff",
        "git diff HEAD",
        "git log -1 --stat",
        "git add -A && git commit -q -m host --allow-empty",
        "git fetch --all -q",
    ):
        p = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, timeout=60, check=False)
        out.append(f"$ {cmd} -> {p.returncode}: {p.stderr.decode(errors='replace')[-300:]}")
    return out


def _host(cmd: str, cwd: Path, home: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LC_ALL": "C"}
    subprocess.run(cmd, shell=True, cwd=cwd, env=env, check=True, capture_output=True)


def _layout(kind: str, ws: Path, outside: Path, home: Path) -> None:
    """The developer's repository, made on the host before the sandbox starts."""
    if kind == "none":
        return
    _host("git init -q && echo a > a.txt && git add a.txt && git commit -qm first", ws, home)
    _host(
        f"git init -q --bare {outside}/o.git && git remote add origin {outside}/o.git && git push -q origin main",
        ws,
        home,
    )
    if kind == "worktree":
        _host("git worktree add -q wt", ws, home)
    elif kind == "submodule":
        _host(f"git init -q {outside}/lib && git -C {outside}/lib commit -q --allow-empty -m lib", ws, home)
        _host(f"git submodule -q add {outside}/lib sub && git commit -qm sub", ws, home)
    elif kind == "husky":
        _host(
            "mkdir .husky && printf '#!/bin/sh\\ntrue\\n' > .husky/pre-commit && chmod +x .husky/pre-commit", ws, home
        )
        _host("git config core.hooksPath .husky && git add -A && git commit -qm husky", ws, home)
    subprocess.run(["chown", "-R", f"{UID}:{UID}", str(ws)], check=True)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """$HOME of the developer: a global config naming who they are, trusting every
    directory (``safe.directory=*``: the ownership check must not be what hides a plant)."""
    h = tmp_path / "home"
    h.mkdir()
    (h / ".gitconfig").write_text(
        "[user]\n\tname = Dev\n\temail = dev@host\n[safe]\n\tdirectory = *\n"
        '[init]\n\tdefaultBranch = main\n[protocol "file"]\n\tallow = always\n'
    )
    return h


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
@pytest.mark.parametrize(("name", "layout", "command", "where"), PLANTS, ids=[p[0] for p in PLANTS])
async def test_a_plant_never_runs_on_the_host(
    runtime: str, name: str, layout: str, command: str, where: str, tmp_path: Path, home: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, UID, UID)
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "markers" / "ran"
    marker.parent.mkdir()
    _layout(layout, ws, outside, home)
    planted = command.replace("{R}", f"touch {marker}").replace("{M}", str(marker))
    async with own_registry(tmp_path, runtime) as reg:
        r = await reg.execute("shell_execute", {"command": PRELUDE + planted}, ws)
        said = r.output
        # A second call: what the first one left is checked again, as after any call.
        await reg.execute("shell_execute", {"command": "true"}, ws)
    target = ws / where
    assert target.is_dir(), said
    tried = _host_git(target, home)
    if layout != "none":
        tried += _host_git(ws, home)
    assert not marker.exists(), f"{name}: the planted command ran on the host\n{said}\n" + "\n".join(tried)


LEGIT = (
    PRELUDE
    + """
mkdir upstream && cd upstream && git init -q && echo u > u.txt && git add u.txt && git commit -qm upstream && cd ..
git init -q lib && git -C lib commit -q --allow-empty -m lib
git init -q proj && cd proj
echo one > README && git add README && git commit -qm one
git branch feature && git checkout -q feature && echo two >> README && git commit -qam two
git checkout -q main && echo side > side.txt && git add side.txt && git commit -qm side
git merge -q --no-edit feature
git checkout -q -b topic && echo t > t.txt && git add t.txt && git commit -qm topic
git checkout -q main && echo m > m.txt && git add m.txt && git commit -qm m
git checkout -q topic && git rebase -q main
echo wip >> t.txt && git stash -q && git stash pop -q && git checkout -q -- t.txt
git worktree add -q ../proj-wt main~1 2>/dev/null || git worktree add -q --detach ../proj-wt
git submodule -q add ../lib lib && git commit -qm 'add lib'
git remote add up ../upstream && git fetch -q up && git log --oneline up/main | grep -q upstream
git gc -q
git status --short
echo SESSION-OK
"""
)


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_a_legitimate_git_session_works_and_is_recorded(runtime: str, tmp_path: Path, home: Path) -> None:
    from worker.changelog import Changelog

    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, UID, UID)
    async with own_registry(tmp_path, runtime) as reg:
        r = await reg.execute("shell_execute", {"command": LEGIT}, ws)
        assert r.success and "SESSION-OK" in r.output, r.output
        w = await reg.workspace(ws)
        assert w.guard.last == [], w.guard.last  # nothing of it looked like a plant
    async with Changelog.open(tmp_path / "data", ws.resolve()) as cl:
        paths = {e.path for e in await cl.log()}
    assert {"proj", "lib", "upstream", "proj-wt"} <= paths, paths  # each made whole: a tree entry
    # The host's git sees the sandbox's history as it is.
    p = subprocess.run(  # noqa: ASYNC221 (the host's git, as the developer runs it)
        ["git", "log", "--format=%s", "-3"],
        cwd=ws / "proj",
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        capture_output=True,
        check=True,
    )
    assert "topic" in p.stdout.decode().split(), p.stdout


LEGIT_EXISTING = (
    PRELUDE
    + """
git init -q upstream
git -C upstream commit -q --allow-empty -m upstream
echo one >> a.txt && git commit -qam one
git branch feature && git checkout -q feature && echo two >> a.txt && git commit -qam two
git checkout -q main && echo side > side.txt && git add side.txt && git commit -qm side
git merge -q --no-edit feature
git checkout -q -b topic && echo t > t.txt && git add t.txt && git commit -qm topic
git checkout -q main && echo m > m.txt && git add m.txt && git commit -qm m
git checkout -q topic && git rebase -q main
echo wip >> t.txt && git stash -q && git stash pop -q && git checkout -q -- t.txt
git worktree add -q --detach wt2
git fetch -q ./upstream main && git log --oneline FETCH_HEAD | grep -q upstream
git gc -q
echo SESSION-OK
"""
)


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_a_legitimate_git_session_in_the_existing_repository(runtime: str, tmp_path: Path, home: Path) -> None:
    """The developer's repository: everything that does not write its (read-only) config
    works; the guard leaves it alone (``git remote add`` and ``submodule add``, which write
    the config, are the host's to run there: docs/security.md)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    _layout("plain", ws, outside, home)
    async with own_registry(tmp_path, runtime) as reg:
        r = await reg.execute("shell_execute", {"command": LEGIT_EXISTING}, ws)
        assert r.success and "SESSION-OK" in r.output, r.output
        assert (await reg.workspace(ws)).guard.last == []
    p = subprocess.run(  # noqa: ASYNC221 (the host's git, as the developer runs it)
        ["git", "log", "--format=%s", "-1", "topic"],
        cwd=ws,
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        capture_output=True,
        check=True,
    )
    assert p.stdout == b"topic\n", p


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_a_background_processs_plant_is_undone_without_another_call(
    runtime: str, tmp_path: Path, home: Path
) -> None:
    """A background process plants after its call has ended: the guard's watch undoes it
    while the process runs, before any other call."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, UID, UID)
    marker = tmp_path / "markers" / "ran"
    marker.parent.mkdir()
    plant = (
        f"sleep 1; git init -q r && git -C r config core.fsmonitor 'touch {marker}' && "
        "printf '#!/bin/sh\\n' > r/.git/hooks/pre-commit && chmod +x r/.git/hooks/pre-commit && touch planted; "
        "sleep 600"
    )
    async with own_registry(tmp_path, runtime) as reg:
        r = await reg.execute("shell_execute", {"command": PRELUDE + plant, "background": True}, ws)
        assert r.success, r.output
        config, hook = ws / "r" / ".git" / "config", ws / "r" / ".git" / "hooks" / "pre-commit"

        def undone() -> bool:
            return (ws / "planted").exists() and "fsmonitor" not in config.read_text() and not os.access(hook, os.X_OK)

        for _ in range(600):  # a synchronisation (the plant comes a second later), not a timing check
            if undone():
                break
            await asyncio.sleep(0.1)
        assert undone(), config.read_text() if config.exists() else "no plant"
        tried = _host_git(ws / "r", home)
    assert not marker.exists(), "\n".join(tried)
