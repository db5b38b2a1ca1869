"""A run's spans, made from what one execution of it did (:class:`~flink_agents_replay.engine.trace.RunTrace`).

The hierarchy is run -> action -> call: the run's span (``invoke_agent <agent>``) is the root of the run's trace,
each action a child of it, each call a child of its action, and a sub-agent's actions children of the action that
called it. A call's span depends on how this execution got its outcome:

* **made now** (``executed``): a span over the call's own interval, with the model, the tokens and the finish reason
  the service reported (a model call), or the tool's name;
* **reused** from the journal (after a failure, or a parked run resuming): a short span of this execution marked
  reused, with the original call's start and latency as attributes, and no model attributes or tokens (a reused
  call is never counted again as a model call). Its original execution's span is made again from the journaled
  record, with the id that execution gave it (:mod:`.ids`): if the attempt that made the call died before its
  spans left, this is how they are not lost; if they left, the receiver keeps one;
* **recorded** (a replay served production's outcome) and **settled** (a call in doubt assumed done or found by a
  reconciler): marked so, not executed.

Prompts, completions, tool arguments and results, the run's input and outputs are left out unless ``content``.
Nothing here reads a signing key or an API key: they are not in a run's trace to begin with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flink_agents_replay.api.agent import Agent
from flink_agents_replay.api.chat_model import ChatModel
from flink_agents_replay.api.fallback_model import FallbackChatModel
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.engine.trace import ActionHow, CallHow, TracedAction
from flink_agents_replay.storage.records.journal import STILL_IN_DOUBT_IF_FAILED, CallOutcome
from flink_agents_replay.storage.records.waits import DECISION_RESOURCE, WAIT_RESOURCE
from flink_agents_replay.traces import conventions as c
from flink_agents_replay.traces.handoff import CallEntry, CallFacts, RunFacts, RunIdentity
from flink_agents_replay.traces.ids import (
    action_span_id,
    executed_call_span_id,
    parse_traceparent,
    random_span_id,
    run_span_id,
    trace_id,
)

__all__ = ["CHAT", "MEMORY", "RESOURCE", "TOOL", "SpanData", "resource_kinds", "spans_of_run"]

#: What a resource is, for its spans (:func:`resource_kinds`).
CHAT, TOOL, MEMORY, RESOURCE = "chat", "tool", "memory", "resource"


@dataclass(frozen=True)
class SpanData:
    """One span, as plain data (the exporter turns it into an OpenTelemetry span)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # an ERROR status with this description
    links: tuple[tuple[int, int], ...] = ()  # (trace id, span id) of spans this one follows from (the upstream)


def resource_kinds(agent: Agent) -> dict[str, str]:
    """What each resource of ``agent`` and its sub-agents is: a chat model, a tool, or another resource."""
    kinds: dict[str, str] = {}
    agents, seen = [agent], set()
    while agents:
        each = agents.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        agents.extend(each.sub_agents.values())
        for name, resource in each.resources.items():
            kinds.setdefault(name, CHAT if isinstance(resource, (ChatModel, FallbackChatModel))
                             else TOOL if isinstance(resource, Tool) else RESOURCE)
    return kinds


def spans_of_run(facts: RunFacts, kinds: Mapping[str, str]) -> list[SpanData]:
    """Every span of one execution of a run: the run, its actions, its calls (see the module's docstring); without
    the run's own span for a run parked at a wait (``facts.with_run`` false)."""
    run, trace, content = facts.run, facts.trace, facts.content
    tid = trace_id(run.lineage, run.agent, run.key_digest, run.seq)
    root = run_span_id(tid)
    ids = {(action.event_id, action.action): action_span_id(tid, action.event_id, action.action)
           for action in trace.actions}
    calls: list[SpanData] = []
    for call in trace.calls:
        parent = ids.get(call.parent or (call.record.event_id, call.record.action), root)
        calls.extend(_call_spans(call, tid, parent, run, kinds, content))
    callers: dict[tuple[tuple[str, ...], int], int] = {}  # a sub-agent's actions hang under their caller's action
    for action in trace.actions:
        callers.setdefault((action.agent_path, action.order), ids[(action.event_id, action.action)])
    actions = [_action_span(action, tid, ids[(action.event_id, action.action)],
                            callers.get((action.agent_path[:-1], action.order), root), calls)
               for action in trace.actions]
    every = actions + calls
    start = min([trace.start_ns, *(span.start_ns for span in every)])
    end = max([trace.end_ns or trace.start_ns, *(span.end_ns for span in every)])
    upstream = parse_traceparent(trace.traceparent)
    if not facts.with_run:
        return every
    run_span = SpanData(f"invoke_agent {run.agent}", tid, root, None, start, end,
                        _run_attributes(run, content, facts.outputs_text), facts.error,
                        links=(upstream,) if upstream else ())
    return [run_span, *every]


def _action_span(action: TracedAction, tid: int, span_id: int, parent: int, calls: list[SpanData]) -> SpanData:
    """An action's span, over this execution's interval and its calls' (a reused call's original execution began
    in an earlier attempt)."""
    children = [span for span in calls if span.parent_id == span_id]
    attributes = {c.OI_SPAN_KIND: c.OI_CHAIN, c.FA_ACTION: action.action, c.FA_EVENT_ID: action.event_id,
                  c.FA_ACTION_HOW: action.how.value, c.FA_AGENT: action.agent_path[-1]}
    return SpanData(f"action {action.action}", tid, span_id, parent,
                    min([action.start_ns, *(span.start_ns for span in children)]),
                    max([action.end_ns, *(span.end_ns for span in children)]), attributes,
                    action.error if action.how is ActionHow.FAILED else None)


def _call_spans(call: CallEntry, tid: int, parent: int, run: RunIdentity, kinds: Mapping[str, str],
                content: bool) -> list[SpanData]:
    record = call.record
    kind = _kind(record.resource, kinds)
    # The run's key and seq are on the run's span (a call's trace is its run's); each attribute costs the exporter.
    common = {c.FA_CALL_ID: call.call_id, c.FA_RESOURCE: record.resource, c.FA_POSITION: record.position,
              c.FA_OUTCOME: record.outcome.value, c.FA_CALL_HOW: call.how.value}
    error = record.error_type if record.outcome is CallOutcome.RAISED else None
    if STILL_IN_DOUBT_IF_FAILED in record.meta or "reconciled" in record.meta:
        common[c.FA_IN_DOUBT] = True
    if "reconciled" in record.meta:
        common[c.FA_RECONCILED] = str(record.meta["reconciled"])
    if call.how is CallHow.EXECUTED:
        return [_executed(call, tid, parent, kind, common, content, error)]
    if call.how is CallHow.INSIDE_REUSED:  # the sub-agent did not run now: only its execution then
        if "at_ms" not in record.meta:
            return []
        return [_executed(call, tid, parent, kind, {**common, c.FA_CALL_HOW: CallHow.EXECUTED.value}, content, error)]
    if call.how is CallHow.REUSED:
        spans = [_reused(call, tid, parent, kind, common, error)]
        if "at_ms" in record.meta:  # the original execution, as that attempt made it (same id)
            spans.append(_executed(call, tid, parent, kind, {**common, c.FA_CALL_HOW: CallHow.EXECUTED.value},
                                   content, error))
        return spans
    attributes = {**common, c.OI_SPAN_KIND: c.OI_CHAIN}
    return [SpanData(f"{call.how.value} {_name(kind, record)}", tid, random_span_id(), parent, call.start_ns,
                     call.end_ns, attributes, error)]


def _executed(call: CallEntry, tid: int, parent: int, kind: str, common: dict, content: bool,
              error: str | None) -> SpanData:
    """The span of the call's execution, over its interval as its record notes it (the same whichever attempt makes
    the span: the one that made the call, or a later one that reused it)."""
    record = call.record
    began_ms = record.meta.get("at_ms")
    if began_ms is not None:  # its journaled times: the same span whichever attempt makes it
        start = int(began_ms) * 1_000_000
        end = start + int(float(record.meta.get("latency_ms", 0.0)) * 1_000_000)
    else:
        start, end = call.start_ns, call.end_ns
    attributes = {**common, **_kind_attributes(kind, record, executed=True)}
    if "latency_ms" in record.meta:
        attributes[c.FA_LATENCY_MS] = float(record.meta["latency_ms"])
    if content:
        attributes.update(_content(kind, call))
    span_id = executed_call_span_id(tid, call.call_id, began_ms if began_ms is not None else call.start_ns,
                                    record.outcome.value)
    return SpanData(_name(kind, record), tid, span_id, parent, start, end, attributes, error)


def _reused(call: CallEntry, tid: int, parent: int, kind: str, common: dict, error: str | None) -> SpanData:
    record = call.record
    attributes = {**common, c.FA_REUSED: True, **_kind_attributes(kind, record, executed=False)}
    if "at_ms" in record.meta:
        attributes[c.FA_ORIGINAL_START_MS] = int(record.meta["at_ms"])
    if "latency_ms" in record.meta:
        attributes[c.FA_ORIGINAL_LATENCY_MS] = float(record.meta["latency_ms"])
    return SpanData(f"reused {_name(kind, record)}", tid, random_span_id(), parent, call.start_ns, call.end_ns,
                    attributes, error)


def _kind(resource: str, kinds: Mapping[str, str]) -> str:
    if resource.startswith("agent:"):
        return "agent"
    if resource in (WAIT_RESOURCE, DECISION_RESOURCE):
        return "wait"
    return kinds.get(resource, RESOURCE)


def _name(kind: str, record: CallFacts) -> str:
    """The span's name: OpenTelemetry's ``chat <model>``, ``execute_tool <tool>``, ``invoke_agent <agent>``."""
    if kind == CHAT:
        return f"chat {record.meta.get('model') or record.resource}"
    if kind == TOOL:
        return f"execute_tool {record.resource}"
    if kind == "agent":
        return f"invoke_agent {record.resource.removeprefix('agent:')}"
    if kind == "wait":
        return "wait" if record.resource == WAIT_RESOURCE else "decision"
    return f"{kind} {record.resource}"


def _kind_attributes(kind: str, record: CallFacts, *, executed: bool) -> dict[str, Any]:
    """What a span of this kind says: model calls' GenAI and OpenInference attributes (tokens only when executed:
    a reused call is not a model call again)."""
    meta = record.meta
    if kind == CHAT:
        model = str(meta.get("model") or "")
        if not executed:
            return {c.OI_SPAN_KIND: c.OI_CHAIN, c.OI_LLM_MODEL_NAME: model}
        attributes = {c.GEN_AI_OPERATION_NAME: "chat", c.GEN_AI_PROVIDER_NAME: "openai",
                      c.GEN_AI_RESPONSE_MODEL: model, c.GEN_AI_REQUEST_MODEL: model,
                      c.OI_SPAN_KIND: c.OI_LLM, c.OI_LLM_MODEL_NAME: model, c.OI_LLM_PROVIDER: "openai",
                      **_tokens(meta)}
        if record.finish_reason:
            attributes[c.GEN_AI_RESPONSE_FINISH_REASONS] = [record.finish_reason]
        if "models_asked" in meta:
            attributes[c.FA_MODELS_ASKED] = int(meta["models_asked"])
        return attributes
    if kind == TOOL:
        if not executed:
            return {c.OI_SPAN_KIND: c.OI_CHAIN, c.GEN_AI_TOOL_NAME: record.resource}
        return {c.GEN_AI_OPERATION_NAME: "execute_tool", c.GEN_AI_TOOL_NAME: record.resource,
                c.GEN_AI_TOOL_TYPE: "function", c.OI_SPAN_KIND: c.OI_TOOL, c.OI_TOOL_NAME: record.resource}
    if kind == "agent":
        name = record.resource.removeprefix("agent:")
        if not executed:
            return {c.OI_SPAN_KIND: c.OI_CHAIN, c.GEN_AI_AGENT_NAME: name}
        return {c.GEN_AI_OPERATION_NAME: "invoke_agent", c.GEN_AI_AGENT_NAME: name, c.OI_SPAN_KIND: c.OI_AGENT}
    return {c.OI_SPAN_KIND: c.OI_CHAIN}


def _tokens(meta: Mapping[str, Any]) -> dict[str, int]:
    """The token counts the call reported, those that are counts (a service that reports none, or nonsense, has
    none in its span rather than 0)."""
    prompt, completion = (meta.get(name) for name in ("prompt_tokens", "completion_tokens"))
    counts = {}
    if _is_count(prompt):
        counts[c.GEN_AI_USAGE_INPUT_TOKENS] = counts[c.OI_TOKENS_PROMPT] = prompt
    if _is_count(completion):
        counts[c.GEN_AI_USAGE_OUTPUT_TOKENS] = counts[c.OI_TOKENS_COMPLETION] = completion
    if _is_count(prompt) and _is_count(completion):
        counts[c.OI_TOKENS_TOTAL] = prompt + completion
    return counts


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


def _content(kind: str, call: CallEntry) -> dict[str, Any]:
    """Prompts and replies, tool arguments and results (content on only)."""
    attributes: dict[str, Any] = {}
    if call.arguments_text is not None:
        attributes[c.OI_INPUT_VALUE] = call.arguments_text
        attributes[c.GEN_AI_INPUT_MESSAGES if kind == CHAT else c.GEN_AI_TOOL_CALL_ARGUMENTS] = call.arguments_text
    if call.record.result_text is not None:
        attributes[c.OI_OUTPUT_VALUE] = call.record.result_text
        attributes[c.GEN_AI_OUTPUT_MESSAGES if kind == CHAT else c.GEN_AI_TOOL_CALL_RESULT] = call.record.result_text
    return attributes


def _run_attributes(run: RunIdentity, content: bool, outputs_text: str | None) -> dict[str, Any]:
    attributes = {c.GEN_AI_OPERATION_NAME: "invoke_agent", c.GEN_AI_AGENT_NAME: run.agent, c.OI_SPAN_KIND: c.OI_AGENT,
                  c.FA_KEY: run.key, c.FA_SEQ: run.seq, c.FA_LINEAGE: run.lineage,
                  c.FA_JOB_ID: run.job_id, c.FA_ATTEMPT: run.attempt, c.FA_SUBTASK: run.subtask,
                  c.OI_SESSION_ID: run.key}
    if run.replay:
        attributes[c.FA_REPLAY] = True
    if content and outputs_text is not None:
        attributes[c.OI_OUTPUT_VALUE] = outputs_text
    return attributes
