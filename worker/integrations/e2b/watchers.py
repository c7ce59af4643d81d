"""envd's polling watchers (``CreateWatcher``, ``GetWatcherEvents``, ``RemoveWatcher``:
the synchronous SDK's ``watch_dir``): a watch of the sandbox's agent kept here under an id,
its events taken by each poll.

A watcher belongs to the sandbox that made it (another sandbox's id is not found). One
that nobody polls for :data:`IDLE_TTL` seconds is stopped, so a client that never removes
its watchers does not keep them for ever; one whose sandbox went away answers its error
at the next poll.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from sandbox.treeops import PathWatch

#: A watcher not polled for this long is stopped and forgotten.
IDLE_TTL = 600.0
#: Most watchers kept at once, over every sandbox of the service.
MAX_WATCHERS = 1024


class WatcherNotFound(LookupError):
    """No watcher of that id (for that sandbox)."""


class TooManyWatchers(Exception):
    """:data:`MAX_WATCHERS` are kept already."""


@dataclass
class Watcher:
    sandbox_id: str
    watch: PathWatch
    base: str  # the watched directory, as E2B names it
    include_entry: bool
    polled: float = field(default_factory=time.monotonic)


class Watchers:
    """The watchers of a service's sandboxes."""

    def __init__(self) -> None:
        self._by_id: dict[str, Watcher] = {}

    async def add(self, sandbox_id: str, watch: PathWatch, base: str, include_entry: bool) -> str:
        """Keep ``watch`` as a new watcher of ``sandbox_id``; its id. Raises TooManyWatchers
        (``watch`` is then closed)."""
        await self._reap()
        if len(self._by_id) >= MAX_WATCHERS:
            await watch.close()
            raise TooManyWatchers(f"{MAX_WATCHERS} watchers are open: remove some (WatchHandle.stop)")
        wid = "w" + secrets.token_hex(8)
        self._by_id[wid] = Watcher(sandbox_id, watch, base, include_entry)
        return wid

    async def get(self, sandbox_id: str, watcher_id: str) -> Watcher:
        """The watcher (its poll time renewed). Raises WatcherNotFound."""
        await self._reap()
        w = self._by_id.get(watcher_id)
        if w is None or w.sandbox_id != sandbox_id:
            raise WatcherNotFound(f"watcher with id {watcher_id} not found")
        w.polled = time.monotonic()
        return w

    async def remove(self, sandbox_id: str, watcher_id: str) -> None:
        """Stop and forget the watcher. Raises WatcherNotFound."""
        w = await self.get(sandbox_id, watcher_id)
        del self._by_id[watcher_id]
        await w.watch.close()

    async def _reap(self) -> None:
        now = time.monotonic()
        for wid, w in list(self._by_id.items()):
            if now - w.polled > IDLE_TTL:
                del self._by_id[wid]
                await w.watch.close()
