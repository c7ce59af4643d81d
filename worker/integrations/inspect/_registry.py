"""inspect_ai's entry point into loom-worker (``[project.entry-points.inspect_ai]``):
importing this module registers the sandbox type ``loom`` with inspect."""

from .provider import LoomSandboxEnvironment

__all__ = ["LoomSandboxEnvironment"]
