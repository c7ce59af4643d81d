"""JSON text that any UTF-8 stream takes, for results leaving the worker.

Apart from :mod:`worker.result` because the CLI prints every result with
:func:`json_line`, also when the call ran in the local worker: that path imports only the
standard library (``dataclasses`` alone would import ``inspect``, milliseconds per call).
"""

from __future__ import annotations

import json

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (UTF-8 cannot encode it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_line(obj: Any) -> str:
    """Compact JSON, non-ASCII kept as is, that any UTF-8 stream takes: when a lone
    surrogate is in ``obj``, the whole line is ASCII with ``\\uXXXX`` escapes instead
    (lossless for a Python or JavaScript reader)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)
    if not text.isascii() and has_surrogate(text):
        text = json.dumps(obj, separators=(",", ":"), default=str)
    return text


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (inf, -inf, NaN) as the string JSON writers
    spell it with (``"Infinity"``, ``"-Infinity"``, ``"NaN"``): JSON has no such numbers,
    and a browser's ``JSON.parse`` refuses the bare words. Echoes of a refused input (a
    ``"timeout": Infinity`` a model sent) pass through here."""
    if isinstance(obj, float):
        if obj != obj:
            return "NaN"
        if obj in (float("inf"), float("-inf")):
            return "Infinity" if obj > 0 else "-Infinity"
        return obj
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj
