"""An image pull's progress on the CLI's stderr (stdout carries only results).

On a terminal: one line per image, redrawn in place (``pulling python:3.12-slim  [#####
.....]  48%  12.1/25.3 MB  3/5 layers``), ended with ``pulled ...`` or the failure. Elsewhere
(CI logs, a pipe): a line when a pull starts and one when it ends, nothing in between.

It takes :class:`sandbox.pulls.PullEvent` objects (a pull in this process) or their dicts
(a pull in the CLI's local worker, sent as ``pull`` frames).
"""

from __future__ import annotations

import sys

# Not `typing.TYPE_CHECKING`: this runs on every `call`, and importing typing costs milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

_WIDTH = 24


class PullBar:
    """Draws pull events on ``stream`` (stderr by default)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._started: set[str] = set()

    def __call__(self, event: Any) -> None:
        e: dict[str, Any] = event.as_dict() if hasattr(event, "as_dict") else dict(event)
        image = str(e.get("image", ""))
        state = e.get("state")
        if state == "pulling":
            if self._tty:
                self._write("\r\x1b[K" + _line(e))
            elif image not in self._started:
                self._write(f"pulling {image} from {e.get('registry')}\n")
            self._started.add(image)
            return
        self._started.discard(image)
        end = "\r\x1b[K" if self._tty else ""
        if state == "done":
            self._write(f"{end}pulled {image} ({_mb(e.get('bytes_total'))} MB, {e.get('layers', 0)} layers)\n")
        elif state == "failed":
            self._write(f"{end}pull of {image} failed: {e.get('error')}\n")

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # stderr closed: the pull goes on regardless
            pass


def _line(e: dict[str, Any]) -> str:
    done, total = int(e.get("bytes_done") or 0), int(e.get("bytes_total") or 0)
    frac = done / total if total else 0.0
    filled = int(frac * _WIDTH)
    bar = "#" * filled + "." * (_WIDTH - filled)
    return (
        f"pulling {e.get('image')}  [{bar}] {frac * 100:3.0f}%  {_mb(done)}/{_mb(total)} MB  "
        f"{e.get('layers_done', 0)}/{e.get('layers', 0)} layers  {e.get('status') or ''}"
    )


def _mb(n: Any) -> str:
    return f"{(int(n or 0)) / 1e6:.1f}"
