"""The registry (Loom Spec 05): the tools, the workspaces calls run in, and the calls.

One job per module:

- :mod:`.table`: the tool table (:class:`ToolTable`): tools by name, a version that moves
  with every change, and subscribers told of each change;
- :mod:`.pool`: the workspace pool (:class:`WorkspacePool`): one sandbox + changelog per
  directory, per-workspace settings, the egress gateway of the workspaces allowed out;
- :mod:`.execution`: running one call, the one place its errors are sorted into the two
  channels (a result the model can act on, or an infrastructure failure);
- :mod:`.core`: :class:`ToolRegistry`, the three behind one object, built from what it
  is given;
- :mod:`.default`: the composition, :func:`default_registry` (the production registry
  from the settings).
"""

from .core import ToolRegistry
from .default import default_registry
from .pool import RecorderFactory, WorkspacePool
from .table import CORE_TOOLS, ToolTable

__all__ = ["CORE_TOOLS", "RecorderFactory", "ToolRegistry", "ToolTable", "WorkspacePool", "default_registry"]
