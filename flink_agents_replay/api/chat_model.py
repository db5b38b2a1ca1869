"""A chat model resource on the official ``openai`` SDK: text, tool calls and structured output, journaled.

``ChatModel`` talks to any OpenAI-compatible chat-completions endpoint; the endpoint decides which:

==============  ===========================================================================================
service         settings
==============  ===========================================================================================
OpenAI          ``ChatModel("gpt-4o-mini")`` with ``$OPENAI_API_KEY``; ``base_url`` defaults to OpenAI's
Azure OpenAI    ``base_url="https://<resource>.openai.azure.com/openai/v1/"``, ``api_key=<key>`` (the v1 API;
                the model is your deployment's name)
Ollama          ``base_url="http://localhost:11434/v1"``, any ``api_key`` (``"ollama"``), ``model="llama3.2"``
vLLM            ``base_url="http://<host>:8000/v1"``, the ``--api-key`` the server was started with
LiteLLM proxy   ``base_url="http://<proxy>:4000"``, ``api_key=<virtual key>``, the proxy's model alias
local service   ``base_url=$OPENAI_BASE_URL`` from ``flink-agents-replay local model start`` (offline)
==============  ===========================================================================================

``default_headers`` adds headers to every request (a gateway's, ``api-key`` for older Azure setups).
Timeouts and retries are the SDK's (``timeout_s``, ``max_retries``: connection errors, 408, 409, 429 and 5xx
are retried with backoff); every attempt carries the call id as ``Idempotency-Key``, so a service that honours
it answers a call made again after a crash once.

What a call returns:

* ``ctx.call("llm", prompt="...")`` — the reply text (``str``), as before;
* ``ctx.call("llm", messages=[...])``, also with ``tools=[...]`` (:mod:`flink_agents_replay.api.tools`) or
  ``response_format=`` (a pydantic model class or a JSON schema dict) — a
  :class:`~flink_agents_replay.storage.records.chat.ChatResult`: content, tool calls, usage, model, latency and the
  parsed object (through ``ctx.call``: an instance of the pydantic model asked for). The journal keeps it as
  plain data, the parsed object as the model's JSON, validated into the model for a call made now and for one
  reused later alike.

Every call also reports its model and tokens with the call (:func:`~flink_agents_replay.api.call_site.report_call`),
for the replay report's usage and cost comparison. The SDK's exceptions reach the action as they are
(``openai.RateLimitError``...), keep their type through the journal, and count as failures to make again
under the usual rules (a failure that escaped the action is not reused).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from flink_agents_replay.api.call_site import current_call_id, report_call
from flink_agents_replay.api.resources import InDoubt, InDoubtPolicy, Resource, SideEffects
from flink_agents_replay.api.tools import ToolSpec, model_json_schema, tool_schemas
from flink_agents_replay.core.errors import ChatModelError
from flink_agents_replay.integrations.openai_client import OpenAIClientMixin
from flink_agents_replay.storage.records.chat import ChatResult, ToolCall, Usage

__all__ = ["ChatModel"]

log = logging.getLogger(__name__)


class ChatModel(OpenAIClientMixin, Resource):
    """An OpenAI-compatible chat-completions model, through the ``openai`` SDK (see the module docstring).

    Args:
        model: model name sent with each request (default ``$OPENAI_MODEL``).
        base_url: API root, e.g. ``http://127.0.0.1:8000/v1`` (default ``$OPENAI_BASE_URL``, else OpenAI's).
        api_key: bearer token (default ``$OPENAI_API_KEY``; a placeholder for local servers that need none).
        timeout_s: the SDK's per-request timeout.
        max_retries: the SDK's retries of transient failures (``retries`` is an older name of it).
        default_headers: extra headers on every request.
        params: extra request fields (``temperature``, ``seed``...), passed through as given.
        side_effects, in_doubt: see :mod:`flink_agents_replay.api.resources` (a model call reads: ``none``).

    The SDK client is made on first use in each process (the resource travels to the TaskManagers pickled).
    """

    def __init__(self, model: str | None = None, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float = 60.0, max_retries: int | None = None, retries: int | None = None,
                 default_headers: Mapping[str, str] | None = None, params: Mapping[str, Any] | None = None,
                 side_effects: SideEffects | str = SideEffects.NONE,
                 in_doubt: InDoubt = InDoubtPolicy.RERUN):
        super().__init__(side_effects=side_effects, in_doubt=in_doubt)
        self.model = model or os.environ.get("OPENAI_MODEL")
        if not self.model:
            raise ValueError("ChatModel needs a model name: ChatModel('gpt-4o-mini', ...) or $OPENAI_MODEL")
        if max_retries is not None and retries is not None and max_retries != retries:
            raise ValueError("give max_retries or retries (its older name), not both")
        self._configure_client(base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None, api_key=api_key,
                               timeout_s=timeout_s, max_retries=next((n for n in (max_retries, retries)
                                                                       if n is not None), 3),
                               default_headers=default_headers)
        self.params = dict(params or {})

    def invoke(self, prompt: str | None = None, *, messages: Sequence[Mapping[str, Any]] | None = None,
               tools: Sequence[ToolSpec | Mapping[str, Any]] | None = None, response_format: Any = None,
               **params: Any) -> str | ChatResult:
        return self.ask(current_call_id(), prompt, messages=messages, tools=tools, response_format=response_format,
                        **params)

    def ask(self, idempotency_key: str | None, prompt: str | None = None, *,
            messages: Sequence[Mapping[str, Any]] | None = None,
            tools: Sequence[ToolSpec | Mapping[str, Any]] | None = None, response_format: Any = None,
            **params: Any) -> str | ChatResult:
        """The call as :meth:`invoke` makes it, with ``idempotency_key`` as its ``Idempotency-Key`` (none: no
        header)."""
        if (prompt is None) == (messages is None):
            raise TypeError("ChatModel call takes exactly one of prompt=... or messages=[...]")
        request: dict[str, Any] = {
            "model": self.model, "messages": list(messages or [{"role": "user", "content": prompt}]),
            **self.params, **params}
        if tools:
            request["tools"] = tool_schemas(tools)
        result = self._complete(request, response_format, idempotency_key)
        if prompt is not None and not tools and response_format is None:
            if result.content is None:
                raise ChatModelError(f"{self!r} answered without text (finish reason {result.finish_reason!r})")
            return result.content
        return result

    def _complete(self, request: dict[str, Any], response_format: Any, idempotency_key: str | None) -> ChatResult:
        if idempotency_key is not None:  # on every attempt the SDK makes: a service that honours it answers once
            request["extra_headers"] = {**request.get("extra_headers", {}), "Idempotency-Key": idempotency_key}
        if response_format is not None:
            request["response_format"] = _json_schema_format(response_format)
        begun = time.monotonic()
        completion = self._sdk().chat.completions.create(**request)
        latency_ms = round((time.monotonic() - begun) * 1000, 3)
        result = _chat_result(completion, latency_ms, parse_json=_asks_for_json(request.get("response_format")))
        counted = completion.usage is not None  # a service that reports no usage: no counts, rather than 0
        report_call(model=result.model, prompt_tokens=result.usage.prompt_tokens if counted else None,
                    completion_tokens=result.usage.completion_tokens if counted else None)
        return result

    def restore_result(self, result: Any, args: tuple, kwargs: dict) -> Any:
        """What the action gets, from the answer as journaled: the parsed JSON validated into the pydantic model
        asked for, the same code on the same JSON for a call made now and one reused later (validators and
        aliases included). A ``messages=`` call journaled by 0.4 (its text) comes back as a ``ChatResult``."""
        if isinstance(result, str) and kwargs.get("messages") is not None:
            return ChatResult(content=result)
        response_format = kwargs.get("response_format")
        if not (isinstance(result, ChatResult) and isinstance(response_format, type) and result.parsed is not None):
            return result
        try:
            return replace(result, parsed=response_format.model_validate(result.parsed))
        except ValueError as exc:  # pydantic's ValidationError
            raise ChatModelError(f"the model's answer does not fit {response_format.__qualname__}: {exc}") from None

    def __repr__(self) -> str:
        return f"ChatModel({self.model!r}, base_url={self.base_url!r})"


def _json_schema_format(response_format: Any) -> Mapping[str, Any]:
    """A ``response_format`` request field: a pydantic model's JSON schema (named after it; not strict, so tools
    may come along), a field given as such, or a bare JSON schema (named ``answer``)."""
    if isinstance(response_format, type) and hasattr(response_format, "model_json_schema"):
        return {"type": "json_schema", "json_schema": {"name": _schema_name(response_format.__name__),
                                                       "schema": copy.deepcopy(model_json_schema(response_format))}}
    if not isinstance(response_format, Mapping):
        raise TypeError("response_format takes a pydantic model class, a JSON schema dict or an OpenAI "
                        f"response_format dict, not {type(response_format).__name__}")
    if response_format.get("type") in ("json_schema", "json_object", "text"):
        return response_format
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": dict(response_format)}}


def _asks_for_json(response_format: Mapping[str, Any] | None) -> bool:
    return response_format is not None and response_format.get("type") in ("json_schema", "json_object")


def _schema_name(name: str) -> str:
    """A response format's name as the API takes it (letters, digits, ``_``, ``-``; at most 64)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "answer"


def _tokens(count: Any) -> int:
    """A token count as the service reported it, if it is one (a whole number, 0 to 2**63 - 1); else 0, logged: a
    count the journal cannot keep would fail the call after it took effect."""
    if count is None:
        return 0
    if isinstance(count, int) and not isinstance(count, bool) and 0 <= count < 2**63:
        return count
    log.warning("the model service reported a token count of %r; counted as 0", count)
    return 0


def _chat_result(completion: Any, latency_ms: float, *, parse_json: bool) -> ChatResult:
    """The plain result of an SDK completion (its first choice)."""
    if not completion.choices:
        raise ChatModelError(f"the chat-completions reply has no choices: {completion!r:.300}")
    choice = completion.choices[0]
    message = choice.message
    parsed = None
    if parse_json and message.content:
        try:
            parsed = json.loads(message.content)
        except ValueError as exc:
            raise ChatModelError(f"the model's structured reply is not JSON: {message.content!r:.300}") from exc
    calls = tuple(ToolCall.from_json(call.id, call.function.name, call.function.arguments)
                  for call in message.tool_calls or () if getattr(call, "function", None) is not None)
    usage = completion.usage
    return ChatResult(
        content=message.content, tool_calls=calls, parsed=parsed,
        usage=Usage(_tokens(usage.prompt_tokens), _tokens(usage.completion_tokens)) if usage is not None else Usage(),
        model=completion.model or "", latency_ms=latency_ms, finish_reason=choice.finish_reason,
        refusal=getattr(message, "refusal", None))
