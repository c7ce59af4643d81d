"""A small provider interface for an OpenAI-compatible chat endpoint, and the two jobs
the catalog gives it: re-ranking FTS candidates and expanding a query.

Errors::

    LLMError              the provider could not give a usable answer
    └── LLMTimeoutError   it did not answer in time (also TimeoutError)

Callers (:mod:`worker.catalog.search`) treat every ``LLMError`` as "fall back to FAST and
say so in the metadata"; a provider failure never fails a search.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol


class LLMError(Exception):
    """The chat provider failed or answered something unusable."""


class LLMTimeoutError(LLMError, TimeoutError):
    """The chat provider did not answer within its timeout."""


class ChatProvider(Protocol):
    async def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant's reply text. Raises LLMError / LLMTimeoutError."""
        ...


class OpenAICompatProvider:
    """``POST {base_url}/chat/completions`` with a bearer key, temperature 0."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 10.0,
        max_tokens: int = 400,
    ) -> None:
        # httpx is imported by the provider that uses it: the catalog's module is imported by
        # every registry (and CLI command), a chat provider is configured by few.
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self._max_tokens = max_tokens
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
        )

    async def complete(self, messages: list[dict[str, str]]) -> str:
        import httpx

        body = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": self._max_tokens}
        try:
            r = await self._client.post("chat/completions", json=body)
        except httpx.TimeoutException as e:
            raise LLMTimeoutError(f"chat provider timed out ({type(e).__name__})") from e
        except httpx.HTTPError as e:
            raise LLMError(f"chat provider unreachable: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise LLMError(f"chat provider answered HTTP {r.status_code}")
        try:
            content = r.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise LLMError("chat provider answer is not a chat completion") from e
        if not isinstance(content, str):
            raise LLMError("chat provider answer has no text content")
        return content

    async def aclose(self) -> None:
        await self._client.aclose()


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.MULTILINE)


def _json_reply(text: str) -> Any:
    """The JSON value in a reply (code fences tolerated). Raises LLMError."""
    try:
        return json.loads(_FENCE.sub("", text.strip()))
    except ValueError as e:
        raise LLMError("chat provider reply is not JSON") from e


async def rerank(
    provider: ChatProvider,
    query: str,
    candidates: list[tuple[str, str, str]],
    task_context: str | None = None,
) -> dict[str, float]:
    """Relevance in [0, 1] for each candidate ``(id, name, description)`` the model scored.

    Unknown ids and malformed entries are dropped. Raises LLMError.
    """
    listing = "\n".join(f"- id={cid} name={name}: {desc[:300]}" for cid, name, desc in candidates)
    ctx = f"\nTask context: {task_context}" if task_context else ""
    messages = [
        {
            "role": "system",
            "content": "You rank software tools for a task. Reply with JSON only: "
            '{"ranking": [{"id": "<id>", "score": <0..1>}, ...]}, best first.',
        },
        {"role": "user", "content": f"Task: {query}{ctx}\nCandidate tools:\n{listing}"},
    ]
    data = _json_reply(await provider.complete(messages))
    items = data.get("ranking") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise LLMError("re-rank reply has no ranking list")
    known = {c[0] for c in candidates}
    out: dict[str, float] = {}
    for it in items:
        if isinstance(it, dict) and it.get("id") in known and isinstance(it.get("score"), int | float):
            out[str(it["id"])] = max(0.0, min(1.0, float(it["score"])))
    if not out:
        raise LLMError("re-rank reply scored none of the candidates")
    return out


async def expand(provider: ChatProvider, query: str, task_context: str | None = None) -> list[str]:
    """Up to 8 extra search words (synonyms, related terms). Raises LLMError."""
    ctx = f"\nTask context: {task_context}" if task_context else ""
    messages = [
        {
            "role": "system",
            "content": "Suggest search keywords for finding a software tool. Reply with JSON only: "
            '{"terms": ["word", ...]} (at most 8 single words).',
        },
        {"role": "user", "content": f"Query: {query}{ctx}"},
    ]
    data = _json_reply(await provider.complete(messages))
    terms = data.get("terms") if isinstance(data, dict) else None
    if not isinstance(terms, list):
        raise LLMError("expansion reply has no terms list")
    return [t for t in terms if isinstance(t, str) and t.strip()][:8]
