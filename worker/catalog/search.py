"""The catalog: index tools from their sources and search them (FAST, BALANCED, ACCURATE).

FAST is FTS5 alone. User text never reaches FTS as query syntax: the query is cut into
words (``[^\\W_]+``), stop-words dropped, and each word sent as a quoted string joined
with ``OR``; quotes, ``*``, ``NEAR(``, ``AND``/``OR`` in the query are only ever words.

SQLite ranks the matching rows by BM25 (weights 10/5/3/2) and returns only the best few
(``max(4 * max_results, 20)``). Which query word matched which field of those rows is
then found in Python, from the FTS terms stored with each row (:mod:`.stem` reproduces
the ``porter unicode61`` tokenizer), so no per-row FTS ``highlight()`` is computed.

Where it runs: on an index of at most ``Catalog.inline_max_tools`` tools (2,000) a FAST
query costs well under a millisecond, less than handing it to a thread and back, so it
runs on the event loop when it can do so without waiting (the index lock is free and
SQLite is not busy; no busy timeout). Otherwise it runs on the catalog's own thread.

Confidence is *absolute*, so it is comparable across queries: the share of the query's
words a tool matched, each credited by the best field it matched in (name 1.0,
description 0.75, capabilities 0.6, keywords 0.5). Results are ordered by confidence,
then BM25, then id, so confidence never rises down the list.

BALANCED re-ranks the FTS candidates with the chat provider; ACCURATE first asks it for
extra search words. Either falls back to FAST, saying why in the metadata, when no
provider is configured or the provider fails or times out.

Raises :class:`InvalidQueryError` (the caller's problem) for an empty query.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .capabilities import STOP_WORDS, descriptor_from_openai, words
from .index import (
    STEMS_SEP,
    WEIGHTS,
    CatalogIndex,
    IndexStats,
    Source,
    SourceInfo,
    ToolDescriptor,
    descriptor_from_row,
)
from .llm import ChatProvider, LLMError, expand, rerank
from .stem import padded

MAX_TERMS = 24
FIELD_NAMES = ("name", "description", "capabilities", "keywords")
FIELD_CREDIT = (1.0, 0.75, 0.6, 0.5)
_BM25_DESCRIPTION = f"FTS5 BM25, column weights {'/'.join(str(int(w)) for w in WEIGHTS)}"
# Columns of an :meth:`CatalogIndex.fts_top` row.
_ID, _NAME, _BM25, _STEMS = 0, 1, 13, 14


class SearchMode(enum.StrEnum):
    FAST = "fast"
    BALANCED = "balanced"
    ACCURATE = "accurate"


class InvalidQueryError(ValueError):
    """The query cannot be searched (empty or whitespace). ``code`` is ``INVALID_QUERY``."""

    code = "INVALID_QUERY"


@dataclass
class SearchHit:
    tool: ToolDescriptor
    confidence: float  # 0..1
    match_reason: str
    signals: list[dict[str, Any]]
    bm25: float

    def to_dict(self, include_schema: bool = False) -> dict[str, Any]:
        d = self.tool.to_dict()
        if not include_schema:
            d.pop("input_schema")
            d.pop("output_schema")
        return {
            "tool": d,
            "confidence": self.confidence,
            "match_reason": self.match_reason,
            "signals": self.signals,
        }


@dataclass
class SearchMetadata:
    mode_requested: SearchMode
    mode_used: SearchMode
    total_indexed: int
    candidates_retrieved: int = 0
    query_understanding_ms: float = 0.0
    fts_retrieval_ms: float = 0.0
    llm_reranking_ms: float = 0.0
    total_ms: float = 0.0
    terms: list[str] = field(default_factory=list)
    expanded_terms: list[str] = field(default_factory=list)
    fallback_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["mode_requested"] = self.mode_requested.value
        d["mode_used"] = self.mode_used.value
        return d


@dataclass
class SearchResponse:
    results: list[SearchHit]
    metadata: SearchMetadata


def query_terms(query: str) -> list[str]:
    """The searchable words of ``query``. Raises InvalidQueryError when it is blank."""
    if not query or not query.strip():
        raise InvalidQueryError("query is empty; describe the tool you need in a few words")
    ws = words(query)
    terms = list(dict.fromkeys(w for w in ws if w not in STOP_WORDS)) or list(dict.fromkeys(ws))
    return terms[:MAX_TERMS]


def fts_query(terms: Sequence[str]) -> str:
    """An FTS5 expression matching any of ``terms``, each a quoted string literal."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


@lru_cache(maxsize=16384)
def _name_words(name: str) -> tuple[str, ...]:
    return tuple(words(name))


class _Scorer:
    """Confidence and matched fields for the rows of one query."""

    def __init__(self, terms: list[str], weights: list[float]) -> None:
        # Each term as FTS terms, " t " (a phrase when the tokenizer splits it); expanded
        # terms (weight < 1) are not the user's words.
        self.terms = [(t, w, padded(t), w >= 1.0) for t, w in zip(terms, weights, strict=True)]
        self.base = sum(w for w in weights if w >= 1.0) or 1.0
        self.exact = tuple(t for t, w in zip(terms, weights, strict=True) if w >= 1.0)

    def score(self, stems: str, name: str) -> tuple[float, dict[str, int]]:
        """(confidence, term -> best field index) of a row with stored ``stems``: the
        fields' FTS terms, each ``" a b "``, in column order, joined by STEMS_SEP (so
        a phrase never spans two fields, and the SEPs before it number its field)."""
        best: dict[str, int] = {}
        got = 0.0
        in_name = 0
        for t, w, ph, original in self.terms:
            i = stems.find(ph) if ph != "  " else -1  # a term with no FTS terms matches nothing
            if i >= 0:
                col = best[t] = stems.count(STEMS_SEP, 0, i)
                got += FIELD_CREDIT[col] * w
                in_name += original and col == 0
        conf = 0.15 + 0.8 * min(1.0, got / self.base)
        if self.exact and in_name == len(self.exact):
            conf += 0.04  # every word of the query is in the tool's name (1.0 is kept for an exact name)
        if _name_words(name) == self.exact:
            conf = 1.0
        return round(min(conf, 1.0), 3), best


def _reason(terms: list[str], best: dict[str, int], expanded: set[str]) -> str:
    parts = []
    for col, fname in enumerate(FIELD_NAMES):
        hit = [t for t in terms if best.get(t) == col and t not in expanded]
        if hit:
            parts.append(f"{fname}: {', '.join(hit)}")
    via = [t for t in terms if t in best and t in expanded]
    if via:
        parts.append(f"expanded: {', '.join(via)}")
    missing = [t for t in terms if t not in best and t not in expanded]
    if missing:
        parts.append(f"unmatched: {', '.join(missing)}")
    return "; ".join(parts) or "no direct term match"


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)


@runtime_checkable
class Closes(Protocol):
    """A chat provider holding a connection to close (not every provider does)."""

    async def aclose(self) -> None: ...


class Catalog:
    """The tool catalog: one index plus an optional chat provider.

    ``inline_max_tools``: up to this many indexed tools, a search runs on the event loop
    when it can do so without waiting (see :meth:`_fast`); 0 sends every search to a
    thread. At 2,000 tools a FAST query costs about a millisecond of CPU.
    """

    inline_max_tools = 2000

    def __init__(self, index: CatalogIndex, llm: ChatProvider | None = None) -> None:
        self.index = index
        self.llm = llm
        self._count: int | None = None
        # Searches take the index lock in turn anyway; one warm thread of their own hands
        # them over faster than the shared default executor (no context copy, no pool).
        self._searcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="catalog-search")

    @classmethod
    def open(cls, db_path: Path | str, llm: ChatProvider | None = None) -> Catalog:
        return cls(CatalogIndex(db_path), llm)

    async def aclose(self) -> None:
        if isinstance(self.llm, Closes):
            await self.llm.aclose()
        await asyncio.to_thread(self.index.close)
        self._searcher.shutdown(wait=False, cancel_futures=True)

    # -- indexing ---------------------------------------------------------------------

    async def index_tools(
        self,
        source: Source,
        tools: Sequence[ToolDescriptor],
        *,
        mcp_server: str = "",
        description: str = "",
        status_message: str = "",
    ) -> IndexStats:
        """Make ``tools`` the whole of one source (new ones added, changed ones rewritten,
        vanished ones pruned). ``status_message`` is shown by :meth:`list_sources` (e.g.
        the custom files that failed to load)."""
        stats = await asyncio.to_thread(
            self.index.replace_source,
            source,
            tools,
            mcp_server=mcp_server,
            description=description,
            status_message=status_message,
        )
        self._count = None
        return stats

    async def index_builtin(self, schemas: Sequence[dict[str, Any]]) -> IndexStats:
        """Index the registry's builtin tools from their OpenAI-format schemas."""
        tools = [descriptor_from_openai(s, source="builtin") for s in schemas]
        return await self.index_tools("builtin", tools, description="worker builtin tools")

    async def total(self) -> int:
        if self._count is None:
            self._count = await asyncio.to_thread(self.index.count)
        return self._count

    # -- lookups ----------------------------------------------------------------------

    async def get_tool(self, tool_id: str) -> ToolDescriptor | None:
        return await asyncio.to_thread(self.index.get, tool_id)

    async def tools_by_capability(
        self, capability: str, sources: Sequence[str] = (), max_results: int = 50
    ) -> list[ToolDescriptor]:
        return await asyncio.to_thread(self.index.by_capability, capability, sources, max_results)

    async def list_sources(self) -> list[SourceInfo]:
        return await asyncio.to_thread(self.index.sources)

    # -- search -----------------------------------------------------------------------

    async def search(
        self,
        query: str,
        mode: SearchMode | str = SearchMode.FAST,
        capabilities: Sequence[str] = (),
        sources: Sequence[str] = (),
        max_results: int = 5,
        include_schema: bool = False,
        task_context: str | None = None,
        *,
        allowed_ids: set[str] | None = None,
    ) -> SearchResponse:
        """Search the catalog. ``allowed_ids`` restricts results to tools the caller may run.

        ``include_schema`` is honoured by :meth:`SearchHit.to_dict`. Raises InvalidQueryError.
        """
        t0 = time.perf_counter()
        mode = SearchMode(mode)
        terms = query_terms(query)
        max_results = max(1, min(int(max_results), 50))
        meta = SearchMetadata(mode_requested=mode, mode_used=mode, total_indexed=await self.total(), terms=terms)
        if mode is not SearchMode.FAST and self.llm is None:
            mode = meta.mode_used = SearchMode.FAST
            meta.fallback_reason = "no LLM provider configured (set LOOM_LLM_BASE_URL and LOOM_LLM_MODEL)"

        weights = [1.0] * len(terms)
        if mode is SearchMode.ACCURATE and self.llm is not None:
            t1 = time.perf_counter()
            try:
                extra = await expand(self.llm, query, task_context)
            except LLMError as e:
                mode = meta.mode_used = SearchMode.FAST
                meta.fallback_reason = f"query expansion failed: {e}"
                extra = []
            meta.query_understanding_ms = _ms(t1)
            new = [w for t in extra for w in words(t) if w not in STOP_WORDS and w not in terms]
            meta.expanded_terms = list(dict.fromkeys(new))[:8]
            weights += [0.5] * len(meta.expanded_terms)
        all_terms = terms + meta.expanded_terms

        t1 = time.perf_counter()
        fast = mode is SearchMode.FAST
        limit = max(max_results * 4, 20) if fast else max(20, max_results * 3)
        hits, meta.candidates_retrieved = await self._fast(
            all_terms,
            weights,
            set(meta.expanded_terms),
            capabilities,
            sources,
            allowed_ids,
            limit=limit,
            keep=max_results if fast else limit,  # re-ranking needs every candidate
        )
        meta.fts_retrieval_ms = _ms(t1)

        if mode is not SearchMode.FAST and self.llm is not None and hits:
            t1 = time.perf_counter()
            try:
                scores = await rerank(
                    self.llm,
                    query,
                    [(h.tool.id, h.tool.name, h.tool.description) for h in hits],
                    task_context,
                )
            except LLMError as e:
                meta.mode_used = SearchMode.FAST
                meta.fallback_reason = f"re-ranking failed: {e}"
            else:
                for h in hits:
                    s = scores.get(h.tool.id, 0.0)
                    h.confidence = round(0.4 * h.confidence + 0.6 * s, 3)
                    h.signals.append({"signal_type": "llm_rerank", "description": "chat model relevance", "weight": s})
                hits.sort(key=lambda h: (-h.confidence, h.bm25, h.tool.id))
            meta.llm_reranking_ms = _ms(t1)

        meta.total_ms = _ms(t0)
        return SearchResponse(results=hits[:max_results], metadata=meta)

    async def _fast(
        self,
        terms: list[str],
        weights: list[float],
        expanded: set[str],
        capabilities: Sequence[str],
        sources: Sequence[str],
        allowed_ids: set[str] | None,
        *,
        limit: int,
        keep: int,
    ) -> tuple[list[SearchHit], int]:
        """(the best ``keep`` hits, how many candidates FTS returned)."""
        if not terms:
            return [], 0  # nothing searchable (only punctuation): no results, not an error
        args = (terms, weights, expanded, capabilities, sources, allowed_ids, limit, keep)
        if self._count is not None and self._count <= self.inline_max_tools:
            # A small index answers in well under a millisecond, less than twice what
            # handing the query to a thread and back costs; run it here unless that
            # would mean waiting (a writer holds the index, or the database is busy).
            done = self._fast_sync(*args, wait=False)
            if done is not None:
                return done
        done = await asyncio.get_running_loop().run_in_executor(self._searcher, self._fast_sync, *args)
        assert done is not None  # a search that may wait always finishes
        return done

    def _fast_sync(
        self,
        terms: list[str],
        weights: list[float],
        expanded: set[str],
        capabilities: Sequence[str],
        sources: Sequence[str],
        allowed_ids: set[str] | None,
        limit: int,
        keep: int,
        wait: bool = True,
    ) -> tuple[list[SearchHit], int] | None:
        """The search itself, on whatever thread calls it; None only with ``wait=False``
        when it would have to wait for the index."""
        rows = self.index.fts_top(
            fts_query(terms),
            limit=limit,
            capabilities=capabilities,
            sources=sources,
            allowed_ids=allowed_ids,
            wait=wait,
        )
        if rows is None:
            return None
        scorer = _Scorer(terms, weights)
        scored = []
        for r in rows:
            conf, best = scorer.score(r[_STEMS], r[_NAME])
            scored.append((-conf, r[_BM25], r[_ID], best, r))
        scored.sort(key=lambda x: x[:3])
        hits = []
        # Only the rows returned are decoded (their JSON schemas parsed).
        for neg_conf, bm25, _, best, r in scored[:keep]:
            sig = {"signal_type": "bm25_score", "description": _BM25_DESCRIPTION, "weight": round(-bm25, 4)}
            hits.append(SearchHit(descriptor_from_row(r), -neg_conf, _reason(terms, best, expanded), [sig], bm25))
        return hits, len(rows)
