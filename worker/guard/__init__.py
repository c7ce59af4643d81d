"""The host's guard of a workspace: nothing a sandbox leaves there runs on the host.

The workspace is a host directory, and the host runs things from it: git (the developer's
``git status``, an editor's git integration) runs what a repository's config and hooks
name, and a setuid file runs with its owner's ids for whoever starts it. After every call
that can change the workspace (a command, a tool's write, a background process's start and
end; see :class:`worker.workspace.Workspace`), the guard walks the whole workspace on the
host, never following a link, and:

- clears setuid and setgid bits of regular files, removes device nodes and removes file
  capabilities (``security.capability``): the sandbox refuses to make them (seccomp, see
  docs/seccomp.md), this catches whatever arrived anyway;
- in every directory git could take for a repository's git directory (a ``HEAD``, a
  ``commondir``, or ``objects`` and ``refs``: a ``.git``, a bare repository, a linked
  worktree's or a submodule's directory, one a ``gitdir:`` file points at, wherever it
  is and whenever it appeared), holds ``config`` and ``config.worktree`` to an allowlist
  of keys that name no program (:mod:`.gitconfig`) and disables hooks (their execute bits
  cleared);
- trusts what was there when it first looked at the workspace (the owner's own hooks and
  config, their ``core.hooksPath``), until it changes.

    walk        the walk: from descriptors, no link followed, unchanged directories not
                listed again; setuid/setgid bits, devices and capabilities undone on the way
    gitconfig   the allowlist; reading a config with the host's git; the canonical rewrite
    guard       WorkspaceGuard: git directories' configs and hooks, the trusted baseline
"""

from .guard import TRUST_FILE, Action, WorkspaceGuard, as_dicts

__all__ = ["TRUST_FILE", "Action", "WorkspaceGuard", "as_dicts"]
