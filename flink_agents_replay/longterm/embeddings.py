"""Embeddings for long-term memory: texts to vectors, from an OpenAI-compatible ``/v1/embeddings`` endpoint.

:class:`OpenAIEmbeddings` uses the official ``openai`` SDK (its timeouts and retries), so it works against
OpenAI, Azure OpenAI, Ollama, vLLM, a LiteLLM proxy or the local model service
(``flink-agents-replay local model start``). Every request carries the call's id as ``Idempotency-Key``.
Anything with an ``embed(texts) -> vectors`` method can stand in (:class:`Embedder`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from flink_agents_replay.api.call_site import current_call_id
from flink_agents_replay.integrations.openai_client import OpenAIClientMixin

__all__ = ["Embedder", "OpenAIEmbeddings"]


class Embedder(Protocol):
    """Turns texts into vectors of one fixed dimension."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        ...


class OpenAIEmbeddings(OpenAIClientMixin):
    """An OpenAI-compatible embeddings endpoint, through the ``openai`` SDK.

    Args:
        model: the embedding model (default ``$OPENAI_EMBEDDING_MODEL``, else ``text-embedding-3-small``).
        base_url: API root, e.g. ``http://127.0.0.1:8000/v1`` (default ``$OPENAI_BASE_URL``).
        api_key: bearer token (default ``$OPENAI_API_KEY``; a placeholder for local servers that need none).
        dimensions: ask for vectors of this size (models that support it).
        timeout_s, max_retries: the SDK's per-request timeout and retries of transient failures.
        default_headers: extra headers on every request (a proxy's, Azure's ``api-key``...).

    The SDK client is made on first use in each process (the resource travels to the TaskManagers pickled).
    """

    def __init__(self, model: str | None = None, *, base_url: str | None = None, api_key: str | None = None,
                 dimensions: int | None = None, timeout_s: float = 30.0, max_retries: int = 3,
                 default_headers: Mapping[str, str] | None = None):
        self.model = model or os.environ.get("OPENAI_EMBEDDING_MODEL") or "text-embedding-3-small"
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        if not self.base_url:
            raise ValueError("OpenAIEmbeddings needs a base URL: OpenAIEmbeddings(base_url='http://host/v1') or "
                             "$OPENAI_BASE_URL")
        if dimensions is not None and dimensions <= 0:
            raise ValueError(f"dimensions must be positive, got {dimensions!r}")
        self.dimensions = dimensions
        self._configure_client(base_url=self.base_url, api_key=api_key, timeout_s=timeout_s, max_retries=max_retries,
                               default_headers=default_headers)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        extra: dict[str, Any] = {}
        call_id = current_call_id()
        if call_id is not None:
            extra["extra_headers"] = {"Idempotency-Key": call_id}
        if self.dimensions is not None:
            extra["dimensions"] = self.dimensions
        response = self._sdk().embeddings.create(model=self.model, input=list(texts), **extra)
        rows = sorted(response.data, key=lambda row: row.index)
        return [[float(x) for x in row.embedding] for row in rows]

    def __repr__(self) -> str:
        return f"OpenAIEmbeddings({self.model!r}, base_url={self.base_url!r})"
