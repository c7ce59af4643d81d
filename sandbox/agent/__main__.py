"""``python3 -m sandbox.agent ROOT``: the agent rooted at ROOT, requests on stdin (by hand,
for debugging; the worker delivers the bundle instead, see ``sandbox.bundle``)."""

import sys

from .main import run

run(sys.argv[1:])
