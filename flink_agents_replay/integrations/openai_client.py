"""The ``openai`` SDK client the package's OpenAI-compatible resources share (chat models, embeddings).

Such a resource travels to the TaskManagers pickled; its SDK client (a connection pool) must not. The client is
made on first use in each process from the resource's settings, and left out of its pickle.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from flink_agents_replay.core.errors import ConfigError

__all__ = ["OpenAIClientMixin"]

_log = logging.getLogger(__name__)

#: Held while a client is made and the SDK's lazily imported resources are loaded. Run threads of a freshly
#: restored TaskManager make their first calls at once; two of them importing ``openai.resources.chat`` and
#: ``openai.resources.embeddings`` at the same time can deadlock on Python's module locks, which Python reports
#: as a ``_DeadlockError`` raised into one of the calls (seen in the demo: the action failed and its call was
#: made again under a new id).
_SDK_IMPORT = threading.Lock()


def _load_lazy_resources(client: Any) -> None:
    """Import what the SDK loads on first attribute access, now, under :data:`_SDK_IMPORT`."""
    client.chat.completions  # noqa: B018 - the attribute access is the import
    client.embeddings  # noqa: B018


class OpenAIClientMixin:
    """Settings of an OpenAI-compatible endpoint and the SDK client made from them, once per process.

    Call :meth:`_configure_client` from ``__init__`` (it warns when OpenAI's own API has no key in this process);
    :meth:`_sdk` returns the client, or refuses OpenAI's API without a key (a ``ConfigError``, not a 401).
    """

    def _configure_client(self, *, base_url: str | None, api_key: str | None, timeout_s: float, max_retries: int,
                          default_headers: Mapping[str, str] | None) -> None:
        _check_settings(type(self).__name__, base_url=base_url, timeout_s=timeout_s, max_retries=max_retries,
                        default_headers=default_headers)
        if _openais_own(base_url) and not (api_key or os.environ.get("OPENAI_API_KEY")):
            # The key may be set for the TaskManagers only, and a replay with recorded calls needs none: said here,
            # refused at the first request (ConfigError, not a 401 from OpenAI).
            _log.warning("%s for OpenAI's API has no key in this process: give api_key=... or set $OPENAI_API_KEY "
                         "where it runs (for another OpenAI-compatible service, give its base_url=...)",
                         type(self).__name__)
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
            key = self._api_key or os.environ.get("OPENAI_API_KEY")
            if key is None and _openais_own(self.base_url):
                raise ConfigError(f"{type(self).__name__} for OpenAI's API has no key: give api_key=... or set "
                                  "$OPENAI_API_KEY where the job runs (for another OpenAI-compatible service, give "
                                  "its base_url=...)")
            with _SDK_IMPORT:
                import openai

                client = openai.OpenAI(
                    base_url=self.base_url, api_key=key or "unused", timeout=self.timeout_s,
                    max_retries=self.max_retries, default_headers=self.default_headers or None)
                _load_lazy_resources(client)
                self._client = client
        return self._client


def _check_settings(kind: str, *, base_url: str | None, timeout_s: Any, max_retries: Any,
                    default_headers: Any) -> None:
    """Refuse settings the SDK would take and then fail on obscurely (a ``Connection error.``, an assertion)."""
    if base_url is not None and not _http_url(base_url):
        raise ConfigError(f"{kind} base_url={base_url!r}: expected an http:// or https:// URL with a host, "
                          "e.g. 'http://127.0.0.1:8000/v1' (from base_url=... or $OPENAI_BASE_URL)")
    if not _timeout(timeout_s):
        raise ConfigError(f"{kind} timeout_s={timeout_s!r}: expected a number of seconds above 0, an "
                          "httpx.Timeout, or None (no timeout)")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ConfigError(f"{kind} max_retries={max_retries!r}: expected a whole number, 0 or more")
    if default_headers is not None and not (isinstance(default_headers, Mapping) and all(
            isinstance(name, str) and _header_value(value) for name, value in default_headers.items())):
        raise ConfigError(f"{kind} default_headers: expected a mapping of header names to string values")


def _http_url(url: Any) -> bool:
    try:
        parts = urlsplit(url)
    except (TypeError, ValueError, AttributeError):  # not a string, or "http://[::1"
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _timeout(value: Any) -> bool:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
        return True
    import httpx  # the SDK's HTTP client: its Timeout sets each phase

    return isinstance(value, httpx.Timeout)


def _header_value(value: Any) -> bool:
    """A string, or one of the SDK's markers (``openai.Omit()`` drops a default header)."""
    return isinstance(value, str) or type(value).__module__.startswith("openai")


def _openais_own(base_url: str | None) -> bool:
    """Whether requests go to OpenAI's API (the SDK's default endpoint), which refuses them without a key."""
    return base_url is None or (urlsplit(base_url).hostname or "").lower() == "api.openai.com"
