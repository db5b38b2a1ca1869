"""Running one input of one key: the FIFO of (event, action) tasks, with journaling and reuse.

For input ``seq`` of a key, :func:`execute_run` journals the input as *accepted* (the key's order, before
anything the run does), builds the ``InputEvent`` (its id derived from key and seq) and runs every
triggered action in order until no event is pending (:func:`run_events`). For each action it first asks
the key's recovered history (if the job was restored):

* a **completion** is reused: the action is skipped, its memory updates re-applied and its sent
  events re-sent with their recorded ids;
* **calls without a completion** (the action was cut short) are served in order to the re-executed
  action (:mod:`.calls`); a call whose identity (position, resource, arguments) differs ends the reuse
  for the rest;
* otherwise the action runs (:mod:`.action`), each ``ctx.call`` is journaled as it completes, then the
  completion.

A history whose records go on past an action that has none diverged (another path was taken): its later
records are dropped. Another input than the journaled one at this seq drops everything from the seq on.

An action that calls ``ctx.wait_for`` with no decision yet ends the run as *waiting*
(:attr:`RunResult.waiting`): nothing is applied, and the run's records so far travel with the result. Run
again with those records as its history and the decision in :attr:`RunInput.decisions`, it reuses every
action and call before the wait, and the waiting action gets its decision (:func:`resume_history`).

When the key's later inputs run while a run waits (``later_inputs_while_waiting="run"``), a resumed run journals a
*resumed* record (where it resumed among the key's inputs: :attr:`RunInput.resumed_after`) and hands back every
memory update it made (:attr:`RunResult.memory_updates`), which the operator writes over the key's memory. After a
restore, a run the journal recorded resuming from a wait later parks there again (``KeyHistory.parked_first``,
``ActionCalls.wait_for``), taking what it journaled after that resume with it, so it resumes in the recorded order;
the later inputs' records are then no divergence (``KeyHistory.parked_in``).
"""

from __future__ import annotations

import copy
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from flink_agents_replay.api.agent import ActionSpec, Agent, Event, InputEvent, OutputEvent, with_event_id
from flink_agents_replay.api.memory import Memory, private_copy
from flink_agents_replay.core.errors import (
    AgentDefinitionError,
    FingerprintMismatchError,
    JournalError,
    ToolCallDeniedError,
    WaitTimedOutError,
)
from flink_agents_replay.engine.action import execute_action
from flink_agents_replay.engine.calls import ActionCalls
from flink_agents_replay.engine.child_pool import ChildCallPool
from flink_agents_replay.engine.context import (
    ActionSite,
    FingerprintPolicy,
    RunCancelled,
    RunContext,
    RunInput,
    RunJournal,
    RunStats,
    Scope,
    WaitPending,
)
from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.engine.gate import ALWAYS_LIVE, CallGate
from flink_agents_replay.engine.trace import ActionHow, CallHow, RunTrace
from flink_agents_replay.storage.journal.history import KeyHistory
from flink_agents_replay.storage.records.journal import (
    ACCEPTED_ACTION,
    RESUMED_ACTION,
    AcceptedRecord,
    CallOutcome,
    CallRecord,
    CompletionRecord,
    MemoryUpdate,
    RecordKind,
    ResumedRecord,
    RunPosition,
    input_event_id,
    journal_key,
    key_digest,
)
from flink_agents_replay.storage.records.parked import WaitingRun

__all__ = ["RunResult", "WaitingRun", "execute_run", "resume_history", "run_events"]

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a finished run hands back to the operator."""

    seq: int
    memory: dict  # the key's memory after the run (of a waiting run: not to be applied)
    outputs: list[OutputEvent]
    stats: RunStats = field(default_factory=RunStats)
    calls: list[CallRecord] = field(default_factory=list)  # every call's outcome, made or reused (for capture)
    blocked: list[object] = field(default_factory=list)  # the call gate's reports of the calls it blocked
    input_digest: str = ""
    error: str | None = None  # with report_failures: the exception that ended the run (memory, outputs untouched)
    waiting: WaitingRun | None = None  # the run stopped at a wait: nothing of it is applied (memory, outputs)
    #: Every memory update of the run, in order (what a run resumed after later inputs ran writes over the key's
    #: memory as it is then).
    memory_updates: list[MemoryUpdate] = field(default_factory=list)
    trace: RunTrace | None = None  # what this execution did (``execute_run(trace=True)``)


def resume_history(waiting: WaitingRun, recovered: KeyHistory | None = None) -> KeyHistory:
    """The history a waiting run resumes with: its own records (a resumed run then reuses all but the wait),
    and, after a failure while it ran resumed, what ``recovered`` (the key's recovered history) holds of its
    seq: the decision it journaled, and the calls it made after it."""
    history = KeyHistory()
    for record in waiting.records:
        if isinstance(record, CompletionRecord):
            history.add_completion(record)
        else:
            history.add_call(record)
    if waiting.retried:
        history.retried[(waiting.seq, waiting.event_id, waiting.action)] = dict(waiting.retried)
    if recovered is not None:
        taken = recovered.take_seq(waiting.seq, waiting.wait.wait_id)  # the resumed run's now
        history.merge_seq(taken, waiting.seq)
        history.resumes = taken.resumes
        recovered.drop_through_seq(waiting.seq)  # the key's recovered history may end
    return history


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
    gate: CallGate | None = None,
    report_failures: bool = False,
    acknowledge: bool = True,
    trace: bool = False,
    trace_content: bool = False,
) -> RunResult:
    """Run ``run.input`` through ``agent`` on a private ``memory`` dict; return outputs and new memory.

    ``cancelled`` is asked before every action and call: when it says yes the run raises
    :class:`RunCancelled` (what it already journaled is reused by the next attempt). ``child_pool`` runs
    the sub-agent calls of ``ctx.call_agents`` concurrently (without it they run one after another).
    ``gate`` decides whether each call is made for real (:mod:`.gate`; default: always). With
    ``report_failures`` an exception from the agent ends the run with ``RunResult.error`` set, the memory as
    it was and no outputs, instead of propagating (a replay reports failed runs in its diff).

    With ``acknowledge`` the run waits for its records before it returns (its outputs may then leave). The
    operator passes ``False``: the run's slot is free at once, and it releases the outputs when
    :meth:`RunJournal.outputs_may_leave` says so (group commit, :mod:`flink_agents_replay.storage.journal.writer`).

    With ``trace`` the result's :attr:`RunResult.trace` notes what this execution did (:mod:`.trace`), with
    ``trace_content`` the calls' arguments too.
    """
    context = RunContext(run=run, history=history, journal=journal, fingerprint_policy=fingerprint_policy,
                         cancelled=cancelled or _never, digest_of_key=key_digest(run.key),
                         input_digest=digest_value(run.input), child_pool=child_pool, gate=gate or ALWAYS_LIVE,
                         run_events=run_events,
                         trace=RunTrace(content=trace_content, traceparent=run.traceparent) if trace else None)
    stats = RunStats()
    state = Memory(memory)
    _drop_if_another_input(context, stats)
    first = with_event_id(InputEvent(run.input), input_event_id(context.digest_of_key, run.seq))
    # The key's accepted order, before anything the run does (docs/design.md, section 8); a resumed run's input
    # was accepted when it first ran.
    if journal is not None and not run.resuming:
        journal.write(journal_key(run.key_group, run.seq, first.id, ACCEPTED_ACTION, context.digest_of_key),
                      RecordKind.ACCEPTED, AcceptedRecord(run.seq, context.input_digest, run.event_time),
                      what=f"the accepted record of input {run.seq}")
    elif journal is not None and run.resumed_after is not None:
        journal.write(journal_key(run.key_group, run.seq, first.id, RESUMED_ACTION, context.digest_of_key),
                      RecordKind.RESUMED,
                      ResumedRecord(run.seq, run.resumed_after, run.resumed_wait or "", context.input_digest),
                      what=f"the resumed record of input {run.seq}")
    # A run with a decision (resumed, or reusing a journaled one) may end on its wait's timeout or denial: then its
    # memory stays as it was (see _ends_the_run).
    decided = run.resuming or (history is not None and history.has_decision(run.seq))
    before = copy.deepcopy(memory) if report_failures or decided else None
    error = None
    try:
        outputs = run_events(context, Scope(agent, (agent.name,)), first, state, stats)
    except WaitPending as pending:
        return _waiting(context, pending, memory, stats, acknowledge)
    except Exception as exc:
        if not (report_failures or (decided and _ends_the_run(exc))) or isinstance(exc, RunCancelled):
            _settle(journal)
            raise
        # A reported failure (a replay: an unhandled CallBlocked, the new code's bug) ends the input: its
        # memory as before it, no output.
        log.warning("key %r seq %d failed (reported): %s: %s", run.key, run.seq, type(exc).__name__, exc)
        outputs, error = [], f"{type(exc).__name__}: {exc}"
    if history is not None:
        history.drop_through_seq(run.seq)
    if journal is not None and acknowledge:
        journal.acknowledge()  # outputs leave only after their records are acknowledged
    return RunResult(run.seq, state.data if error is None else before, outputs, stats, list(context.calls),
                     list(context.blocked), context.input_digest, error,
                     memory_updates=state.updates_taken if error is None else [], trace=_ended(context.trace))


def _waiting(context: RunContext, pending: WaitPending, memory: dict, stats: RunStats,
             acknowledge: bool) -> RunResult:
    """The result of a run stopped at a wait: its records so far, nothing to apply."""
    run, site = context.run, pending.site
    records: list[CallRecord | CompletionRecord] = [*context.completions, *context.calls]
    history = context.history
    if history is not None:  # the records travel with the result now
        if history.resumed_later(run.seq, pending.wait.wait_id):  # and what it journaled after a resume to come
            records += [record for record in history.take_records(run.seq) if record not in records]
        history.drop_through_seq(run.seq)
    if context.journal is not None and acknowledge:
        context.journal.acknowledge()
    waiting = WaitingRun(pending.wait, run.seq, site.action, site.event.id, site.order, records, pending.retried)
    return RunResult(run.seq, memory, [], stats, list(context.calls), list(context.blocked), context.input_digest,
                     waiting=waiting, trace=_ended(context.trace))


def _ended(trace: RunTrace | None) -> RunTrace | None:
    return None if trace is None else trace.ended()


def _ends_the_run(exc: Exception) -> bool:
    """A wait's timeout (no ``on_timeout``) or a denied tool call left the action unhandled: the run ends, memory as
    before it, no output, instead of failing the task. The journaled decision would raise it again in every
    attempt (a resumed one, or one restored from a checkpoint taken before the run parked): failing would
    restart the job forever."""
    return isinstance(exc, (WaitTimedOutError, ToolCallDeniedError))


def _settle(journal: RunJournal | None) -> None:
    """Before a run stops on an exception (a failure, or the operator closing): wait for the records it wrote.

    Records queued since the last acknowledgement are the only trace of calls that were made; the next attempt
    must find them (the store's close delivers for a few seconds only). If they cannot be acknowledged (the
    broker is away), the run's own exception is the one to report."""
    if journal is None:
        return
    try:
        journal.acknowledge()
    except JournalError as exc:
        log.warning("a stopping run's journal records were not acknowledged: %s", exc)


def _drop_if_another_input(context: RunContext, stats: RunStats) -> None:
    """Another input than the journaled one holds this seq: nothing from here on in the history is ours."""
    run, history = context.run, context.history
    if history is not None and not history.input_matches(run.seq, context.input_digest):
        if history.drop_after(RunPosition(run.seq, -1)):
            stats.divergences += 1
            log.warning("key %r seq %d: a different input than the journaled one; its later records are dropped",
                        run.key, run.seq)


def run_events(context: RunContext, scope: Scope, first: Event, state: Memory, stats: RunStats) -> list[OutputEvent]:
    """Run every action ``first`` triggers, and the actions of the events they send, until none is pending."""
    run = context.run
    tasks: deque[tuple[Event, ActionSpec]] = deque(_deliveries(first, scope.agent.actions_for(first)))
    outputs: list[OutputEvent] = []
    # Events the recorded run had too: the journaled input, and what reused completions sent.
    recorded_events = {first.id} if _input_recorded(context, scope) else set()
    order = 0
    while tasks:
        event, spec = tasks.popleft()
        action = scope.action_name(spec)
        scope.check(context, f"action {action}")
        site = ActionSite(spec=spec, action=action, event=event,
                          order=scope.parent_order if scope.is_child else order,
                          record_key=journal_key(run.key_group, run.seq, event.id, action, context.digest_of_key))
        started_ns = time.time_ns()
        how = ActionHow.REUSED
        try:
            sent = _reused(context, scope, site, state, stats)
            if sent is not None:
                recorded_events.update(emitted.id for emitted in sent)
            else:
                how = ActionHow.EXECUTED
                sent = _executed(context, scope, site, state, stats, site.event.id in recorded_events)
        except Exception as exc:
            # The type only: the message may hold a prompt or a reply (a validation error quotes its input).
            _trace_action(context, scope, site, ActionHow.FAILED, started_ns, type(exc).__qualname__)
            raise
        _trace_action(context, scope, site, how, started_ns)
        for emitted in sent:
            if isinstance(emitted, OutputEvent):
                outputs.append(emitted)
            else:
                tasks.extend(_deliveries(emitted, _handlers(scope, spec, emitted)))
        order += 1
    return outputs


def _trace_action(context: RunContext, scope: Scope, site: ActionSite, how: ActionHow, started_ns: int,
                  error: str | None = None) -> None:
    if context.trace is not None:
        context.trace.action(site.event.id, site.action, site.order, scope.path, how, started_ns, error)


def _reused(context: RunContext, scope: Scope, site: ActionSite, state: Memory,
            stats: RunStats) -> list[Event] | None:
    """The journaled completion of this action applied (memory) and its events, or ``None`` to execute it."""
    run, history = context.run, context.history
    if history is None:
        return None
    completion = history.completion(run.seq, site.event.id, site.action)
    if completion is not None and history.parked_first(run.seq, site.event.id, site.action):
        return None  # it parked at a wait in here first and resumed later: it parks again (ActionCalls.wait_for)
    if completion is not None and not site.spec.wrote(completion.fingerprint):
        completion = _check_fingerprint(completion, site.spec, run, context.fingerprint_policy, stats)
    if completion is None:
        return None
    state.apply(completion.memory_updates)
    state.take_updates()
    context.completions.append(completion)
    sent = [private_copy(sent_event) for sent_event in completion.sent_events]  # as executed ones are
    stats.actions_reused += 1
    # The run's calls include those of reused actions: a capture of this run must hold every call a replay
    # may be asked to serve as recorded.
    reused = [call for call in history.recorded_calls(run.seq, site.event.id, site.action)
              if call is not None and call.outcome is not CallOutcome.STARTED]
    context.calls.extend(reused)
    if context.trace is not None:
        calls = ActionCalls(context=context, scope=scope, site=site, stats=stats,
                            retried=history.retried_positions(run.seq, site.event.id, site.action))
        for call in reused:
            calls.trace_call(call, CallHow.REUSED)
    return sent


def _input_recorded(context: RunContext, scope: Scope) -> bool:
    history = context.history
    return not scope.is_child and history is not None and history.recorded_input(context.run.seq) is not None


def _executed(context: RunContext, scope: Scope, site: ActionSite, state: Memory, stats: RunStats,
              under_recorded_event: bool) -> list[Event]:
    """Execute the action, with the calls an earlier attempt journaled for it; return the events it sent."""
    run, history = context.run, context.history
    recorded: list[CallRecord | None] = []
    retried: dict[int, int] = {}
    if history is not None:
        recorded = history.recorded_calls(run.seq, site.event.id, site.action)
        retried = history.retried_positions(run.seq, site.event.id, site.action)
        # A sub-agent's records share its parent action's order: only top-level steps can diverge. A completion
        # the fingerprint policy set aside is no divergence either: the action ran there, under other code.
        completed = history.completion(run.seq, site.event.id, site.action) is not None
        parked = history.parked_in(run.seq, site.event.id, site.action)  # later inputs may have run meanwhile
        if (not scope.is_child and not completed and not parked
                and not (under_recorded_event and not recorded and not retried)):
            _drop_if_diverged(context, site, stats)
    sent = execute_action(context, scope, site, state, recorded, retried, stats)
    stats.actions_executed += 1
    return sent


def _drop_if_diverged(context: RunContext, site: ActionSite, stats: RunStats) -> None:
    """An action with no completion, yet records after it: the run went another way than the journaled one,
    whose later records (this run's next actions, the key's next inputs) are not ours.

    Not called for an action with no record at all under an event the recorded run had: the code that ran then
    had no such action (a deploy added it, or made it handle this event), since every handler of a recorded
    event ran before anything later was journaled. It runs, and nothing is dropped."""
    run, history = context.run, context.history
    position = RunPosition(run.seq, site.order)
    if history.has_records_after(position) and history.drop_after(position):
        stats.divergences += 1
        log.warning("key %r seq %d: action %s has no journaled result but later records exist; "
                    "the key's history diverged and its later records are dropped", run.key, run.seq, site.action)


def _handlers(scope: Scope, spec: ActionSpec, emitted: Event) -> list[ActionSpec]:
    """The actions that handle a sent event; an event no action handles is a definition error."""
    handlers = scope.agent.actions_for(emitted)
    if not handlers:
        name = type(emitted).__name__
        raise AgentDefinitionError(
            f"action {spec.name} of agent {scope.agent.name} sent a {name} event, but no action handles {name}: "
            f"add @action({name}) or send an OutputEvent"
        )
    return handlers


def _deliveries(event: Event, handlers: list[ActionSpec]) -> list[tuple[Event, ActionSpec]]:
    """(event, handler) tasks; each handler gets its own copy when several handle one event: what one action
    changes in its event must not reach another (a reused action's changes would not)."""
    if len(handlers) == 1:
        return [(event, handlers[0])]
    return [(private_copy(event), handler) for handler in handlers]


def _check_fingerprint(completion: CompletionRecord, spec: ActionSpec, run: RunInput,
                       policy: FingerprintPolicy, stats: RunStats) -> CompletionRecord | None:
    """A completion written by other action code: reuse it (with a warning), re-execute, or fail, by policy."""
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

