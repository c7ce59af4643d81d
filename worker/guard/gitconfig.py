"""Which git configuration a sandbox may leave in a repository, and the rewrite of one that
holds more.

git on the host runs what a repository's own config names: ``core.fsmonitor`` on every
``git status``, ``core.hooksPath``, ``core.sshCommand``, ``core.pager``, filter and diff
drivers, ``include.path`` (more config from anywhere), aliases, credential helpers, GPG
programs, ``hook.*.command``, ``trailer.*.command``, remote helpers' upload and receive packs,
protocol permissions (``ext::`` URLs run commands)... and new ones come with new git
versions. So a config the sandbox wrote is held to an **allowlist**: the keys git's own
commands write when an agent inits, commits, branches, adds remotes, worktrees and
submodules, and plain preferences that name no program. Everything else is removed.

The file is read by the host's git itself (``git config --file F --list --null``, which
reads that one file and follows no include), so what is judged is exactly what git
understands; a file git cannot parse makes git on the host refuse the repository (fatal,
nothing run) and is left as it is. A file holding a key off the list is rewritten with the
allowed entries only, in order, in a plain canonical form.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

#: Keys allowed without a subsection: section -> names ("*": every name of the section).
PLAIN: dict[str, frozenset[str] | str] = {
    "core": frozenset(
        """repositoryformatversion filemode bare logallrefupdates ignorecase precomposeunicode
        symlinks autocrlf eol safecrlf checkstat trustctime quotepath compression
        loosecompression bigfilethreshold sparsecheckout sparsecheckoutcone splitindex
        untrackedcache preloadindex abbrev commentchar commentstring whitespace
        sharedrepository warnambiguousrefs multipackindex commitgraph fsync fsyncmethod
        fsyncobjectfiles packedgitwindowsize packedgitlimit deltabasecachelimit notesref
        protecthfs protectntfs worktree packedrefstimeout filesreflocktimeout
        excludesfile attributesfile checkroundtripencoding""".split()
    ),
    "extensions": "*",  # the repository's format: git refuses one it does not know
    "user": frozenset({"name", "email", "useconfigonly"}),
    "branch": frozenset({"autosetupmerge", "autosetuprebase", "sort"}),
    "submodule": frozenset({"active", "recurse", "fetchjobs", "alternatelocation", "alternateerrorstrategy"}),
    "init": frozenset({"defaultbranch"}),
    "merge": frozenset("ff conflictstyle renamelimit renames log stat autostash verifysignatures".split()),
    "diff": frozenset(
        """renames renamelimit algorithm noprefix mnemonicprefix colormoved colormovedws context
        interhunkcontext indentheuristic submodule ignoresubmodules statgraphwidth statnamewidth
        relative orderfile wserrorhighlight suppressblankempty dirstat autorefreshindex""".split()
    ),
    "lfs": frozenset({"repositoryformatversion", "url", "pushurl", "locksverify", "fetchinclude", "fetchexclude"}),
    # (gc by name: git 2.42 added gc.recentObjectsHook, a program)
    "gc": frozenset(
        """auto autodetach autopacklimit aggressivedepth aggressivewindow bigpackthreshold
        logexpiry packrefs pruneexpire worktreepruneexpire reflogexpire reflogexpireunreachable
        rerereresolved rerereunresolved writecommitgraph cruftpacks maxcruftsize""".split()
    ),
    **{
        s: "*"
        for s in """pack index status color advice column fetch receive push pull rebase commit
        tag log feature checkout worktree rerere grep blame i18n repack splitindex fsck
        versionsort stash reftable""".split()
    },
}

#: Keys allowed with a subsection: section -> names.
SUBSECTION: dict[str, frozenset[str] | str] = {
    "branch": frozenset({"remote", "merge", "rebase", "pushremote", "description"}),
    "remote": frozenset(
        """url pushurl fetch push mirror tagopt prune prunetags skipdefaultupdate skipfetchall
        promisor partialclonefilter followremotehead""".split()
    ),
    "submodule": frozenset({"url", "path", "active", "branch", "fetchrecursesubmodules", "ignore", "shallow"}),
    "lfs": frozenset({"access", "locksverify"}),
    "gc": frozenset({"reflogexpire", "reflogexpireunreachable"}),  # gc.<pattern>.reflogexpire
    "color": "*",  # color.diff.meta
    "fsck": "*",
}


def allowed(key: str) -> bool:
    """Whether config ``key`` (as ``git config --list`` prints it: section and name
    lower-case, the subsection as written) may stay in a config the sandbox wrote."""
    section, _, rest = key.partition(".")
    if not rest:
        return False
    _sub, dot, name = rest.rpartition(".")
    table = SUBSECTION if dot else PLAIN
    names = table.get(section)
    if names is None:
        return False
    return names == "*" or name in names


#: Keys whose value is a path git writes to: allowed only where it stays in the workspace.
PATH_VALUED = frozenset({"core.worktree"})


class ConfigUnreadable(Exception):
    """git could not parse the file (git on the host then refuses the repository)."""


@dataclass
class Entry:
    key: str
    value: str | None  # None: a bare key (``[core] bare``: true)


def git_binary() -> str | None:
    return shutil.which("git")


def read(path: str, git: str, pass_fd: int | None = None) -> list[Entry]:
    """The entries of config file ``path`` as git reads it (no includes followed);
    ``pass_fd``: a descriptor ``path`` names (``/proc/self/fd/N``), passed on to git.

    Raises ConfigUnreadable (git refused it), OSError (git could not be run).
    """
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "LC_ALL": "C",
    }
    try:
        proc = _run(git, path, env, pass_fd)
    except subprocess.TimeoutExpired as e:
        raise OSError(f"git config did not answer: {e}") from e
    if proc.returncode != 0:
        raise ConfigUnreadable(proc.stderr.decode("utf-8", "replace").strip())
    entries = []
    for item in proc.stdout.split(b"\0"):
        if not item:
            continue
        key, nl, value = item.partition(b"\n")
        text = value.decode("utf-8", "surrogateescape") if nl else None
        entries.append(Entry(key.decode("utf-8", "surrogateescape"), text))
    return entries


def _run(git: str, path: str, env: dict[str, str], pass_fd: int | None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [git, "config", "--file", path.replace("/proc/self/fd/", "/dev/fd/"), "--no-includes", "--list", "--null"],
        capture_output=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=30,
        check=False,
        pass_fds=(pass_fd,) if pass_fd is not None else (),
    )


def _quote(value: str) -> str:
    out = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t").replace("\b", "\\b")
    return f'"{out}"'


def render(entries: list[Entry]) -> bytes:
    """``entries`` as a config file git reads back to the same entries."""
    lines: list[str] = []
    current: tuple[str, str | None] | None = None
    for e in entries:
        section, _, rest = e.key.partition(".")
        sub, dot, name = rest.rpartition(".")
        head = (section, sub if dot else None)
        if head != current:
            current = head
            if head[1] is None:
                lines.append(f"[{section}]")
            else:
                sub_q = head[1].replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'[{section} "{sub_q}"]')
        lines.append(f"\t{name}" if e.value is None else f"\t{name} = {_quote(e.value)}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape") if lines else b""
