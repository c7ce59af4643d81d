"""How many warm sandboxes a class should hold when the pool is sized by demand
(``LOOM_WARM_POOL=auto``).

A warm sandbox is only needed to cover the claims that come while the pool refills: a
claim takes one, and the refill makes another in about the time one takes to make
(:attr:`Demand.refill_s`, measured). So the pool holds as many as the most claims seen
within one refill time over the last minute, plus one for a claim arriving while that
refill runs; one while the last claim is older than a minute, so a workspace now and
then still finds one warm; none after :data:`IDLE_CLASS` without a claim.

Counting every claim of the last minute instead (what this replaced) kept a sandbox per
claim: sixty warm ones for a workspace a second, where two serve it as well. Each holds
memory and pids, and under gVisor an idle one also takes CPU (its Sentry's monitor wakes
every 400 µs on systrap), which every claimant's first call then shares. A burst (a
hundred workspaces at once) still sizes the pool for a hundred.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: Claims are remembered this long (seconds): demand older than this is gone.
DEMAND_WINDOW = 60.0
#: A class nobody asked for in this long (seconds) is emptied.
IDLE_CLASS = 600.0
#: The refill time assumed before one was measured (seconds).
REFILL_GUESS = 1.0
#: Weight of the newest refill time in the running mean.
REFILL_WEIGHT = 0.3


@dataclass
class Demand:
    """The claims of one class, and how long its refill takes."""

    asked: deque[float] = field(default_factory=deque)  # claim attempts (monotonic seconds), oldest first
    last: float | None = None  # the latest claim attempt (kept when ``asked`` forgets it)
    #: A running mean of the time one warm sandbox takes to make, and the pause the refill
    #: takes after a claim (seconds).
    refill_s: float = REFILL_GUESS

    def ask(self, now: float) -> None:
        """A claim was attempted at ``now``."""
        self.asked.append(now)
        self.last = now

    def made(self, seconds: float, pause: float = 0.0) -> None:
        """One warm sandbox took ``seconds`` to make, after the refill's ``pause``."""
        if seconds >= 0:
            self.refill_s += REFILL_WEIGHT * (seconds + max(0.0, pause) - self.refill_s)

    def idle(self, now: float) -> bool:
        """Nobody asked in :data:`IDLE_CLASS` seconds."""
        return self.last is None or self.last < now - IDLE_CLASS

    def target(self, now: float, cap: int) -> int:
        """Warm sandboxes to hold at ``now``, at most ``cap``: the most claims within one
        refill time (any such stretch of the last :data:`DEMAND_WINDOW` seconds) plus one;
        one when the last claim is older than that (a workspace now and then still finds
        one warm); none once the class is :meth:`idle`."""
        asked = self.asked
        while asked and asked[0] < now - DEMAND_WINDOW:
            asked.popleft()
        if cap <= 0 or self.idle(now):
            return 0
        if not asked:
            return 1
        return min(cap, peak(list(asked), self.refill_s) + 1)


def peak(times: list[float], span: float) -> int:
    """The most of ``times`` (ascending) within any stretch of ``span`` seconds."""
    best = lo = 0
    for hi, t in enumerate(times):
        while times[lo] < t - span:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
