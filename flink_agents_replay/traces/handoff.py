"""What a run's trace hands over to the exporter process: a run's facts as bytes, and back.

A subtask's Python interpreter is busy with its runs, and one interpreter has one lock (the GIL): a thread of it
that makes and exports spans takes that lock from the task thread and the run threads (bench/README.md, *Tracing
on vs off*: 0.53-0.79x the runs/s). So the operator does as little as it can: it packs what the spans need of a
run (:func:`encode_run`: plain values, msgpack) and writes it to the exporter process
(:mod:`.exporter_process`), which unpacks it (:func:`decode_run`) and makes the spans (:mod:`.spans`) on its own
interpreter. What crosses is never persisted: its layout may change with the package (both ends are one install).

Only facts cross: a call's record is reduced to where it was, its resource, its outcome, its meta (plain data,
journaled as is), the finish reason of a model's answer and the type of a raised exception, and, with content on,
the texts of its arguments and result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgpack

from flink_agents_replay.engine.trace import ActionHow, CallHow, RunTrace, TracedAction
from flink_agents_replay.storage.records.chat import ChatResult
from flink_agents_replay.storage.records.journal import CallOutcome

__all__ = ["CallEntry", "CallFacts", "RunFacts", "RunIdentity", "TraceFacts", "decode_run", "encode_run", "span_count",
           "text"]

_TEXT_KEPT = 16 * 1024  # of a prompt, a reply, an input or an output, with content on


@dataclass(frozen=True)
class RunIdentity:
    """Which run, in which job, executed where: what names its trace and tags its spans (``key``: as text)."""

    agent: str
    key: str
    key_digest: str
    seq: int
    lineage: str
    job_id: str = ""
    attempt: int = 0
    subtask: int = 0
    replay: bool = False


@dataclass(frozen=True)
class CallFacts:
    """What a span needs of a call's record."""

    event_id: str
    action: str
    position: int
    resource: str
    outcome: CallOutcome
    meta: dict[str, Any]
    finish_reason: str | None = None  # a model's answer's
    error_type: str | None = None  # a raised call's exception's type
    result_text: str | None = None  # content on: what it returned


@dataclass(frozen=True)
class CallEntry:
    """One call of the execution: its facts, how the execution got it, its call id, the path of the (sub-)agent
    whose action made it, its interval (ns), and with content on its arguments as text."""

    record: CallFacts
    how: CallHow
    call_id: str
    agent_path: tuple[str, ...]
    start_ns: int
    end_ns: int
    arguments_text: str | None = None
    parent: tuple[str, str] | None = None  # the action it hangs under, if not its own (a reused sub-agent's calls)


@dataclass(frozen=True)
class TraceFacts:
    """One execution of a run: its interval, its upstream's traceparent, its actions and calls."""

    start_ns: int
    end_ns: int
    traceparent: str | None
    actions: list[TracedAction] = field(default_factory=list)
    calls: list[CallEntry] = field(default_factory=list)


@dataclass(frozen=True)
class RunFacts:
    """All the spans of one execution of a run are made from: the run, the execution, and what to show."""

    run: RunIdentity
    trace: TraceFacts
    content: bool = False
    outputs_text: str | None = None
    error: str | None = None
    with_run: bool = True  # False: a run parked at a wait (its run span comes when it ends)


def encode_run(trace: RunTrace, run: RunIdentity, *, content: bool = False, outputs: list[Any] | None = None,
               error: str | None = None, with_run: bool = True) -> bytes:
    """The facts of one execution of a run, packed (on the task thread: kept to plain values)."""
    calls = [[call.record.event_id, call.record.action, call.record.position, call.record.resource,
              call.record.outcome.value, call.record.meta, *_result_facts(call.record, content), call.how.value,
              call.call_id, call.agent_path, call.start_ns, call.end_ns,
              text(call.arguments) if content and call.arguments is not None else None, call.parent]
             for call in trace.calls]
    actions = [[action.event_id, action.action, action.order, action.agent_path, action.how.value, action.start_ns,
                action.end_ns, action.error] for action in trace.actions]
    identity = [run.agent, run.key, run.key_digest, run.seq, run.lineage, run.job_id, run.attempt, run.subtask,
                run.replay]
    return msgpack.packb([identity, trace.start_ns, trace.end_ns, trace.traceparent, actions, calls, content,
                          text(outputs) if content and outputs is not None else None, error, with_run],
                         default=_plain)


def span_count(trace: RunTrace, *, with_run: bool = True) -> int:
    """How many spans :func:`~.spans.spans_of_run` makes of ``trace``: the run's, one per action and call, and for a
    reused call its original execution's too."""
    reused = sum(1 for call in trace.calls if call.how is CallHow.REUSED and "at_ms" in call.record.meta)
    inside = sum(1 for call in trace.calls if call.how is CallHow.INSIDE_REUSED)
    inside_made = sum(1 for call in trace.calls if call.how is CallHow.INSIDE_REUSED and "at_ms" in call.record.meta)
    return int(with_run) + len(trace.actions) + len(trace.calls) + reused - inside + inside_made


def decode_run(packed: bytes) -> RunFacts:
    """What :func:`encode_run` packed."""
    identity, start, end, traceparent, actions, calls, content, outputs, error, with_run = msgpack.unpackb(
        packed, strict_map_key=False)
    return RunFacts(
        RunIdentity(*identity),
        TraceFacts(start, end, traceparent,
                   [TracedAction(event, action, order, tuple(path), ActionHow(how), begun, ended, failure)
                    for event, action, order, path, how, begun, ended, failure in actions],
                   [_call_entry(call) for call in calls]),
        content, outputs, error, with_run)


def text(value: Any) -> str:
    """A value as people read it in a span (JSON where it can be), cut at 16 KB."""
    if isinstance(value, str):
        return value[:_TEXT_KEPT]
    try:
        shown = json.dumps(value, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):
        shown = repr(value)
    return shown[:_TEXT_KEPT]


def _call_entry(call: list) -> CallEntry:
    (event, action, position, resource, outcome, meta, finish, error_type, result, how, call_id, path, begun,
     ended, arguments, parent) = call
    facts = CallFacts(event, action, position, resource, CallOutcome(outcome), meta, finish, error_type, result)
    return CallEntry(facts, CallHow(how), call_id, tuple(path), begun, ended, arguments,
                     tuple(parent) if parent else None)


def _result_facts(record, content: bool) -> tuple[str | None, str | None, str | None]:
    """(finish reason, exception type, result text) of a call record."""
    result = record.result
    if record.outcome is CallOutcome.RAISED:
        kind = result["type"] if isinstance(result, dict) and "type" in result else type(result)
        return None, getattr(kind, "__qualname__", str(kind)), None
    if isinstance(result, ChatResult):
        return result.finish_reason, None, text(result.content) if content else None
    return None, None, text(result) if content and record.outcome is CallOutcome.RETURNED else None


def _plain(value: Any) -> Any:
    """A meta value msgpack does not know (meta is plain data; this is a guard): its text."""
    return str(value)
