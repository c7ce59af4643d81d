"""The web dashboard, served by the HTTP service at ``/``: workspaces, the live timeline
of tool calls, changes with their diffs and undo, files, a command box, the egress log.

It is static files (``static/``: plain ES modules and one stylesheet, no build step)
that use only the public HTTP API, so everything it shows is available to scripts too.
:mod:`.guard` holds the service's browser-facing defences (CSRF, DNS rebinding, CSP).
"""

from .guard import Guard
from .routes import STATIC, mount

__all__ = ["STATIC", "Guard", "mount"]
