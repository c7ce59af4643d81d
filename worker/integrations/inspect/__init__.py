"""loom-worker as an inspect_ai sandbox: ``sandbox="loom"`` or ``("loom", "loom.yaml")``.

``pip install 'loom-worker[inspect]'`` registers the type ``loom`` through inspect's
entry point (``worker.integrations.inspect._registry``), so a task needs no import. Each
sample gets a workspace per service, each with its own hardened sandbox, made at
``sample_init`` and removed at ``sample_cleanup`` (see :mod:`.lifecycle`); inspect's
calls map onto the harness API (:mod:`worker.harness`): see docs/inspect.md.
"""

from .config import LoomSandboxConfig, LoomServiceConfig
from .provider import LoomSandboxEnvironment

__all__ = ["LoomSandboxConfig", "LoomSandboxEnvironment", "LoomServiceConfig"]
