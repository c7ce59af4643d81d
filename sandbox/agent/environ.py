"""The environment and working directory of the processes the agent starts for the
host (``exec``, ``spawn``): the image's environment, then a non-interactive base
(``BASE_ENV``), then the caller's variables."""

import os

from . import paths, state

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "CI": "1",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "TERM": "dumb",
    "DEBIAN_FRONTEND": "noninteractive",
    "GIT_TERMINAL_PROMPT": "0",
    "PIP_NO_INPUT": "1",
    "NO_COLOR": "1",
    # no __pycache__ in the workspace: stale bytecode and changelog noise
    "PYTHONDONTWRITEBYTECODE": "1",
}


def command_env_cwd(req):
    """The environment (the image's, then the non-interactive base, then the caller's
    valid strings) and the working directory for a process the host asks for: resolved
    inside the workspace, or with ``cwd_any`` (a harness's command) any absolute path,
    which the kernel then judges as it would a ``cd``. Raises Refused for a ``cwd`` that
    is not a directory inside the workspace."""
    env = dict(_base_env())
    for k, v in (req.get("env") or {}).items():
        if isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v:
            env[k] = v
    cwd = req.get("cwd", ".")
    if req.get("cwd_any") and isinstance(cwd, str) and cwd.startswith("/") and "\x00" not in cwd:
        return env, cwd
    if cwd == ".":
        return env, state.ROOT  # (the root itself, opened at configure: nothing to resolve)
    cwd_fd, parts = paths.open_dir(cwd)
    os.close(cwd_fd)
    return env, state.ROOT + ("/" + "/".join(parts) if parts else "")


#: (the key it was made for, the environment): made once per configuration, copied per
#: process (building it, a user lookup included, cost more than the copy on every command)
_base = [None, None]  # type: list


def _base_env():
    key = (state.generation, os.environ.get("HOME"), os.environ.get("USER"))
    if _base[0] != key:
        _base[:] = [key, _make_base_env()]
    return _base[1]


def _make_base_env():
    env = dict(state.image_env)
    env.update(BASE_ENV)
    if state.image_env.get("PATH"):
        env["PATH"] = state.image_env["PATH"]  # the image's own PATH (/usr/local/go/bin, ...)
    env["HOME"] = os.environ.get("HOME", "/tmp")
    env["USER"] = env["LOGNAME"] = os.environ.get("USER", "sandbox")
    if state.as_user:
        # An agent started as another user (root, or a user of the image): its own name
        # and home, as a login would give them, not the workspace owner's.
        env.update(_own_identity())
    # What a command installs for itself lands in $HOME (the root is read-only): `npm
    # install -g` under $HOME/.local (npm's prefix), `pip install --user` in
    # $HOME/.local too; their bin comes first, then the agents' (the store's, read-only).
    home_bin = env["HOME"].rstrip("/") + "/.local/bin"
    env.setdefault("NPM_CONFIG_PREFIX", env["HOME"].rstrip("/") + "/.local")
    # Debian's Python (PEP 668) refuses `pip install --user` ("externally-managed-
    # environment") unless told otherwise; in a sandbox the system's site-packages is
    # read-only anyway, so the only place pip can write is the user's, under $HOME.
    env.setdefault("PIP_BREAK_SYSTEM_PACKAGES", "1")
    env["PATH"] = ":".join([home_bin] + list(state.path_prepend) + [env.get("PATH") or BASE_ENV["PATH"]])
    return env


def _own_identity():
    try:
        import pwd

        entry = pwd.getpwuid(os.getuid())
    except (ImportError, KeyError):
        return {}
    return {"HOME": entry.pw_dir or "/", "USER": entry.pw_name, "LOGNAME": entry.pw_name}
