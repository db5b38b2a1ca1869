"""The tool loop: a model calls tools until it answers, every turn and every tool call journaled.

Inside an action::

    answer = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": ticket}],
                           tools=["lookup_order"], max_turns=4)
    ctx.send_event(OutputEvent(output=answer.content))

Each model turn is one ``ctx.call(model, messages=..., tools=...)``, each tool the model asks for one
``ctx.call(tool, **arguments)``, in a fixed order, so the journal holds the loop step by step. After a failover
the recovered run reuses every turn and tool call that was journaled, in order (their results rebuild the same
conversation), and goes on live from the first that was not: a loop cut between a tool call and the next model
turn repeats neither (an ``external`` tool's outcome is acknowledged by the journal before the next turn is
asked). Tools keep their declared side effects and in-doubt policy (an ``external`` tool cut short during its
call is in doubt and follows its ``in_doubt`` policy), and in a replay the side-effect policy governs each call
as usual.

The model's arguments are converted to the tool function's types (an enum member, a pydantic model) before the
call; arguments that are not a JSON object or do not fit, or a tool not in ``tools``, make no call and send the
model an error message instead, so it may correct itself. A tool's answer is sent as JSON (a ``str`` as it is;
sets sorted, dataclasses and pydantic models as their fields, enums as values: the same text in every attempt
and process); an answer that is not such data is refused with a ``TypeError``.

Limits: a model that keeps calling tools stops the loop after ``max_turns`` model turns with
:class:`~flink_agents_replay.core.errors.ToolLoopLimitError`; the tools of that last turn have run (their effects
happened) and no model saw their answers.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flink_agents_replay.api.agent import RunnerContext
from flink_agents_replay.core.errors import ToolCallDeniedError, ToolLoopLimitError
from flink_agents_replay.storage.records.chat import ChatResult, ToolCall

__all__ = ["ToolLoopResult", "run_tool_loop"]


@dataclass(frozen=True)
class ToolLoopResult:
    """How a tool loop ended.

    Attributes:
        content: the model's final answer text.
        final: the last model turn's :class:`~flink_agents_replay.storage.records.chat.ChatResult` (its
            ``parsed`` object with ``response_format``).
        messages: the whole conversation, the final answer included.
        turns: model turns made (reused ones count).
        tool_calls: every tool call, in order, with the result it gave.
    """

    content: str | None
    final: ChatResult
    messages: list[dict[str, Any]]
    turns: int
    tool_calls: list[tuple[ToolCall, Any]] = field(default_factory=list)


def run_tool_loop(ctx: RunnerContext, model: str, *, messages: Sequence[Mapping[str, Any]], tools: Sequence[str],
                  max_turns: int = 8, response_format: Any = None, **params: Any) -> ToolLoopResult:
    """Let the resource ``model`` (a :class:`~flink_agents_replay.api.chat_model.ChatModel`) call the resources
    named in ``tools`` until it answers without a tool call; at most ``max_turns`` model turns.

    A tool call naming a tool not in ``tools`` gets an error message back (the model may correct itself);
    an exception raised by a tool leaves the loop (and the action) as usual. ``params`` go with every turn.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns!r}")
    schemas = ctx.tool_schemas(*tools)
    conversation = [dict(message) for message in messages]
    made: list[tuple[ToolCall, Any]] = []
    for turn in range(1, max_turns + 1):
        result = ctx.call(model, messages=conversation, tools=schemas, response_format=response_format, **params)
        conversation.append(result.message())
        if not result.tool_calls:
            return ToolLoopResult(result.content, result, conversation, turn, made)
        for call in result.tool_calls:
            answer = _call_tool(ctx, call, tools)
            made.append((call, answer))
            conversation.append({"role": "tool", "tool_call_id": call.id, "content": _as_text(answer)})
    raise ToolLoopLimitError(f"the model {model!r} still called tools after {max_turns} turns (max_turns); last "
                             f"asked for {[c.name for c in result.tool_calls]}")


def _call_tool(ctx: RunnerContext, call: ToolCall, tools: Sequence[str]) -> Any:
    """The tool's answer, or an error message for the model: an unknown tool, arguments that are not a JSON
    object or do not fit its types (made no call)."""
    if call.name not in tools:
        return f"error: there is no tool {call.name!r}; the tools are {list(tools)}"
    problem = call.arguments_problem()
    if problem is not None:
        return f"error: the arguments of {call.name!r} {problem}"
    try:
        arguments = ctx.tool_arguments(call.name, call.arguments)
    except ValueError as exc:
        return f"error: the arguments of {call.name!r} do not fit its parameters: {exc}"
    try:
        return ctx.call(call.name, **arguments)
    except ToolCallDeniedError as denied:  # the tool was not called: the model decides what to do instead
        return f"error: the call to {call.name!r} was denied by a reviewer" + (
            f": {denied.reason}" if denied.reason else " (no reason given)")


def _as_text(answer: Any) -> str:
    """What the model is sent of a tool's answer: a string as it is, anything else as JSON (sets sorted,
    dataclasses and pydantic models as their fields, enums as their values), the same text in every attempt and
    process (the next turn's request is compared with the journaled one); other values are refused."""
    if isinstance(answer, str):
        return answer
    try:
        return json.dumps(_plain(answer), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a tool's answer must be JSON-like data to send to the model ({exc}): return dicts, "
                        "lists, strings and numbers, or a str") from None


def _plain(value: Any) -> Any:
    """``value`` as JSON data, deterministically."""
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=lambda item: json.dumps(item, sort_keys=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump(mode="json"))
    raise TypeError(f"{type(value).__name__} is not JSON data")


def _key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    if isinstance(key, (str, int, float, bool)) or key is None:
        return json.dumps(key) if not isinstance(key, str) else key
    raise TypeError(f"a key of type {type(key).__name__} is not JSON data")
