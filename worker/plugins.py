"""Optional integrations, found by entry point (group ``loom_worker.integrations``) so that
the core never imports them (:mod:`worker.integrations`): a command that offers one loads
it only when it is used.

Errors::

    IntegrationUnavailable   (also ImportError)  not installed, or its extra is missing
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

GROUP = "loom_worker.integrations"


class IntegrationUnavailable(ImportError):
    pass


def integration(name: str) -> Any:
    """The module of the integration ``name`` (``"ray"``). Raises IntegrationUnavailable,
    naming the extra to install, when it or the project it needs is not installed."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise IntegrationUnavailable(
            f"the {name!r} integration is not installed (reinstall loom-worker: pip install 'loom-worker[{name}]')"
        )
    try:
        return found[0].load()
    except ModuleNotFoundError as e:
        raise IntegrationUnavailable(
            f"the {name!r} integration needs {(e.name or '?').split('.')[0]!r}: pip install 'loom-worker[{name}]'"
        ) from e
