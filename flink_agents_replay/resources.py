"""Resources an agent calls through ``ctx.call``: tools (Python callables) and chat models.

Every resource declares its *side effects*, which decide what happens to a call that started before a
failure and never reported back (*in doubt*), and later what a replay may do with it:

* ``none`` — reading or computing only (a model, a lookup): an in-doubt call is simply made again.
* ``idempotent`` — repeating it does no harm (an upsert keyed by a request id): made again.
* ``external`` — an effect on the world (an e-mail, a charge): before the call starts, a *started*
  record is journaled and acknowledged, so a call in doubt is detected; ``in_doubt`` decides
  (``rerun`` by default, or ``fail``, or ``assume_done``).
"""

from __future__ import annotations

import contextvars
import enum
import json
import os
import threading
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flink_agents_replay.call_site import current_call_id
from flink_agents_replay.errors import CallTimeoutError, ChatModelError

__all__ = ["ChatModel", "ChatModelError", "InDoubtPolicy", "Resource", "SideEffects", "Tool", "current_call_id"]


class SideEffects(str, enum.Enum):
    """What calling a resource does to the world outside the job."""

    NONE = "none"
    IDEMPOTENT = "idempotent"
    EXTERNAL = "external"


class InDoubtPolicy(str, enum.Enum):
    """What to do with a call that started before a failure and has no recorded result."""

    RERUN = "rerun"
    FAIL = "fail"
    ASSUME_DONE = "assume_done"


class Resource(ABC):
    """Something an action calls through ``ctx.call(name, ...)``."""

    def __init__(self, *, side_effects: SideEffects | str, in_doubt: InDoubtPolicy | str = InDoubtPolicy.RERUN):
        self.side_effects = SideEffects(side_effects)
        self.in_doubt = InDoubtPolicy(in_doubt)

    @abstractmethod
    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call for real."""

    @property
    def tracks_start(self) -> bool:
        """Whether calls journal an acknowledged *started* record first (to detect calls in doubt)."""
        return self.side_effects is SideEffects.EXTERNAL


class Tool(Resource):
    """A plain Python callable. Defaults to ``external`` side effects: the safe assumption.

    Args:
        function: what a call runs.
        side_effects: ``none``, ``idempotent`` or ``external`` (see the module docstring).
        in_doubt: what the next attempt does with a call that started and never reported back.
        timeout_s: give up waiting after this many seconds and raise :class:`CallTimeoutError` (the function
            keeps running on its own thread: Python cannot stop it, so its effect is in doubt). ``None``
            (default) waits as long as the function runs.
    """

    def __init__(self, function: Callable[..., Any], *, side_effects: SideEffects | str = SideEffects.EXTERNAL,
                 in_doubt: InDoubtPolicy | str = InDoubtPolicy.RERUN, timeout_s: float | None = None):
        if not callable(function):
            raise TypeError(f"Tool needs a callable, got {function!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"Tool timeout_s must be positive, got {timeout_s!r}")
        super().__init__(side_effects=side_effects, in_doubt=in_doubt)
        self.function = function
        self.timeout_s = timeout_s

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        if self.timeout_s is None:
            return self.function(*args, **kwargs)
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = self.function(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome["error"] = exc

        # The call's context (its call id) goes along to the thread.
        worker = threading.Thread(target=contextvars.copy_context().run, args=(run,), daemon=True,
                                  name=f"tool-{getattr(self.function, '__name__', 'call')}")
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise CallTimeoutError(f"{self!r} did not return within {self.timeout_s} s; it may still take effect")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def __repr__(self) -> str:
        name = getattr(self.function, "__qualname__", self.function)
        return f"Tool({name!r}, side_effects={self.side_effects.value})"


class ChatModel(Resource):
    """An OpenAI-compatible chat-completions model (OpenAI, Ollama, vLLM, a local stub).

    ``ctx.call("llm", prompt="...")`` or ``ctx.call("llm", messages=[...])`` returns the reply text.

    Args:
        model: model name sent with each request (default ``$OPENAI_MODEL``).
        base_url: API root, e.g. ``https://api.openai.com/v1`` (default ``$OPENAI_BASE_URL``).
        api_key: bearer token (default ``$OPENAI_API_KEY``; none for local servers).
        timeout_s: per-request timeout.
        retries: further attempts after a transient failure (connection refused or reset, timeout, HTTP 429
            or 5xx), with a growing pause; the request is the same each time, so the call stays one call.
        params: extra request fields (``temperature`` ...), passed through as given.
    """

    def __init__(self, model: str | None = None, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float = 60.0, retries: int = 3, params: Mapping[str, Any] | None = None,
                 side_effects: SideEffects | str = SideEffects.NONE,
                 in_doubt: InDoubtPolicy | str = InDoubtPolicy.RERUN):
        super().__init__(side_effects=side_effects, in_doubt=in_doubt)
        self.model = model or os.environ.get("OPENAI_MODEL")
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or "").rstrip("/")
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.retries = retries
        self.params = dict(params or {})
        if not self.model:
            raise ValueError("ChatModel needs a model name: ChatModel('gpt-4o-mini', ...) or $OPENAI_MODEL")
        if not self.base_url:
            raise ValueError(
                "ChatModel needs a base URL: ChatModel(..., base_url='http://host/v1') or $OPENAI_BASE_URL"
            )

    def invoke(self, prompt: str | None = None, *, messages: Sequence[Mapping[str, Any]] | None = None,
               **params: Any) -> str:
        if (prompt is None) == (messages is None):
            raise TypeError("ChatModel call takes exactly one of prompt=... or messages=[...]")
        body = {"model": self.model, "messages": list(messages or [{"role": "user", "content": prompt}]),
                **self.params, **params}
        reply = self._post("/chat/completions", body)
        try:
            return reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise ChatModelError(f"unexpected chat-completions reply from {self.base_url}: {reply!r:.300}") from exc

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        headers = {"Content-Type": "application/json"}
        call_id = current_call_id()
        if call_id is not None:  # lets an endpoint that honours idempotency keys answer a call in doubt once
            headers["Idempotency-Key"] = call_id
        api_key = self._api_key or os.environ.get("OPENAI_API_KEY")
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        data = json.dumps(body).encode()
        attempt = 0
        while True:
            try:
                return self._post_once(path, data, headers)
            except ChatModelError as error:
                if not error.transient or attempt == self.retries:
                    raise
            time.sleep(min(0.25 * 2**attempt, 5.0))
            attempt += 1

    def _post_once(self, path: str, data: bytes, headers: Mapping[str, str]) -> Any:
        request = urllib.request.Request(self.base_url + path, data=data, headers=dict(headers))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise ChatModelError(f"{self.base_url}{path} answered {exc.code}: {detail}", exc.code) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ChatModelError(f"could not reach {self.base_url}{path}: {exc}") from None

    def __repr__(self) -> str:
        return f"ChatModel({self.model!r}, base_url={self.base_url!r})"
