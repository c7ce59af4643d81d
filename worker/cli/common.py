"""What the command modules share: the settings as a command reads them, the ``type=`` of
a path option, and the guard of the test-only local backend. Light to import, as
everything on the CLI's start path."""

from __future__ import annotations

import os
import sys

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from ..registry import ToolRegistry
    from ..settings import Settings


#: Test-only: ``--backend local`` runs tools as host processes (NO isolation), and is
#: refused unless the environment has this variable set to 1 (CLI tests run without Docker).
UNSAFE_LOCAL_ENV = "LOOM_ALLOW_UNSAFE_LOCAL"


def unsafe_local_refused(backend: str | None) -> str | None:
    """Why ``--backend {backend}`` may not run here (None: it may): ``local`` needs
    ``LOOM_ALLOW_UNSAFE_LOCAL=1``."""
    if backend == "local" and os.environ.get(UNSAFE_LOCAL_ENV) != "1":
        return f"--backend local needs {UNSAFE_LOCAL_ENV}=1 (tests only: no isolation)"
    return None


def path_arg(value: str) -> Path:
    """``type=`` of a path option (pathlib is imported only when one is given)."""
    from pathlib import Path

    return Path(value)


def load_settings() -> Settings:
    """The ``LOOM_*`` settings. A value that does not validate is a usage error: it is
    reported naming the variable, and the process exits 2 (raises SystemExit)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from ..settings import Settings, describe_errors, describe_source_error

    try:
        return Settings()
    except ValidationError as e:
        print(f"loom-worker: error: {describe_errors(e)}", file=sys.stderr)
    except SettingsError as e:  # a list or object setting that is not JSON
        print(f"loom-worker: error: {describe_source_error(e)}", file=sys.stderr)
    raise SystemExit(2)


def workspace_registry(settings: Settings, **overrides: Any) -> ToolRegistry:
    """The registry a command that touches a workspace goes through: without the catalog
    and its own changelog recorder, but with every workspace's **own** settings, so the
    sandbox it reaches is the workspace's running one (a sandbox made from the process's
    settings alone would differ from it and replace it: its ``$HOME``, its background
    processes gone). Use as ``async with workspace_registry(s) as reg: w = await
    reg.workspace(path)``."""
    from ..registry import default_registry

    return default_registry(settings, changelog=False, catalog=False, **overrides)
