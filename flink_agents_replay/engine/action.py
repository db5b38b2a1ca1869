"""Executing one action: the user's function with a :class:`~flink_agents_replay.api.agent.RunnerContext`, journaled.

The action gets the key's memory, ``send`` (each sent event gets an id derived from its place in the run),
``call`` (:class:`~flink_agents_replay.engine.calls.ActionCalls`) and ``call_agents``
(:mod:`~flink_agents_replay.engine.children`). When it returns, its *completion* is journaled: the memory
updates it made (set or changed in place), the events it sent (copied as sent) and how many calls it made.
A reused action is rebuilt from that record alone. When an exception leaves it, an "action failed" record
names the calls the next attempt makes again (:mod:`~flink_agents_replay.engine.failures`).
"""

from __future__ import annotations

import functools
from typing import Any

import cloudpickle

from flink_agents_replay.api.agent import Event, RunnerContext, with_event_id
from flink_agents_replay.api.memory import Memory, MemoryUpdate, private_copy
from flink_agents_replay.core.errors import JournalClosedError, JournalRecordTooLargeError, NotPicklableError
from flink_agents_replay.engine.calls import ActionCalls
from flink_agents_replay.engine.children import call_agents
from flink_agents_replay.engine.context import ActionSite, RunCancelled, RunContext, RunStats, Scope
from flink_agents_replay.engine.failures import journal_action_failed
from flink_agents_replay.storage.formats.plain import dump_user
from flink_agents_replay.storage.records.journal import (
    ActionFailedRecord,
    CallRecord,
    CompletionRecord,
    RecordKind,
    event_id,
)

__all__ = ["execute_action", "explain_unpicklable"]


def execute_action(context: RunContext, scope: Scope, site: ActionSite, state: Memory,
                   recorded: list[CallRecord | None], retried: dict[int, int], stats: RunStats) -> list[Event]:
    """Run the action's function and journal its completion; return the events it sent (private copies).

    ``recorded`` are the action's journaled calls from an attempt cut short, ``retried`` the positions an
    "action failed" record asks to make again.
    """
    run, journal = context.run, context.journal
    calls = ActionCalls(context=context, scope=scope, site=site, stats=stats, recorded=recorded, retried=retried)
    sent: list[Event] = []

    def send(new_event: Event) -> None:
        sent.append(with_event_id(new_event, event_id(context.digest_of_key, run.seq, site.event.id, site.action,
                                                      len(sent))))

    state.take_updates()
    try:
        site.spec.function(site.event, RunnerContext(
            key=run.key, seq=run.seq, memory=state, send=send, call=calls.call,
            call_agents=functools.partial(call_agents, calls, state), event_time=run.event_time,
            resources=scope.agent.resources, wait_for=calls.wait_for))
        if calls.pending_wait is not None:  # the action caught its wait's suspension: it waits all the same
            raise calls.pending_wait
    except Exception as exc:
        if journal is not None and not isinstance(exc, (RunCancelled, JournalClosedError)):
            journal_action_failed(journal, site.record_key, site.spec, ActionFailedRecord(
                run.seq, site.order, site.event.id, site.action, f"{type(exc).__name__}: {exc}"[:500],
                context.input_digest, calls.calls_to_retry()))
        raise
    updates = state.take_updates()
    # The events as sent; later changes to objects they shared with memory or each other must not reach them
    # (a reused action's events come from the journal, as they were when it ended).
    copies = [private_copy(sent_event) for sent_event in sent]  # one by one: siblings share nothing either
    completion = CompletionRecord(context.run.seq, site.order, site.event.id, site.action, site.spec.fingerprint,
                                  updates, copies, calls.calls_made, context.input_digest)
    if journal is not None:
        _journal_completion(context, site, completion)
    context.completions.append(completion)  # a waiting run resumes from these (no journal needed)
    return copies


def _journal_completion(context: RunContext, site: ActionSite, completion: CompletionRecord) -> None:
    updates, sent = completion.memory_updates, completion.sent_events
    try:
        context.journal.write(site.record_key, RecordKind.COMPLETION, completion, fingerprint=site.spec.fingerprint,
                              what=f"the result of action {site.action}")
    except NotPicklableError as exc:
        raise explain_unpicklable(site.action, updates, sent) or exc from exc.__cause__
    except JournalRecordTooLargeError as exc:
        raise JournalRecordTooLargeError(f"{exc} {_largest_parts(updates, sent)}") from None


def _largest_parts(updates: list[MemoryUpdate], events: list[Event]) -> str:
    """Which memory paths and events make an action's result large, largest first (for the error message)."""
    sizes = [(len(cloudpickle.dumps(u.value)), f"memory path {u.path!r}") for u in updates]
    sizes += [(len(cloudpickle.dumps(e)), f"a sent {type(e).__name__}") for e in events]
    shown = ", ".join(f"{what} {size:,} bytes" for size, what in sorted(sizes, reverse=True)[:3])
    return (f"Largest parts: {shown}. Keep large values out of memory and events (store them elsewhere and keep a "
            "reference), or raise message.max.bytes in the kafka settings together with the journal topic's "
            "max.message.bytes.")


def explain_unpicklable(action_name: str, updates: list[MemoryUpdate], events: list[Event]) -> NotPicklableError | None:
    """Name the memory path or event that cloudpickle cannot serialize, if one of them is the cause."""
    for update in updates:
        reason = _pickle_problem(update.value)
        if reason:
            return NotPicklableError(
                f"action {action_name} set memory path {update.path!r} to a {type(update.value).__name__} that "
                f"cannot be serialized with cloudpickle ({reason}); memory values must be picklable"
            )
    for event in events:
        reason = _pickle_problem(event)
        if reason:
            return NotPicklableError(
                f"action {action_name} sent a {type(event).__name__} event that cannot be serialized with "
                f"cloudpickle ({reason}); events must be picklable"
            )
    return None


def _pickle_problem(value: Any) -> str | None:
    try:
        dump_user(value)  # as the journal pickles it (the package's own internal objects are refused)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None
