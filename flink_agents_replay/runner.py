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

import copy
import enum
import functools
import hashlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import cloudpickle

from flink_agents_replay.agent import ActionSpec, Agent, Event, InputEvent, OutputEvent, RunnerContext, with_event_id
from flink_agents_replay.capture.records import BlockedCall
from flink_agents_replay.child_pool import ChildCallPool, run_inline
from flink_agents_replay.digest import digest_value
from flink_agents_replay.errors import (
    AgentDefinitionError,
    CallBlocked,
    CallInDoubtError,
    CallTimeoutError,
    FingerprintMismatchError,
    JournalRecordTooLargeError,
    NoSubAgentOutputError,
    NotPicklableError,
    SubAgentCycleError,
    SubAgentTimeoutError,
)
from flink_agents_replay.journal.index import KeyHistory
from flink_agents_replay.journal.raised import decode_exception, encode_exception
from flink_agents_replay.journal.records import (
    ACCEPTED_ACTION,
    AcceptedRecord,
    ActionFailedRecord,
    CallOutcome,
    CallRecord,
    CompletionRecord,
    RecordKind,
    RunPosition,
    child_input_event_id,
    event_id,
    input_event_id,
    journal_key,
    key_digest,
)
from flink_agents_replay.journal.writer import JournalClosedError, RunJournal
from flink_agents_replay.memory import Memory, MemoryUpdate, private_copy
from flink_agents_replay.replay.policy import CallPolicy, policy_for
from flink_agents_replay.resources import _CALL_ID, InDoubtPolicy

__all__ = ["SUB_AGENT_MEMORY", "FingerprintPolicy", "ReplayCalls", "RunCancelled", "RunInput", "RunResult",
           "RunStats", "execute_run"]

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
    child_calls_executed: int = 0
    child_calls_reused: int = 0
    calls_retried_after_failure: int = 0  # calls that raised, failed their action, and were made again
    calls_recorded: int = 0  # replay: served from the production capture (policy 'recorded')
    calls_blocked: int = 0  # replay: not made (policy 'blocked', or 'recorded' without a record)

    def add(self, other: RunStats) -> None:
        """Add ``other``'s counts to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        """The counts by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class RunInput:
    """One accepted input: the key, its key group, its seq, the record itself and its event time (ms)."""

    key: Any
    key_group: int
    seq: int
    input: Any
    event_time: int | None = None


@dataclass
class RunResult:
    """What a finished run hands back to the operator."""

    seq: int
    memory: dict
    outputs: list[OutputEvent]
    stats: RunStats = field(default_factory=RunStats)
    calls: list[CallRecord] = field(default_factory=list)  # every call's outcome, made or reused (for capture)
    blocked: list[BlockedCall] = field(default_factory=list)  # replay only
    input_digest: str = ""
    error: str | None = None  # replay only: the exception that ended the run (memory and outputs untouched)


@dataclass(frozen=True)
class ReplayCalls:
    """How a replay treats one run's calls: the policy per resource name (``*``: any other) and the calls
    production made in the run of the same input, by (event id, action, position)."""

    policies: dict[str, CallPolicy]
    recorded: dict[tuple[str, str, int], CallRecord] = field(default_factory=dict)
    #: Prefix of the replay's call ids: a live call must not be answered from a service's idempotency store
    #: with what production's call with the same id got.
    call_id_prefix: str = "replay:"


def execute_run(
    agent: Agent,
    run: RunInput,
    memory: dict,
    *,
    history: KeyHistory | None = None,
    journal: RunJournal | None = None,
    fingerprint_policy: FingerprintPolicy = FingerprintPolicy.REUSE,
    cancelled: Callable[[], bool] | None = None,
    child_pool: ChildCallPool | None = None,
    replay: ReplayCalls | None = None,
) -> RunResult:
    """Run ``run.input`` through ``agent`` on a private ``memory`` dict; return outputs and new memory.

    ``cancelled`` is asked before every action and call: when it says yes the run raises
    :class:`RunCancelled` (what it already journaled is reused by the next attempt). ``child_pool`` runs
    the sub-agent calls of ``ctx.call_agents`` concurrently (without it they run one after another).
    ``replay`` applies a replay's side-effect policy to every ``ctx.call`` (:mod:`flink_agents_replay.replay`).
    """
    context = _Run(run, history, journal, fingerprint_policy, cancelled or _never, key_digest(run.key),
                   digest_value(run.input), child_pool, replay)
    stats = RunStats()
    state = Memory(memory)
    if history is not None and not history.input_matches(run.seq, context.input_digest):
        # Another input than the journaled one holds this seq: nothing from here on is ours.
        if history.drop_after(RunPosition(run.seq, -1)):
            stats.divergences += 1
            log.warning("key %r seq %d: a different input than the journaled one; its later records are dropped",
                        run.key, run.seq)
    first = with_event_id(InputEvent(run.input), input_event_id(context.digest_of_key, run.seq))
    if journal is not None:  # the key's accepted order, before anything the run does (DESIGN §11)
        journal.write(journal_key(run.key_group, run.seq, first.id, ACCEPTED_ACTION, context.digest_of_key),
                      RecordKind.ACCEPTED, AcceptedRecord(run.seq, context.input_digest, run.event_time),
                      what=f"the accepted record of input {run.seq}")
    before = copy.deepcopy(memory) if replay is not None else None
    error = None
    try:
        outputs = _run_events(context, _Scope(agent, (agent.name,)), first, state, stats)
    except Exception as exc:
        if replay is None or isinstance(exc, RunCancelled):
            raise
        # A replay reports a failed run (an unhandled CallBlocked, the new code's bug) and goes on: the input
        # is done with, its memory as before it, no output.
        log.warning("replay: key %r seq %d failed: %s: %s", run.key, run.seq, type(exc).__name__, exc)
        outputs, error = [], f"{type(exc).__name__}: {exc}"
    if history is not None:
        history.drop_through_seq(run.seq)
    if journal is not None:
        journal.acknowledge()  # outputs leave only after their records are acknowledged
    return RunResult(run.seq, state.data if error is None else before, outputs, stats, list(context.calls),
                     list(context.blocked), context.input_digest, error)


@dataclass(frozen=True)
class _Run:
    """What every action of one run shares."""

    run: RunInput
    history: KeyHistory | None
    journal: RunJournal | None
    fingerprint_policy: FingerprintPolicy
    cancelled: Callable[[], bool]
    digest_of_key: str
    input_digest: str
    child_pool: ChildCallPool | None
    replay: ReplayCalls | None = None
    calls: list[CallRecord] = field(default_factory=list)  # appended from child threads: list.append is atomic
    blocked: list[BlockedCall] = field(default_factory=list)


@dataclass(frozen=True)
class _Scope:
    """One agent's part of a run: the top-level agent, or a sub-agent called by an action.

    A sub-agent's records carry the order of the parent action that called it (they belong to that
    action's step in the key's history) and its actions are journaled as ``<path>/<action>``.
    """

    agent: Agent
    path: tuple[str, ...]  # agent names from the top-level agent down to this one
    parent_order: int | None = None
    deadline: float | None = None
    timeout_s: float | None = None

    @property
    def is_child(self) -> bool:
        return self.parent_order is not None

    def action_name(self, spec: ActionSpec) -> str:
        return "/".join((*self.path[1:], spec.name)) if self.is_child else spec.name

    def check(self, context: _Run, before: str) -> None:
        """Stop at this boundary if the operator is closing or the sub-agent call ran out of time."""
        if context.cancelled():
            raise RunCancelled(f"run of key {context.run.key!r} seq {context.run.seq} stopped before {before}: "
                               "the operator is closing")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise SubAgentTimeoutError(f"sub-agent call {' -> '.join(self.path)} did not finish within "
                                       f"{self.timeout_s} s (stopped before {before})")


def _run_events(context: _Run, scope: _Scope, first: Event, state: Memory, stats: RunStats) -> list[OutputEvent]:
    """Run every action ``first`` triggers, and the actions of the events they send, until none is pending."""
    run, history = context.run, context.history
    tasks: deque[tuple[Event, ActionSpec]] = deque(_deliveries(first, scope.agent.actions_for(first)))
    outputs: list[OutputEvent] = []
    order = 0
    while tasks:
        event, spec = tasks.popleft()
        action = scope.action_name(spec)
        scope.check(context, f"action {action}")
        action_order = scope.parent_order if scope.is_child else order
        position = RunPosition(run.seq, action_order)
        completion = history.completion(run.seq, event.id, action) if history is not None else None
        if completion is not None and completion.fingerprint != spec.fingerprint:
            completion = _check_fingerprint(completion, spec, run, context.fingerprint_policy, stats)
        if completion is not None:
            state.apply(completion.memory_updates)
            state.take_updates()
            sent = [private_copy(sent_event) for sent_event in completion.sent_events]  # as executed ones are
            stats.actions_reused += 1
            # The run's calls include those of reused actions: a capture of this run must hold every call
            # a replay may be asked to serve as recorded.
            context.calls.extend(call for call in history.recorded_calls(run.seq, event.id, action)
                                 if call is not None and call.outcome is not CallOutcome.STARTED)
        else:
            recorded: list[CallRecord | None] = []
            retried: dict[int, int] = {}
            if history is not None:
                # A sub-agent's records share its parent action's order: only top-level steps can diverge.
                if not scope.is_child and history.has_records_after(position) and history.drop_after(position):
                    stats.divergences += 1
                    log.warning("key %r seq %d: action %s has no journaled result but later records exist; "
                                "the key's history diverged and its later records are dropped",
                                run.key, run.seq, action)
                recorded = history.recorded_calls(run.seq, event.id, action)
                retried = history.retried_positions(run.seq, event.id, action)
            sent = _execute_action(context, scope, spec, action, event, action_order, state, recorded, retried,
                                   stats)
            stats.actions_executed += 1
        for emitted in sent:
            if isinstance(emitted, OutputEvent):
                outputs.append(emitted)
                continue
            handlers = scope.agent.actions_for(emitted)
            if not handlers:
                raise AgentDefinitionError(
                    f"action {spec.name} of agent {scope.agent.name} sent a {type(emitted).__name__} event, but no "
                    f"action handles {type(emitted).__name__}: add @action({type(emitted).__name__}) or send an "
                    "OutputEvent"
                )
            tasks.extend(_deliveries(emitted, handlers))
        order += 1
    return outputs


def _deliveries(event: Event, handlers: list[ActionSpec]) -> list[tuple[Event, ActionSpec]]:
    """(event, handler) tasks; each handler gets its own copy when several handle one event: what one action
    changes in its event must not reach another (a reused action's changes would not)."""
    if len(handlers) == 1:
        return [(event, handlers[0])]
    return [(private_copy(event), handler) for handler in handlers]


def _check_fingerprint(completion: CompletionRecord, spec: ActionSpec, run: RunInput,
                       policy: FingerprintPolicy, stats: RunStats) -> CompletionRecord | None:
    stats.fingerprint_mismatches += 1
    message = (f"key {run.key!r} seq {run.seq}: the journaled result of action {completion.action} was written by "
               f"other action code (fingerprint {completion.fingerprint}, now {spec.fingerprint})")
    if policy is FingerprintPolicy.FAIL:
        raise FingerprintMismatchError(message + "; the fingerprint policy is 'fail'")
    if policy is FingerprintPolicy.RE_EXECUTE:
        log.warning("%s; re-executing it (fingerprint policy 're-execute')", message)
        return None
    log.warning("%s; reusing it (fingerprint policy 'reuse')", message)
    return completion


def _never() -> bool:
    return False


def _is_crash(error: BaseException | None) -> bool:
    """An error that ends the attempt rather than being the call's outcome: the operator closing, or a
    non-``Exception`` (``SystemExit``, ``KeyboardInterrupt``, a test's simulated crash)."""
    return error is not None and (isinstance(error, RunCancelled) or not isinstance(error, Exception))


#: Where a sub-agent's memory lives under its caller's key: ``_sub_agents.<name>``.
SUB_AGENT_MEMORY = "_sub_agents"


@dataclass(frozen=True)
class _ChildCall:
    """One sub-agent call of an action: its place among the action's calls, and what the journal holds."""

    child: Agent
    input: Any
    position: int
    args_digest: str
    record: CallRecord | None  # the journaled call at this position, if it matches

    @property
    def finished(self) -> bool:
        """Whether the journal holds its result (returned or raised): the child need not run."""
        return self.record is not None and self.record.outcome is not CallOutcome.STARTED


def _child_resource(child: Agent) -> str:
    """The resource name a sub-agent call is journaled under."""
    return f"agent:{child.name}"


def _child_memory_path(child: Agent) -> str:
    """Where a sub-agent's memory lives under its caller's key."""
    return f"{SUB_AGENT_MEMORY}.{child.name}"


def _execute_action(context: _Run, scope: _Scope, spec: ActionSpec, action: str, event: Event, order: int,
                    state: Memory, recorded: list[CallRecord | None], retried: dict[int, int],
                    stats: RunStats) -> list[Event]:
    run, journal, digest_of_key = context.run, context.journal, context.digest_of_key
    sent: list[Event] = []
    record_key = journal_key(run.key_group, run.seq, event.id, action, digest_of_key)
    next_position = 0
    steps: list[_CallStep] = []  # each ctx.call / ctx.call_agents of this action execution, in order

    def send(new_event: Event) -> None:
        sent.append(with_event_id(new_event, event_id(digest_of_key, run.seq, event.id, action, len(sent))))

    def take_recorded(position: int, resource_name: str, args_digest: str) -> CallRecord | None:
        nonlocal recorded
        record = recorded[position] if position < len(recorded) else None
        if record is not None and record.identity() != (position, resource_name, args_digest):
            log.warning("key %r seq %d action %s: call %d differs from the journaled one (%s); "
                        "its journaled calls from here on are not reused", run.key, run.seq, action,
                        position, record.resource)
            recorded = recorded[:position]
            record = None
        return record

    def call(resource_name: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal next_position
        position = next_position
        next_position += 1
        try:
            result = make_call(position, resource_name, args, kwargs)
        except Exception:
            steps.append(_CallStep(raised=(position,)))
            raise
        steps.append(_CallStep(returned=(position,)))
        return result

    def make_call(position: int, resource_name: str, args: tuple, kwargs: dict) -> Any:
        resource = scope.agent.resource(resource_name)
        args_digest = digest_value((args, kwargs))
        record = take_recorded(position, resource_name, args_digest)
        if record is not None:
            if record.outcome is not CallOutcome.STARTED:
                stats.calls_reused += 1
                context.calls.append(record)
                return _recorded_outcome(record)
            stats.calls_in_doubt += 1
            if resource.in_doubt is InDoubtPolicy.FAIL:
                raise CallInDoubtError(
                    f"key {run.key!r} seq {run.seq} action {action}: call {position} to {resource_name!r} "
                    "started before a failure and never reported back; its in_doubt policy is 'fail'"
                )
            if resource.in_doubt is InDoubtPolicy.ASSUME_DONE:
                log.warning("call %d to %r in doubt: assumed done (returns None)", position, resource_name)
                write_call(position, resource_name, args_digest, CallOutcome.RETURNED, None)
                return None
            log.warning("call %d to %r in doubt: made again (in_doubt policy 'rerun')", position, resource_name)

        scope.check(context, f"call {position} to {resource_name!r} in action {action}")
        if context.replay is not None:
            served = replayed_call(position, resource_name, resource, args_digest, args, kwargs)
            if served is not None:
                return _recorded_outcome(served)
        if journal is not None and resource.tracks_start:
            write_call(position, resource_name, args_digest, CallOutcome.STARTED, None, must_ack=True)
        note_retry(position, resource_name)
        prefix = context.replay.call_id_prefix if context.replay is not None else ""
        # A retry after a failure gets an id of its own: a service may have stored the failure under the old one.
        request = (record_key.decode(), context.input_digest, resource_name, args_digest, retried.get(position, 0))
        token = _CALL_ID.set(prefix + call_id(scope.path[0], action, run.seq, position, request))
        # A copy: what the resource does to its arguments must not reach the action's objects (memory, events),
        # since a reused call could not do it again.
        call_args, call_kwargs = private_copy((args, kwargs))
        try:
            result = resource.invoke(*call_args, **call_kwargs)
        except CallTimeoutError:
            # It may still take effect: not an outcome to reuse. The next attempt finds the call in doubt (an
            # external resource's 'started' record) and its in_doubt policy decides, or simply makes it again.
            stats.calls_in_doubt += 1
            raise
        except Exception as exc:  # noqa: BLE001 - journaled, then re-raised as the same type
            stats.calls_executed += 1
            write_call(position, resource_name, args_digest, CallOutcome.RAISED, encode_exception(exc))
            raise
        finally:
            _CALL_ID.reset(token)
        stats.calls_executed += 1
        write_call(position, resource_name, args_digest, CallOutcome.RETURNED, result)
        return private_copy(result)  # the journaled result stays as it was, whatever the action does to its copy

    def note_retry(position: int, resource_name: str) -> None:
        if position in retried:
            stats.calls_retried_after_failure += 1
            log.info("key %r seq %d action %s: call %d to %r failed its action in an earlier attempt; made again",
                     run.key, run.seq, action, position, resource_name)

    def replayed_call(position: int, resource_name: str, resource, args_digest: str, args: tuple,
                      kwargs: dict) -> CallRecord | None:
        """A replay's policy for this call: ``None`` to make it (live), the production record to serve
        (recorded), else raise ``CallBlocked``."""
        policy = policy_for(resource_name, resource, context.replay.policies)
        if policy is CallPolicy.LIVE:
            return None
        if policy is CallPolicy.RECORDED:
            production = context.replay.recorded.get((event.id, action, position))
            if (production is not None and production.outcome is not CallOutcome.STARTED
                    and production.identity() == (position, resource_name, args_digest)):
                stats.calls_recorded += 1
                write_call(position, resource_name, args_digest, production.outcome, production.result)
                return production
        arguments = _describe_arguments(args, kwargs)
        context.blocked.append(BlockedCall(event.id, action, position, resource_name, arguments))
        stats.calls_blocked += 1
        why = "its policy is 'blocked'" if policy is CallPolicy.BLOCKED else "production made no such call"
        raise CallBlocked(f"replay: call {position} to {resource_name!r} in action {action} (key {run.key!r} seq "
                          f"{run.seq}) was not made: {why}; arguments {arguments}", resource_name, arguments)

    def call_agents(calls: list[tuple[Agent | str, Any]], timeout_s: float | None) -> list[list[Any]]:
        nonlocal next_position
        planned: list[_ChildCall] = []
        for agent_or_name, child_input in calls:
            child = scope.agent.sub_agent(agent_or_name)
            if child.name in scope.path:
                raise SubAgentCycleError(f"sub-agent call cycle: {' -> '.join((*scope.path, child.name))}; an agent "
                                         "cannot call an agent that is already calling it")
            position = next_position
            next_position += 1
            args_digest = digest_value(child_input)
            planned.append(_ChildCall(child, child_input, position, args_digest,
                                      take_recorded(position, _child_resource(child), args_digest)))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if scope.deadline is not None:
            deadline = scope.deadline if deadline is None else min(deadline, scope.deadline)

        def child_run(call: _ChildCall, child_memory: dict):
            child_scope = _Scope(call.child, (*scope.path, call.child.name), parent_order=order, deadline=deadline,
                                 timeout_s=timeout_s)
            # The child's own copy of its input: what the child does to it must not reach the parent's objects.
            first = with_event_id(InputEvent(private_copy(call.input)), child_input_event_id(
                digest_of_key, run.seq, event.id, action, call.position, call.child.name, call.args_digest))
            child_state, child_stats = Memory(child_memory), RunStats()
            outputs = _run_events(context, child_scope, first, child_state, child_stats)
            if not outputs:
                raise NoSubAgentOutputError(
                    f"sub-agent call {' -> '.join(child_scope.path)} (key {run.key!r} seq {run.seq}) finished "
                    "without an OutputEvent: the child must send at least one"
                )
            return [output.output for output in outputs], child_state.data, child_stats

        to_run = [call for call in planned if not call.finished]
        for call in to_run:
            note_retry(call.position, _child_resource(call.child))
        thunks = [functools.partial(child_run, call, copy.deepcopy(state.get(_child_memory_path(call.child), {})))
                  for call in to_run]
        if len(thunks) > 1 and context.child_pool is not None:
            outcomes = context.child_pool.run_all(thunks)
        else:
            outcomes = run_inline(thunks)
        # The operator closing, or a non-Exception (SystemExit, a test's simulated crash), is not an outcome
        # of the child: nothing is journaled for the call, and the next attempt reuses what the child did.
        crash = next((o.error for o in outcomes if _is_crash(o.error)), None)
        if crash is not None:
            raise crash
        executed = {call.position: outcome for call, outcome in zip(to_run, outcomes, strict=True)}

        results: list[list[Any]] = []
        failure: BaseException | None = None
        failed: list[int] = []
        for call in planned:
            outcome = executed.get(call.position)
            if outcome is None:  # a finished child call: its recorded result, without running the child
                stats.child_calls_reused += 1
                log.info("key %r seq %d: sub-agent call %s reused from the journal (not run again)", run.key,
                         run.seq, " -> ".join((*scope.path, call.child.name)))
                raised = call.record.outcome is CallOutcome.RAISED
                value, error = (None, decode_exception(call.record.result)) if raised else (call.record.result, None)
            elif outcome.error is not None:
                stats.child_calls_executed += 1
                value, error = None, outcome.error
                write_call(call.position, _child_resource(call.child), call.args_digest, CallOutcome.RAISED,
                           encode_exception(outcome.error))
            else:
                stats.child_calls_executed += 1
                outputs, child_memory, child_stats = outcome.value
                stats.add(child_stats)
                value, error = (outputs, child_memory), None
                write_call(call.position, _child_resource(call.child), call.args_digest, CallOutcome.RETURNED, value)
            if error is not None:
                failure = failure or error
                failed.append(call.position)
                results.append([])
                continue
            outputs, child_memory = value
            state.set(_child_memory_path(call.child), copy.deepcopy(child_memory))
            results.append(private_copy(outputs))
        steps.append(_CallStep(raised=tuple(failed),
                               returned=tuple(c.position for c in planned if c.position not in failed)))
        if failure is not None:
            raise failure
        return results

    def write_call(position: int, resource_name: str, args_digest: str, outcome: CallOutcome, result: Any,
                   must_ack: bool = False) -> None:
        record = CallRecord(run.seq, order, event.id, action, position, resource_name, args_digest, outcome, result,
                            context.input_digest)
        if outcome is not CallOutcome.STARTED:
            context.calls.append(record)
        if journal is None:
            return
        journal.write(
            record_key, RecordKind.CALL, record,
            fingerprint=spec.fingerprint, must_ack=must_ack,
            what=f"the result of call {position} to {resource_name!r} in action {action}",
        )

    state.take_updates()
    try:
        spec.function(event, RunnerContext(key=run.key, seq=run.seq, memory=state, send=send, call=call,
                                           call_agents=call_agents, event_time=run.event_time))
    except Exception as exc:
        if journal is not None and not isinstance(exc, (RunCancelled, JournalClosedError)):
            _journal_action_failed(journal, record_key, spec, ActionFailedRecord(
                run.seq, order, event.id, action, f"{type(exc).__name__}: {exc}"[:500], context.input_digest,
                _calls_to_retry(steps)))
        raise
    updates = state.take_updates()
    # The events as sent; later changes to objects they shared with memory or each other must not reach them
    # (a reused action's events come from the journal, as they were when it ended).
    sent[:] = [private_copy(sent_event) for sent_event in sent]  # one by one: siblings share nothing either
    if journal is not None:
        completion = CompletionRecord(run.seq, order, event.id, action, spec.fingerprint, updates, sent,
                                      next_position, context.input_digest)
        try:
            journal.write(record_key, RecordKind.COMPLETION, completion, fingerprint=spec.fingerprint,
                          what=f"the result of action {action}")
        except NotPicklableError as exc:
            raise explain_unpicklable(action, updates, sent) or exc from exc.__cause__
        except JournalRecordTooLargeError as exc:
            raise JournalRecordTooLargeError(f"{exc} {_largest_parts(updates, sent)}") from None
    return sent


def _largest_parts(updates: list[MemoryUpdate], events: list[Event]) -> str:
    """Which memory paths and events make an action's result large, largest first (for the error message)."""
    sizes = [(len(cloudpickle.dumps(u.value)), f"memory path {u.path!r}") for u in updates]
    sizes += [(len(cloudpickle.dumps(e)), f"a sent {type(e).__name__}") for e in events]
    shown = ", ".join(f"{what} {size:,} bytes" for size, what in sorted(sizes, reverse=True)[:3])
    return (f"Largest parts: {shown}. Keep large values out of memory and events (store them elsewhere and keep a "
            "reference), or raise message.max.bytes in the kafka settings together with the journal topic's "
            "max.message.bytes.")


@dataclass(frozen=True)
class _CallStep:
    """One ``ctx.call`` (one position) or ``ctx.call_agents`` (one position per child) and how its calls ended."""

    raised: tuple[int, ...] = ()
    returned: tuple[int, ...] = ()


def _calls_to_retry(steps: list[_CallStep]) -> list[int]:
    """The failed calls the next attempt makes again, after an exception left the action.

    Those of the action's last steps, back to the last step that had a call return: making them again can
    change the action's path only after every call that succeeded, so no journaled success is ever out of
    place (and repeated). A failure the action handled and got past (a retry loop that then succeeded, a
    get-or-create) is reused as it was; a retry loop that gave up is made again; in a fan-out every failed
    child is run again at once.
    """
    positions: list[int] = []
    for step in reversed(steps):
        positions += step.raised
        if step.returned:
            break
    return sorted(positions)


def _journal_action_failed(journal: RunJournal, record_key: bytes, spec: ActionSpec,
                           record: ActionFailedRecord) -> None:
    """Journal, acknowledged, that an exception left the action: the next attempt makes its failed calls again.

    If the journal cannot take it, the action's exception still fails the task (it says what went wrong).
    """
    try:
        journal.write(record_key, RecordKind.ACTION_FAILED, record, fingerprint=spec.fingerprint, must_ack=True,
                      what=f"the failure of action {record.action}")
    except Exception as error:  # noqa: BLE001 - never hide the action's own exception
        log.warning("seq %d action %s: could not journal its failure (%s); its failed calls may be reused",
                    record.seq, record.action, error)


def call_id(agent: str, action: str, seq: int, position: int, request: tuple) -> str:
    """The id of a logical call, for a service's idempotency key (``current_call_id()``).

    A readable head (agent, action, seq, position) and a hash of what identifies the request: the journal
    key of the action execution (key, seq, event), the input's digest, the resource and the arguments'
    digest. Attempts of the same request get the same id; a different input at the same seq, or other
    arguments, get another, so a service never answers one request with another's result.
    """
    digest = hashlib.sha256(repr((agent, action, seq, position, request)).encode("utf-8", "surrogatepass"))
    head = re.sub(r"[^A-Za-z0-9_.:/-]", "_", f"{agent}:{action}:{seq}:{position}")
    return f"{head}:{digest.hexdigest()[:24]}"


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


def _recorded_outcome(record: CallRecord) -> Any:
    """What a finished recorded call gives the action again: its result, or its exception raised."""
    if record.outcome is CallOutcome.RAISED:
        raise decode_exception(record.result)
    return private_copy(record.result)


def _describe_arguments(args: tuple, kwargs: dict, limit: int = 500) -> str:
    """The arguments of a call as people read them in a report (shortened)."""
    shown = ", ".join([*(repr(a) for a in args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."
