"""What indexing the catalog's sources did: counts per source, errors per file or server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .custom import CustomTool
    from .index import IndexStats


@dataclass
class IndexReport:
    stats: dict[str, IndexStats] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # "custom:<file>" / "mcp:<server>" -> why
    custom_tools: list[CustomTool] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sources": {k: {"total": s.total, "written": s.written, "pruned": s.pruned} for k, s in self.stats.items()},
            "errors": self.errors,
        }
        return out
