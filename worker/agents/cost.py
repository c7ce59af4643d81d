"""What an agent's run has cost so far, read from its JSON-lines output as it comes, for
``agent run --max-cost`` and ``run.json``.

Claude Code (``--output-format stream-json``) says its own cost at the end
(``total_cost_usd`` of its ``result`` line); until then, and for every other agent, the cost
is estimated from the usage its lines report (Claude's ``assistant`` messages, Codex's
``turn.completed``; OpenCode's and Anthropic/OpenAI-shaped ``usage`` objects alike) times
:data:`PRICES`, USD per million tokens by model-name prefix (list prices when written; an
estimate, to stop a run that runs away, not a bill). A model not in the table is priced as
its family's default (:data:`DEFAULT_PRICE`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Price:
    """USD per million tokens: input, output, cached input read, cache written."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    @classmethod
    def of(cls, inp: float, out: float) -> Price:
        # Anthropic's cache: a read is a tenth of input, a write 1.25 times it; OpenAI's
        # cached input is a tenth too (and it has no separate write).
        return cls(inp, out, inp / 10, inp * 1.25)


#: Longest prefix wins. Sources: the providers' pricing pages (2025-2026).
PRICES: dict[str, Price] = {
    "claude-opus-4-5": Price.of(5, 25),
    "claude-opus-4-6": Price.of(5, 25),
    "claude-opus-4": Price.of(15, 75),
    "claude-sonnet-4": Price.of(3, 15),
    "claude-3-7-sonnet": Price.of(3, 15),
    "claude-3-5-sonnet": Price.of(3, 15),
    "claude-haiku-4": Price.of(1, 5),
    "claude-3-5-haiku": Price.of(0.8, 4),
    "gpt-5-mini": Price.of(0.25, 2),
    "gpt-5-nano": Price.of(0.05, 0.4),
    "gpt-5": Price.of(1.25, 10),
    "gpt-4.1-mini": Price.of(0.4, 1.6),
    "gpt-4.1": Price.of(2, 8),
    "gpt-4o-mini": Price.of(0.15, 0.6),
    "gpt-4o": Price.of(2.5, 10),
    "o4-mini": Price.of(1.1, 4.4),
    "o3": Price.of(2, 8),
}
#: A model not in :data:`PRICES`: Claude's by Sonnet's price, any other by GPT-5's.
DEFAULT_PRICE = {"claude": PRICES["claude-sonnet-4"], "other": PRICES["gpt-5"]}


def price_of(model: str | None) -> Price:
    """The price of ``model`` (longest matching prefix, else its family's default)."""
    name = (model or "").lower()
    best = max((p for p in PRICES if name.startswith(p)), key=len, default=None)
    if best is not None:
        return PRICES[best]
    return DEFAULT_PRICE["claude" if name.startswith("claude") else "other"]


def usage_cost(usage: dict[str, Any], model: str | None) -> float:
    """USD of one ``usage`` object (Anthropic's or OpenAI's field names)."""
    p = price_of(model)

    def n(key: str) -> float:
        v = usage.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0.0

    cached = n("cached_input_tokens") or n("cache_read_input_tokens")
    # OpenAI counts cached input inside input_tokens; Anthropic counts it apart.
    inp = n("input_tokens") - (n("cached_input_tokens") if "cached_input_tokens" in usage else 0.0)
    total = max(inp, 0.0) * p.input + n("output_tokens") * p.output
    total += cached * p.cache_read + n("cache_creation_input_tokens") * p.cache_write
    return total / 1e6


@dataclass
class CostMeter:
    """Reads an agent's stdout line by line (:meth:`feed`) and keeps its cost and turns.
    ``model``: the model when the lines do not say (Codex's ``-m``)."""

    model: str | None = None
    reported: float | None = None  # the agent's own total (Claude's result line)
    estimated: float = 0.0
    turns: int | None = None
    _seen: set[str] = field(default_factory=set)
    _partial: bytes = b""

    @property
    def cost(self) -> float:
        """USD so far: the agent's own figure once it gave one, else the estimate."""
        return self.reported if self.reported is not None else self.estimated

    @property
    def known(self) -> bool:
        """Whether any line said anything about cost."""
        return self.reported is not None or self.estimated > 0

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the agent's stdout (lines may be split across calls)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > 16 << 20:  # not JSON lines: do not hold it all
            self._partial = b""
        for line in lines:
            self.line(line)

    def line(self, raw: bytes | str) -> None:
        """One line of output; a line that is not a JSON object is ignored."""
        try:
            event = json.loads(raw)
        except ValueError:
            return
        if isinstance(event, dict):
            self._event(event)

    def _event(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        if kind == "result":  # Claude Code's last line
            if isinstance(ev.get("total_cost_usd"), (int, float)):
                self.reported = float(ev["total_cost_usd"])
            if isinstance(ev.get("num_turns"), int):
                self.turns = ev["num_turns"]
            return
        if kind == "assistant" and isinstance(ev.get("message"), dict):  # Claude Code
            msg = ev["message"]
            # One message comes as several lines (one per content block), each with the
            # message's usage: count it once.
            mid = str(msg.get("id") or "")
            if mid and mid in self._seen:
                return
            self._seen.add(mid)
            if isinstance(msg.get("usage"), dict):
                self.estimated += usage_cost(msg["usage"], msg.get("model") or self.model)
            return
        if kind == "turn.completed" and isinstance(ev.get("usage"), dict):  # Codex exec --json
            self.estimated += usage_cost(ev["usage"], self.model)
            self.turns = (self.turns or 0) + 1
            return
        if kind != "system" and isinstance(ev.get("usage"), dict):  # any other agent's
            self.estimated += usage_cost(ev["usage"], ev.get("model") or self.model)
