"""A chat model with fallbacks: the next model or endpoint answers when one is down or rate-limited.

::

    llm = FallbackChatModel([
        ChatModel("gpt-4o", max_retries=0),                                # asked first
        ChatModel("claude-sonnet", base_url="http://litellm:4000", api_key=...),  # when it fails so
    ])
    agent = Triage(resources={"llm": llm})

A call asks the models in order. It falls back to the next when one fails as a service in trouble does: HTTP
408, 429 or 5xx, a timeout, a connection error. Any other failure (a 400 for a bad request, a 401 for a wrong
key) is the call's: raised at once, since another model would fail the same way or hide a mistake. When every
model failed, the last one's exception is raised. Each model's own SDK retries come first (``max_retries``; give
0 to fall back at once).

**Journaled per attempt.** Before each model is asked, an acknowledged *started* record notes which model
(:func:`~flink_agents_replay.api.call_site.journal_attempt`: ``fallback_index``, ``fallback_model``), one broker
round trip each (about 7 ms on a local broker), paid only with fallbacks: a plain :class:`ChatModel` journals
none. The answer is journaled with the model that gave it (``model``, as the service names it) and how many were
asked (``models_asked``). So after a failover:

* a call that was answered is reused, with the answering model's name, and no model is asked again;
* a call cut short while a model was being asked is in doubt: it is asked again of *that* model, with the same
  idempotency key (the call id, with ``#<index>`` for a fallback), then of the ones after it if it fails. It is
  never sent to the primary again when the primary had already failed.

Calls per model are in the replay report's usage table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flink_agents_replay.api.call_site import current_call_site, journal_attempt, report_call
from flink_agents_replay.api.chat_model import ChatModel
from flink_agents_replay.api.resources import InDoubt, InDoubtPolicy, Resource, SideEffects
from flink_agents_replay.api.tools import ToolSpec
from flink_agents_replay.storage.records.chat import ChatResult

__all__ = ["FALLBACK_STATUSES", "FallbackChatModel", "falls_back"]

#: HTTP statuses a call falls back on, besides every 5xx: a request timeout and a rate limit.
FALLBACK_STATUSES = frozenset({408, 429})


def falls_back(error: BaseException) -> bool:
    """Whether ``error`` says the service is in trouble (try the next model) rather than the request is wrong."""
    import openai

    if isinstance(error, (openai.APITimeoutError, openai.APIConnectionError)):  # a timeout is a connection error
        return True
    if isinstance(error, openai.APIStatusError):
        return error.status_code in FALLBACK_STATUSES or error.status_code >= 500
    return False


class FallbackChatModel(Resource):
    """Chat models asked in order until one answers (see the module docstring).

    Args:
        models: the :class:`ChatModel` s, first choice first (at least two; each may have its own endpoint, key,
            timeouts and retries).
        in_doubt: what a call cut short while a model was asked does next (``rerun``, the default: ask that model
            again, with the same key).
    """

    def __init__(self, models: Sequence[ChatModel], *, in_doubt: InDoubt = InDoubtPolicy.RERUN):
        models = list(models)
        if len(models) < 2 or not all(isinstance(model, ChatModel) for model in models):
            raise TypeError(f"FallbackChatModel takes two or more ChatModel objects, first choice first, got "
                            f"{models!r}")
        super().__init__(side_effects=SideEffects.NONE, in_doubt=in_doubt)
        self.models = models

    def invoke(self, prompt: str | None = None, *, messages: Sequence[Mapping[str, Any]] | None = None,
               tools: Sequence[ToolSpec | Mapping[str, Any]] | None = None, response_format: Any = None,
               **params: Any) -> str | ChatResult:
        site = current_call_site()
        first = self._asked_before(site.in_doubt if site is not None else None)
        for index in range(first, len(self.models)):
            model = self.models[index]
            journal_attempt(fallback_index=index, fallback_model=model.model)
            key = None if site is None else site.call_id if index == 0 else f"{site.call_id}#{index}"
            try:
                answer = model.ask(key, prompt, messages=messages, tools=tools, response_format=response_format,
                                   **params)
            except Exception as error:
                if index == len(self.models) - 1 or not falls_back(error):
                    raise
                continue
            report_call(models_asked=index - first + 1, fallback_index=index)
            return answer
        raise AssertionError("unreachable: the last model's failure is raised")

    def _asked_before(self, in_doubt: dict[str, Any] | None) -> int:
        """Where a call starts: the model a call in doubt was asking when it was cut short, else the first."""
        index = (in_doubt or {}).get("fallback_index", 0)
        return index if isinstance(index, int) and 0 <= index < len(self.models) else 0

    def restore_result(self, result: Any, args: tuple, kwargs: dict) -> Any:
        return self.models[0].restore_result(result, args, kwargs)

    def close(self) -> None:
        for model in self.models:
            model.close()

    def __repr__(self) -> str:
        return f"FallbackChatModel([{', '.join(repr(model) for model in self.models)}])"
