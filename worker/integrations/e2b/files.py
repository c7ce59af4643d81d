"""(being written: see the package's docstring)"""

from __future__ import annotations

from typing import Any


def routes(settings: Any) -> list[Any]:
    return []
