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
    valid strings) and the real working directory (resolved inside the workspace) for a
    process the host asks for."""
    env = dict(state.image_env)
    env.update(BASE_ENV)
    if state.image_env.get("PATH"):
        env["PATH"] = state.image_env["PATH"]  # the image's own PATH (/usr/local/go/bin, ...)
    env["HOME"] = os.environ.get("HOME", "/tmp")
    env["USER"] = env["LOGNAME"] = os.environ.get("USER", "sandbox")
    for k, v in (req.get("env") or {}).items():
        if isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v:
            env[k] = v
    cwd_fd, parts = paths.open_dir(req.get("cwd", "."))
    os.close(cwd_fd)
    return env, state.ROOT + ("/" + "/".join(parts) if parts else "")
