"""Running one input of one key: the FIFO of (event, action) tasks, with journaling and reuse.

This is the engine under the Flink operator, free of Flink so it can be tested on its own. For input
``seq`` of a key it builds the InputEvent, then runs every triggered action in order until no event is
pending. For each action it first asks the key's recovered history (if the job was restored):

* a **completion** is reused: the action is skipped, its memory updates re-applied and its sent
  events re-sent with their recorded ids;
* **calls without a completion** (the action was cut short) are served in order to the re-executed
  action; a call whose identity (position, resource, arguments) differs ends the reuse for the rest;
* otherwise the action runs, each ``ctx.call`` is journaled as it completes, then the completion.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import cloudpickle

from flink_agents_replay.agent import ActionSpec, Agent, Event, InputEvent, OutputEvent, RunnerContext, with_event_id
from flink_agents_replay.digest import digest_value
from flink_agents_replay.errors import (
    AgentDefinitionError,
    CallInDoubtError,
    FingerprintMismatchError,
    NotPicklableError,
)
from flink_agents_replay.journal.index import KeyHistory
from flink_agents_replay.journal.records import (
    CallOutcome,
    CallRecord,
    CompletionRecord,
    RecordKind,
    RunPosition,
    event_id,
    input_event_id,
    journal_key,
    key_digest,
)
from flink_agents_replay.journal.writer import RunJournal
from flink_agents_replay.memory import Memory, MemoryUpdate
from flink_agents_replay.resources import _CALL_ID, InDoubtPolicy

__all__ = ["FingerprintPolicy", "RunCancelled", "RunInput", "RunResult", "RunStats", "execute_run"]

log = logging.getLogger(__name__)


class RunCancelled(Exception):
    """The operator is closing: the run stops at the next action or call boundary (and is not applied)."""


class FingerprintPolicy(str, enum.Enum):
    """What to do with a journaled action written by other action code than the code running now."""

    REUSE = "reuse"  # reuse it, with a warning and a count (default: a redeploy must not re-run effects)
    RE_EXECUTE = "re-execute"
    FAIL = "fail"


@dataclass
class RunStats:
    """What one run (or many, summed) did."""

    actions_executed: int = 0
    actions_reused: int = 0
    calls_executed: int = 0
    calls_reused: int = 0
    calls_in_doubt: int = 0
    divergences: int = 0
    fingerprint_mismatches: int = 0

    def add(self, other: RunStats) -> None:
        """Add ``other``'s counts to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        """The counts by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class RunInput:
    """One accepted input: the key, its key group, its seq and the record itself."""

    key: Any
    key_group: int
    seq: int
    input: Any


@dataclass
class RunResult:
    """What a finished run hands back to the operator."""

    seq: int
    memory: dict
    outputs: list[OutputEvent]
    stats: RunStats = field(default_factory=RunStats)


def execute_run(
    agent: Agent,
    run: RunInput,
    memory: dict,
    *,
    history: KeyHistory | None = None,
    journal: RunJournal | None = None,
    fingerprint_policy: FingerprintPolicy = FingerprintPolicy.REUSE,
    cancelled: Callable[[], bool] | None = None,
) -> RunResult:
    """Run ``run.input`` through ``agent`` on a private ``memory`` dict; return outputs and new memory.

    ``cancelled`` is asked before every action and call: when it says yes the run raises
    :class:`RunCancelled` (what it already journaled is reused by the next attempt).
    """
    cancelled = cancelled or _never
    digest_of_key = key_digest(run.key)
    input_digest = digest_value(run.input)
    stats = RunStats()
    state = Memory(memory)
    if history is not None and not history.input_matches(run.seq, input_digest):
        # Another input than the journaled one holds this seq: nothing from here on is ours.
        if history.drop_after(RunPosition(run.seq, -1)):
            stats.divergences += 1
            log.warning("key %r seq %d: a different input than the journaled one; its later records are dropped",
                        run.key, run.seq)
    first = with_event_id(InputEvent(run.input), input_event_id(digest_of_key, run.seq))
    tasks: deque[tuple[Event, ActionSpec]] = deque((first, spec) for spec in agent.actions_for(first))
    outputs: list[OutputEvent] = []
    order = 0
    while tasks:
        if cancelled():
            raise RunCancelled(f"run of key {run.key!r} seq {run.seq} stopped: the operator is closing")
        event, spec = tasks.popleft()
        position = RunPosition(run.seq, order)
        completion = history.completion(run.seq, event.id, spec.name) if history is not None else None
        if completion is not None and completion.fingerprint != spec.fingerprint:
            completion = _check_fingerprint(completion, spec, run, fingerprint_policy, stats)
        if completion is not None:
            state.apply(completion.memory_updates)
            state.take_updates()
            sent = completion.sent_events
            stats.actions_reused += 1
        else:
            recorded: list[CallRecord] = []
            if history is not None:
                if history.has_records_after(position) and history.drop_after(position):
                    stats.divergences += 1
                    log.warning("key %r seq %d: action %s has no journaled result but later records exist; "
                                "the key's history diverged and its later records are dropped",
                                run.key, run.seq, spec.name)
                recorded = history.recorded_calls(run.seq, event.id, spec.name)
            sent = _execute_action(agent, spec, event, run, order, state, recorded, journal, digest_of_key,
                                   input_digest, stats, cancelled)
            stats.actions_executed += 1
        for emitted in sent:
            if isinstance(emitted, OutputEvent):
                outputs.append(emitted)
                continue
            handlers = agent.actions_for(emitted)
            if not handlers:
                raise AgentDefinitionError(
                    f"action {spec.name} of agent {agent.name} sent a {type(emitted).__name__} event, but no action "
                    f"handles {type(emitted).__name__}: add @action({type(emitted).__name__}) or send an OutputEvent"
                )
            tasks.extend((emitted, handler) for handler in handlers)
        order += 1
    if history is not None:
        history.drop_through_seq(run.seq)
    if journal is not None:
        journal.acknowledge()  # outputs leave only after their records are acknowledged
    return RunResult(run.seq, state.data, outputs, stats)


def _check_fingerprint(completion: CompletionRecord, spec: ActionSpec, run: RunInput,
                       policy: FingerprintPolicy, stats: RunStats) -> CompletionRecord | None:
    stats.fingerprint_mismatches += 1
    message = (f"key {run.key!r} seq {run.seq}: the journaled result of action {spec.name} was written by other "
               f"action code (fingerprint {completion.fingerprint}, now {spec.fingerprint})")
    if policy is FingerprintPolicy.FAIL:
        raise FingerprintMismatchError(message + "; the fingerprint policy is 'fail'")
    if policy is FingerprintPolicy.RE_EXECUTE:
        log.warning("%s; re-executing it (fingerprint policy 're-execute')", message)
        return None
    log.warning("%s; reusing it (fingerprint policy 'reuse')", message)
    return completion


def _never() -> bool:
    return False


def _execute_action(agent: Agent, spec: ActionSpec, event: Event, run: RunInput, order: int, state: Memory,
                    recorded: list[CallRecord], journal: RunJournal | None, digest_of_key: str,
                    input_digest: str, stats: RunStats, cancelled: Callable[[], bool]) -> list[Event]:
    sent: list[Event] = []
    record_key = journal_key(run.key_group, run.seq, event.id, spec.name, digest_of_key)
    next_position = 0

    def send(new_event: Event) -> None:
        sent.append(with_event_id(new_event, event_id(digest_of_key, run.seq, event.id, spec.name, len(sent))))

    def call(resource_name: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal next_position, recorded
        position = next_position
        next_position += 1
        resource = agent.resource(resource_name)
        args_digest = digest_value((args, kwargs))
        record = recorded[position] if position < len(recorded) else None
        if record is not None and record.identity() != (position, resource_name, args_digest):
            log.warning("key %r seq %d action %s: call %d differs from the journaled one (%s); "
                        "its journaled calls from here on are not reused", run.key, run.seq, spec.name,
                        position, record.resource)
            recorded = recorded[:position]
            record = None
        if record is not None:
            if record.outcome is CallOutcome.RETURNED:
                stats.calls_reused += 1
                return record.result
            if record.outcome is CallOutcome.RAISED:
                stats.calls_reused += 1
                raise record.result
            stats.calls_in_doubt += 1
            if resource.in_doubt is InDoubtPolicy.FAIL:
                raise CallInDoubtError(
                    f"key {run.key!r} seq {run.seq} action {spec.name}: call {position} to {resource_name!r} "
                    "started before a failure and never reported back; its in_doubt policy is 'fail'"
                )
            if resource.in_doubt is InDoubtPolicy.ASSUME_DONE:
                log.warning("call %d to %r in doubt: assumed done (returns None)", position, resource_name)
                write_call(position, resource_name, args_digest, CallOutcome.RETURNED, None)
                return None
            log.warning("call %d to %r in doubt: made again (in_doubt policy 'rerun')", position, resource_name)

        if cancelled():
            raise RunCancelled(f"run of key {run.key!r} seq {run.seq} stopped before call {position} to "
                               f"{resource_name!r}: the operator is closing")
        if journal is not None and resource.tracks_start:
            write_call(position, resource_name, args_digest, CallOutcome.STARTED, None, must_ack=True)
        token = _CALL_ID.set(f"{agent.name}:{record_key.decode()}:{position}")
        try:
            result = resource.invoke(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - journaled, then re-raised as the same type
            stats.calls_executed += 1
            write_call(position, resource_name, args_digest, CallOutcome.RAISED, _picklable_exception(exc))
            raise
        finally:
            _CALL_ID.reset(token)
        stats.calls_executed += 1
        write_call(position, resource_name, args_digest, CallOutcome.RETURNED, result)
        return result

    def write_call(position: int, resource_name: str, args_digest: str, outcome: CallOutcome, result: Any,
                   must_ack: bool = False) -> None:
        if journal is None:
            return
        journal.write(
            record_key, RecordKind.CALL,
            CallRecord(run.seq, order, event.id, spec.name, position, resource_name, args_digest, outcome, result,
                       input_digest),
            fingerprint=spec.fingerprint, must_ack=must_ack,
            what=f"the result of call {position} to {resource_name!r} in action {spec.name}",
        )

    state.take_updates()
    spec.function(event, RunnerContext(key=run.key, seq=run.seq, memory=state, send=send, call=call))
    updates = state.take_updates()
    if journal is not None:
        completion = CompletionRecord(run.seq, order, event.id, spec.name, spec.fingerprint, updates, sent,
                                      next_position, input_digest)
        try:
            journal.write(record_key, RecordKind.COMPLETION, completion, fingerprint=spec.fingerprint,
                          what=f"the result of action {spec.name}")
        except NotPicklableError as exc:
            raise explain_unpicklable(spec.name, updates, sent) or exc from exc.__cause__
    return sent


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
        cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


def _picklable_exception(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip, else a RuntimeError that names it."""
    try:
        restored = cloudpickle.loads(cloudpickle.dumps(exc))
        if type(restored) is type(exc):
            return exc
    except Exception:  # noqa: BLE001
        pass
    return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")

