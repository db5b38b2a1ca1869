"""What a chat model call returns when it is more than text: content, tool calls, usage, the parsed object.

:class:`ChatResult` is the result of ``ctx.call("llm", messages=...)`` (also with ``tools=`` or
``response_format=``). The journal and the capture keep it as plain data (:func:`chat_result_to_plain`), never
as a class of this package, so a recorded result reads in any later version; only ``parsed``, the user's own
object (a pydantic model instance, a dict), is kept as a user value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from flink_agents_replay.storage.formats.plain import dump_user, load_user

__all__ = ["ChatResult", "ToolCall", "Usage", "chat_result_from_plain", "chat_result_to_plain"]

_SCHEMA = 1


@dataclass(frozen=True)
class ToolCall:
    """A tool the model asked to call: the call's id (to answer with a ``tool`` message), the tool's name, its
    arguments parsed from JSON (``{}`` when the model sent none or no JSON object: :meth:`arguments_problem` says
    why) and as sent."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str = "{}"

    @classmethod
    def from_json(cls, call_id: str, name: str, raw_arguments: str | None) -> ToolCall:
        """A tool call with ``raw_arguments`` parsed (leniently: a model may send invalid JSON)."""
        raw = raw_arguments or "{}"
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = {}
        return cls(call_id, name, parsed if isinstance(parsed, dict) else {}, raw)

    def arguments_problem(self) -> str | None:
        """Why the model's arguments are not a JSON object (cut off, a list...); ``None`` when they are."""
        try:
            parsed = json.loads(self.raw_arguments or "{}")
        except ValueError as exc:
            return f"are not JSON ({exc})"
        return None if isinstance(parsed, dict) else f"must be a JSON object, not {_json_kind(parsed)}"


def _json_kind(value: Any) -> str:
    kinds = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


@dataclass(frozen=True)
class Usage:
    """Tokens the model service counted for the call (0 when it reported none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class ChatResult:
    """One chat-completions answer.

    Attributes:
        content: the reply text (``None`` when the model only called tools or refused).
        tool_calls: the tools the model asked to call, in order.
        parsed: with ``response_format``, the reply parsed: an instance of the pydantic model given, or the
            JSON value for a JSON schema. ``None`` otherwise (or when the model refused). The journal keeps
            its JSON (a pydantic model's ``model_dump(mode="json")``); the chat model rebuilds the instance.
        usage: the tokens the service reported.
        model: the model that answered (as the service names it).
        latency_ms: how long the request took, retries included.
        finish_reason: why the model stopped (``stop``, ``tool_calls``, ``length``...).
        refusal: the model's refusal message, if it refused.
    """

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    parsed: Any = None
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    latency_ms: float = 0.0
    finish_reason: str | None = None
    refusal: str | None = None

    def message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation before the tools' answers (OpenAI format)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": call.id, "type": "function",
                                      "function": {"name": call.name, "arguments": call.raw_arguments}}
                                     for call in self.tool_calls]
        return message


def chat_result_to_plain(result: ChatResult) -> dict[str, Any]:
    """The plain form the journal and the capture keep (``parsed`` as a user value)."""
    return {"schema": _SCHEMA, "content": result.content,
            "tool_calls": [[call.id, call.name, call.raw_arguments] for call in result.tool_calls],
            "parsed": _parsed_to_plain(result.parsed),
            "usage": [result.usage.prompt_tokens, result.usage.completion_tokens], "model": result.model,
            "latency_ms": result.latency_ms, "finish_reason": result.finish_reason, "refusal": result.refusal}


def chat_result_from_plain(plain: dict[str, Any]) -> ChatResult:
    """The :class:`ChatResult` :func:`chat_result_to_plain` wrote."""
    if plain.get("schema", 1) > _SCHEMA:
        raise ValueError(f"chat result of schema {plain['schema']}; this version reads up to {_SCHEMA}: upgrade "
                         "flink-agents-replay")
    prompt, completion = plain["usage"]
    return ChatResult(
        content=plain["content"],
        tool_calls=tuple(ToolCall.from_json(*call) for call in plain["tool_calls"]),
        parsed=_parsed_from_plain(plain["parsed"]), usage=Usage(prompt, completion),
        model=plain["model"], latency_ms=plain["latency_ms"], finish_reason=plain["finish_reason"],
        refusal=plain.get("refusal"))


def _parsed_to_plain(parsed: Any) -> Any:
    """A parsed reply as its JSON (a pydantic model: ``model_dump``; classes defined in a job script, pickled by
    value, would not pickle), anything else not JSON as a user value."""
    if parsed is None:
        return None
    dump = getattr(parsed, "model_dump", None)
    if callable(dump):
        return {"json": dump(mode="json")}
    try:
        json.dumps(parsed)
    except (TypeError, ValueError):
        return {"pickled": dump_user(parsed, what="a parsed model reply")}
    return {"json": parsed}


def _parsed_from_plain(plain: Any) -> Any:
    if plain is None:
        return None
    return plain["json"] if "json" in plain else load_user(plain["pickled"])
