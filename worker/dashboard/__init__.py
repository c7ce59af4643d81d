"""The web dashboard, served by the HTTP service at ``/``: workspaces, the live timeline
of tool calls, changes with their diffs and undo, files, a command box, the egress log.

It is static files (``static/``: plain ES modules and one stylesheet, no build step)
that use only the public HTTP API, so everything it shows is available to scripts too.
:mod:`.guard` hardens its own responses (CSP, framing); who may call the service is
decided in :mod:`worker.auth`.
"""

from .guard import ASSETS_PREFIX, PAGE, DashboardHeaders, is_dashboard_path
from .routes import STATIC, mount

__all__ = ["ASSETS_PREFIX", "PAGE", "STATIC", "DashboardHeaders", "is_dashboard_path", "mount"]
