"""Sub-agent calls: ``ctx.call_agents`` fans an action out to child agents, durably.

Each child call is matched to its action's journaled calls and journaled under the resource name
``agent:<name>``, like a ``ctx.call``: a child whose result (outputs and memory, or the exception it
raised) is journaled is not run again. The others run their own event loop in a :class:`Scope` of their
own, concurrently on the operator's child pool (:mod:`flink_agents_replay.engine.child_pool`), each on a copy of
its memory, which lives under the caller's key at ``_sub_agents.<name>``. A child's records carry its
parent action's step, so a child cut short by a failure finds its own journaled actions and calls again.

A crash inside a child (the operator closing, a killed process) is not the child's outcome: nothing is
journaled for the call, and the next attempt reuses what the child had done. A child that raised is
journaled as raised, and the first such exception is raised into the parent action once every child ended.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.api.agent import Agent, InputEvent, with_event_id
from flink_agents_replay.api.memory import Memory, private_copy
from flink_agents_replay.core.errors import NoSubAgentOutputError, SubAgentCycleError
from flink_agents_replay.engine.calls import ActionCalls, action_call_id
from flink_agents_replay.engine.child_pool import Outcome, run_inline
from flink_agents_replay.engine.context import RunStats, Scope
from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.engine.failures import CallStep, is_crash
from flink_agents_replay.engine.trace import CallHow
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord, child_input_event_id, journal_key
from flink_agents_replay.storage.records.raised import decode_exception, encode_exception

__all__ = ["SUB_AGENT_MEMORY", "call_agents"]

log = logging.getLogger(__name__)

#: Where a sub-agent's memory lives under its caller's key: ``_sub_agents.<name>``.
SUB_AGENT_MEMORY = "_sub_agents"


@dataclass(frozen=True)
class _ChildCall:
    """One sub-agent call of an action: its place among the action's calls, and what the journal holds."""

    child: Agent
    input: Any
    position: int
    args_digest: str
    record: CallRecord | None  # the journaled call it stands for, if any

    @property
    def finished(self) -> bool:
        """Whether the journal holds its result (returned or raised): the child need not run."""
        return self.record is not None and self.record.outcome is not CallOutcome.STARTED

    @property
    def resource(self) -> str:
        """The resource name the call is journaled under."""
        return f"agent:{self.child.name}"

    @property
    def memory_path(self) -> str:
        """Where the child's memory lives under its caller's key."""
        return f"{SUB_AGENT_MEMORY}.{self.child.name}"


def call_agents(calls: ActionCalls, state: Memory, requests: list[tuple[Agent | str, Any]],
                timeout_s: float | None) -> list[list[Any]]:
    """``ctx.call_agents``: each child's outputs, in the order asked; the first failure raised after all ended."""
    planned = [_plan(calls, agent_or_name, child_input) for agent_or_name, child_input in requests]
    to_run = [call for call in planned if not call.finished]
    started_ns = time.time_ns()
    outcomes = _run_children(calls, state, to_run, timeout_s)
    executed = {call.position: outcome for call, outcome in zip(to_run, outcomes, strict=True)}
    results: list[list[Any]] = []
    failure: BaseException | None = None
    failed: list[int] = []
    for call in planned:
        value, error = _settle(calls, call, executed.get(call.position), started_ns)
        if error is not None:
            failure = failure or error
            failed.append(call.position)
            results.append([])
            continue
        outputs, child_memory = value
        state.set(call.memory_path, copy.deepcopy(child_memory))
        results.append(private_copy(outputs))
    calls.steps.append(CallStep(raised=tuple(failed),
                                returned=tuple(c.position for c in planned if c.position not in failed)))
    if failure is not None:
        raise failure
    return results


def _plan(calls: ActionCalls, agent_or_name: Agent | str, child_input: Any) -> _ChildCall:
    """Give the child call its position and find its journaled result."""
    scope = calls.scope
    child = scope.agent.sub_agent(agent_or_name)
    if child.name in scope.path:
        raise SubAgentCycleError(f"sub-agent call cycle: {' -> '.join((*scope.path, child.name))}; an agent "
                                 "cannot call an agent that is already calling it")
    args_digest = digest_value(child_input)
    position, record = calls.match(f"agent:{child.name}", args_digest)
    return _ChildCall(child, child_input, position, args_digest, record)


def _run_children(calls: ActionCalls, state: Memory, to_run: list[_ChildCall],
                  timeout_s: float | None) -> list[Outcome]:
    """Run the unfinished children (concurrently when there are several and a pool); a crash is raised."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if calls.scope.deadline is not None:
        deadline = calls.scope.deadline if deadline is None else min(deadline, calls.scope.deadline)
    for call in to_run:
        calls.note_retry(call.position, call.resource)
    thunks = [functools.partial(_run_child, calls, call, copy.deepcopy(state.get(call.memory_path, {})),
                                deadline, timeout_s) for call in to_run]
    pool = calls.context.child_pool
    outcomes = pool.run_all(thunks) if len(thunks) > 1 and pool is not None else run_inline(thunks)
    # The operator closing, or a non-Exception (SystemExit, a test's simulated crash), is not an outcome
    # of the child: nothing is journaled for the call, and the next attempt reuses what the child did.
    crash = next((o.error for o in outcomes if is_crash(o.error)), None)
    if crash is not None:
        raise crash
    return outcomes


def _run_child(calls: ActionCalls, call: _ChildCall, child_memory: dict, deadline: float | None,
               timeout_s: float | None) -> tuple[list[Any], dict, RunStats]:
    """One child's run: its outputs' values, its memory and its counts."""
    context, site, run = calls.context, calls.site, calls.context.run
    child_scope = Scope(call.child, (*calls.scope.path, call.child.name), parent_order=site.order,
                        deadline=deadline, timeout_s=timeout_s)
    # The child's own copy of its input: what the child does to it must not reach the parent's objects.
    first = with_event_id(InputEvent(private_copy(call.input)), child_input_event_id(
        context.digest_of_key, run.seq, site.event.id, site.action, call.position, call.child.name,
        call.args_digest))
    child_state, child_stats = Memory(child_memory), RunStats()
    outputs = context.run_events(context, child_scope, first, child_state, child_stats)
    if not outputs:
        raise NoSubAgentOutputError(
            f"sub-agent call {' -> '.join(child_scope.path)} (key {run.key!r} seq {run.seq}) finished "
            "without an OutputEvent: the child must send at least one"
        )
    return [output.output for output in outputs], child_state.data, child_stats


def _trace_inside(calls: ActionCalls, call: _ChildCall) -> None:
    """A traced run that reuses a sub-agent call whole: the calls the sub-agent made when it ran (journaled under its
    actions, at the caller's step) are noted, so that their executions' spans are made again under the calling
    action, with the ids the attempt that made them gave them (docs/design.md §17)."""
    context, site = calls.context, calls.site
    history, trace = context.history, context.trace
    if trace is None or history is None:
        return
    run = context.run
    prefix = "/".join((*calls.scope.path[1:], call.child.name)) + "/"
    for (seq, event, action), slot in list(history.calls.items()):
        if seq != run.seq or not action.startswith(prefix):
            continue
        retried = history.retried_positions(seq, event, action)
        record_key = journal_key(run.key_group, seq, event, action, context.digest_of_key)
        for record in slot.values():
            if record.order != site.order or record.outcome is CallOutcome.STARTED:
                continue
            made_as = action_call_id(calls.scope.path[0], record_key, context.input_digest, action, seq,
                                     record.position, record.resource, record.args_digest,
                                     retried.get(record.position, 0))
            trace.call(record, CallHow.INSIDE_REUSED, made_as, (*calls.scope.path, call.child.name), time.time_ns(),
                       parent=(site.event.id, site.action))


def _settle(calls: ActionCalls, call: _ChildCall, outcome: Outcome | None,
            started_ns: int) -> tuple[Any, BaseException | None]:
    """A child call's (outputs, memory) or its exception: reused from the journal, or run now and journaled."""
    stats, run = calls.stats, calls.context.run
    if outcome is None:  # a finished child call: its recorded result, without running the child
        stats.child_calls_reused += 1
        _trace_inside(calls, call)
        log.info("key %r seq %d: sub-agent call %s reused from the journal (not run again)", run.key,
                 run.seq, " -> ".join((*calls.scope.path, call.child.name)))
        calls.trace_call(call.record, CallHow.REUSED)
        if call.record.outcome is CallOutcome.RAISED:
            return None, decode_exception(call.record.result)
        return call.record.result, None
    stats.child_calls_executed += 1
    # When it began and how long it took, as a call's meta notes them (a reused one's trace shows it made then).
    meta = {"at_ms": started_ns // 1_000_000, "latency_ms": round((time.time_ns() - started_ns) / 1e6, 3)}
    if outcome.error is not None:
        calls.write_call(call.position, call.resource, call.args_digest, CallOutcome.RAISED,
                         encode_exception(outcome.error), started_ns=started_ns, meta=meta)
        return None, outcome.error
    outputs, child_memory, child_stats = outcome.value
    stats.add(child_stats)
    value = (outputs, child_memory)
    calls.write_call(call.position, call.resource, call.args_digest, CallOutcome.RETURNED, value,
                     started_ns=started_ns, meta=meta)
    return value, None
