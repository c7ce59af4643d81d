"""The event loop the worker's own entry points (the CLI, ``mcp``) run on, public as
``worker.run``: ``asyncio.run`` on uvloop.

What a call costs on asyncio's own loop, beyond uvloop's: ``bench/bench_loop.py`` (table in
docs/benchmarks.md). A library cannot change the loop its caller runs, so a program using
``asyncio.run(main())`` gets asyncio's; ``worker.run(main())`` is the one-line change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion, on uvloop when it is installed (a declared dependency on
    Linux; ``serve`` gets it through uvicorn as well), else on asyncio's own loop.

    uvloop's loop and transports are C: a tool call spends ~0.15 ms less on the host here,
    a tenth of a shell command's round trip. The worker does not depend on it: every test
    tier also runs on the default loop, and the sandbox transports only use the portable
    protocol API. Raises whatever ``main`` raises.
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is installed wherever the worker is
        return asyncio.run(main)
    return uvloop.run(main)
