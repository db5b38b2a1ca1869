"""The ``openai`` SDK client the package's OpenAI-compatible resources share (chat models, embeddings).

Such a resource travels to the TaskManagers pickled; its SDK client (a connection pool) must not. The client is
made on first use in each process from the resource's settings, and left out of its pickle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["OpenAIClientMixin"]


class OpenAIClientMixin:
    """Settings of an OpenAI-compatible endpoint and the SDK client made from them, once per process.

    Call :meth:`_configure_client` from ``__init__`` (it refuses OpenAI's own API without a key, there and not
    in every worker); :meth:`_sdk` returns the client.
    """

    def _configure_client(self, *, base_url: str | None, api_key: str | None, timeout_s: float, max_retries: int,
                          default_headers: Mapping[str, str] | None) -> None:
        if _openais_own(base_url) and not (api_key or os.environ.get("OPENAI_API_KEY")):  # not a 401 per worker
            raise ValueError(f"{type(self).__name__} talks to OpenAI's API, which needs a key: give api_key=... or "
                             "set $OPENAI_API_KEY (for another OpenAI-compatible service, give its base_url=...)")
        self.base_url = base_url
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.default_headers = dict(default_headers or {})
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # the SDK client (its connection pool) stays in its process

    def _sdk(self) -> Any:
        if self._client is None:
            import openai

            self._client = openai.OpenAI(
                base_url=self.base_url, api_key=self._api_key or os.environ.get("OPENAI_API_KEY") or "unused",
                timeout=self.timeout_s, max_retries=self.max_retries, default_headers=self.default_headers or None)
        return self._client


def _openais_own(base_url: str | None) -> bool:
    """Whether requests go to OpenAI's API (the SDK's default endpoint), which refuses them without a key."""
    return base_url is None or (urlsplit(base_url).hostname or "").lower() == "api.openai.com"
