"""The calls of one action execution: what makes ``ctx.call`` durable.

Each call of an action has a *position*, its number among the action's calls, which names it in the journal
and in its call id. :class:`ActionCalls` holds what one execution of an action needs for them: the calls the
key's journal holds for this action (from an earlier attempt cut short, :class:`JournaledCalls`), the
positions an "action failed" record asks to make again, and the steps taken so far. For each ``ctx.call`` it
decides, in this order:

1. **Reuse.** A journaled call of this action that asks the same (same resource, same arguments' digest) and
   that no earlier call of this execution took: its result is returned (or its exception raised) without
   calling, and the call takes that record's position. The n-th call asking the same takes the n-th such
   record. Calls are matched by what they ask, not by their place in the order: an action that iterates a
   set or a dict built from one calls in another order in a process with another hash seed, and each of those
   calls was still made once already. A call no record matches is new: it gets the lowest position no
   journaled call holds, so its record never takes the place of one a later attempt still needs.
2. **In doubt.** The matching record is a "started" one without an outcome: the call began and never reported
   back. The resource's ``in_doubt`` policy decides: ``rerun`` (make it again, under the same call id: the
   record's position), ``fail`` (:class:`~flink_agents_replay.core.errors.CallInDoubtError`) or ``assume_done``
   (``None``).
3. **The gate.** The run's :class:`~flink_agents_replay.engine.gate.CallGate` may serve a recorded outcome
   or block the call instead (a replay); production's gate lets every call through.
4. **Live.** An external resource first journals an acknowledged "started" record; the call runs with a
   stable call id (:func:`call_id`, ``current_call_id()`` inside the resource) on private copies of its
   arguments; its outcome, returned or raised, is journaled. A timeout is neither: the call is in doubt.
   An external call's outcome is acknowledged before the run's next call is made (its "started" record's
   wait, or its own): a run that went on past an external call's outcome never finds it in doubt.

Sub-agent calls (:mod:`.children`) are matched and journaled the same way, and so are waits
(:meth:`ActionCalls.wait_for`): a wait is a call record of ``@wait`` (its id and deadline, fixed when first
opened) and one of ``@decision`` (the decision, once the run resumed with it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any

from flink_agents_replay.api.call_site import _CALL_ATTEMPT, _CALL_REPORT, _CALL_SITE, CallSite
from flink_agents_replay.api.memory import private_copy
from flink_agents_replay.api.resources import NOT_DONE, InDoubtCall, InDoubtPolicy, Reconciler, Resource, Tool
from flink_agents_replay.core.errors import (
    CallInDoubtError,
    CallTimeoutError,
    JournalError,
    ReconcileError,
    ToolCallDeniedError,
    WaitNotSupportedError,
    WaitTimedOutError,
)
from flink_agents_replay.engine.context import ActionSite, RunCancelled, RunContext, RunStats, Scope, WaitPending
from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.engine.failures import CallStep, calls_to_retry
from flink_agents_replay.engine.gate import Blocked, GatedCall, GatedWait, Live, Recorded
from flink_agents_replay.engine.trace import CallHow
from flink_agents_replay.storage.records.journal import STARTED_META as _STARTED_META
from flink_agents_replay.storage.records.journal import STILL_IN_DOUBT_IF_FAILED as _STILL_IN_DOUBT_IF_FAILED
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord, RecordKind
from flink_agents_replay.storage.records.raised import decode_exception, encode_exception
from flink_agents_replay.storage.records.waits import DECISION_RESOURCE, RAISE, WAIT_RESOURCE, Decision, WaitOpened

__all__ = ["ActionCalls", "JournaledCalls", "action_call_id", "call_id", "recorded_outcome"]

#: Spacing of the actions' steps in ``CallSite.step`` (an action making more calls only blurs the order).
_CALLS_PER_ACTION = 1_000_000

log = logging.getLogger(__name__)


class JournaledCalls:
    """The journaled calls of one action execution, taken by what they ask (resource, arguments' digest).

    Each record is taken once; of several that ask the same, the one with the lowest position first.
    """

    def __init__(self, records: Iterable[CallRecord]) -> None:
        self._unused: dict[tuple[str, str], deque[CallRecord]] = defaultdict(deque)
        for record in sorted(records, key=lambda r: r.position):
            self._unused[(record.resource, record.args_digest)].append(record)
        self.positions = frozenset(r.position for queue in self._unused.values() for r in queue)

    def take(self, resource_name: str, args_digest: str) -> CallRecord | None:
        """The first untaken record of a call to ``resource_name`` with these arguments, if any."""
        queue = self._unused.get((resource_name, args_digest))
        return queue.popleft() if queue else None

    def finished(self, resource_name: str, args_digest: str) -> bool:
        """Whether the next record :meth:`take` would give holds the call's outcome (not only its start)."""
        queue = self._unused.get((resource_name, args_digest))
        return bool(queue) and queue[0].outcome is not CallOutcome.STARTED


class ActionCalls:
    """The ``ctx.call`` of one action execution: matching, in-doubt handling, the gate, journaling.

    ``recorded`` are the journaled calls of this action (``None`` entries are ignored); ``retried`` maps the
    positions an earlier attempt's "action failed" record asks to make again to how often they were.
    """

    def __init__(self, *, context: RunContext, scope: Scope, site: ActionSite, stats: RunStats,
                 recorded: Iterable[CallRecord | None] | None = None, retried: dict[int, int] | None = None) -> None:
        self.context = context
        self.scope = scope
        self.site = site
        self.stats = stats
        self._journaled = JournaledCalls(r for r in recorded or () if r is not None)
        self._retried: dict[int, int] = dict(retried or {})
        self._taken: set[int] = set()  # positions of this execution's calls so far
        self.steps: list[CallStep] = []  # each ctx.call / ctx.call_agents of this execution, in order
        self.pending_wait: WaitPending | None = None  # the wait this execution stopped at, if any

    def call(self, resource_name: str, *args: Any, **kwargs: Any) -> Any:
        """``ctx.call``: the journaled outcome of this call if there is one, else the call made and journaled.

        A tool that needs approval for these arguments is called only once its wait is approved."""
        resource = self.scope.agent.resource(resource_name)
        args_digest = digest_value((args, kwargs))
        # A call already made (journaled) needs no approval: its effect happened (code deployed with a new
        # needs_approval while the run recovers must not deny a refund that was paid).
        if (isinstance(resource, Tool) and not self._journaled.finished(resource_name, args_digest)
                and resource.approval_needed(args, kwargs)):
            self._approve(resource_name, resource, args, kwargs)
        position, record = self.match(resource_name, args_digest)
        try:
            result = self._call_at(position, record, resource_name, resource, args_digest, args, kwargs)
        except Exception:
            self.steps.append(CallStep(raised=(position,)))
            raise
        self.steps.append(CallStep(returned=(position,)))
        return result

    def wait_for(self, name: str, payload: Any = None, *, timeout_s: float | None = None,
                 on_timeout: Any = RAISE) -> Any:
        """``ctx.wait_for``: the decision this wait got, or :class:`WaitPending` (the run waits for one)."""
        if self.scope.is_child:
            raise WaitNotSupportedError(f"action {self.site.action} of sub-agent {' -> '.join(self.scope.path)} "
                                        f"called wait_for({name!r}): only a top-level agent's actions can wait")
        _check_wait(name, payload, timeout_s)
        digest = digest_value((WAIT_RESOURCE, name, payload))
        wait = self._opened(name, payload, timeout_s, digest)
        position, record = self.match(DECISION_RESOURCE, digest)
        if record is not None and self._resumes_later(wait):
            record = None  # it parked here while the key's later inputs ran: it parks again, to resume in that order
        if record is not None and record.outcome is CallOutcome.RETURNED:
            decision = record.result  # decided in an earlier attempt of this resumed run
            self._took_journaled(record)
        else:
            decision = self.context.run.decisions.get(wait.wait_id) or self._gate_decision(wait, digest)
            if decision is None:
                self._taken.discard(position)
                self.pending_wait = WaitPending(wait, self.site, dict(self._retried))
                raise self.pending_wait
            self.write_call(position, DECISION_RESOURCE, digest, CallOutcome.RETURNED, decision)
        self.steps.append(CallStep(returned=(position,)))
        if not decision.timed_out:
            return decision
        if on_timeout is RAISE:
            raise WaitTimedOutError(f"no decision for wait {name!r} ({wait.wait_id}) in action {self.site.action} "
                                    f"within {timeout_s} s: give on_timeout= to carry on without one")
        return on_timeout

    def _resumes_later(self, wait: WaitOpened) -> bool:
        history = self.context.history
        return history is not None and history.resumed_later(self.context.run.seq, wait.wait_id)

    def _approve(self, resource_name: str, tool: Tool, args: tuple, kwargs: dict) -> None:
        """Wait for the approval of a call to ``tool``; raise :class:`ToolCallDeniedError` unless approved."""
        payload = {"tool": resource_name, "arguments": tool.arguments_by_name(args, kwargs)}
        try:
            json.dumps(payload, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"tool {resource_name!r} needs approval, so its arguments go to the approver as JSON, "
                            f"and these are not JSON data ({exc})") from None
        decision = self.wait_for(f"approve:{resource_name}", payload, timeout_s=tool.approval_timeout_s,
                                 on_timeout=Decision(approved=False, reason="no decision in time", timed_out=True))
        if not decision.approved:
            raise ToolCallDeniedError(resource_name, decision.reason)

    def _gate_decision(self, wait: WaitOpened, digest: str) -> Decision | None:
        """What the run's gate says of a wait with no decision: one now (a replay's), none, or a block."""
        decide = getattr(self.context.gate, "decide", None)  # a gate of before waits decides nothing
        if decide is None:
            return None
        run = self.context.run
        answer = decide(GatedWait(key=run.key, seq=run.seq, event_id=self.site.event.id, action=self.site.action,
                                  name=wait.name, args_digest=digest, wait_id=wait.wait_id))
        if isinstance(answer, Blocked):
            self.stats.calls_blocked += 1
            self.context.blocked.append(answer.report)
            raise answer.error
        return answer

    def _opened(self, name: str, payload: Any, timeout_s: float | None, digest: str) -> WaitOpened:
        """The wait as first opened (journaled then: its id and deadline never move), or opened now."""
        position, record = self.match(WAIT_RESOURCE, digest)
        self.steps.append(CallStep(returned=(position,)))
        if record is not None and record.outcome is CallOutcome.RETURNED:
            self._took_journaled(record)
            return record.result
        now_ms = int(time.time() * 1000)
        wait = WaitOpened(self._call_id(position, WAIT_RESOURCE, digest, retry=0), name, payload,
                          None if timeout_s is None else now_ms + math.ceil(timeout_s * 1000), now_ms)
        self.write_call(position, WAIT_RESOURCE, digest, CallOutcome.RETURNED, wait)
        return wait

    @property
    def calls_made(self) -> int:
        """How many calls this execution has made (reused ones included)."""
        return len(self._taken)

    def match(self, resource_name: str, args_digest: str) -> tuple[int, CallRecord | None]:
        """The next call's position, and the journaled call it stands for (``None``: a new call)."""
        record = self._journaled.take(resource_name, args_digest)
        if record is None:
            position = self._free_position()
        else:
            position = record.position
            if position != len(self._taken):
                self.stats.calls_reused_out_of_order += 1
                log.info("key %r seq %d action %s: call %d to %r matched journaled call %d (made in another "
                         "order)", self.context.run.key, self.context.run.seq, self.site.action, len(self._taken),
                         resource_name, position)
        self._taken.add(position)
        return position, record

    def _free_position(self) -> int:
        """The lowest position neither a journaled call nor a call of this execution holds."""
        position = 0
        while position in self._taken or position in self._journaled.positions:
            position += 1
        return position

    def calls_to_retry(self) -> list[int]:
        """The positions the next attempt makes again if an exception leaves the action now."""
        return calls_to_retry(self.steps)

    def note_retry(self, position: int, resource_name: str) -> None:
        """Count (and log) a call made again because it failed its action in an earlier attempt."""
        if position in self._retried:
            self.stats.calls_retried_after_failure += 1
            log.info("key %r seq %d action %s: call %d to %r failed its action in an earlier attempt; made again",
                     self.context.run.key, self.context.run.seq, self.site.action, position, resource_name)

    def write_call(self, position: int, resource_name: str, args_digest: str, outcome: CallOutcome, result: Any,
                   *, must_ack: bool = False, external: bool = False, meta: dict[str, Any] | None = None,
                   how: CallHow = CallHow.EXECUTED, started_ns: int | None = None,
                   arguments: tuple[tuple, dict] | None = None) -> None:
        """Journal the call's state (started, returned, raised); list finished ones in the run's calls (and in its
        trace, as ``how`` it went, begun at ``started_ns``: now if not given)."""
        context, site = self.context, self.site
        record = CallRecord(context.run.seq, site.order, site.event.id, site.action, position, resource_name,
                            args_digest, outcome, result, context.input_digest, meta=meta or {})
        if outcome is not CallOutcome.STARTED:
            context.calls.append(record)
            self.trace_call(record, how, started_ns, arguments)
        if context.journal is None:
            return
        context.journal.write(
            site.record_key, RecordKind.CALL, record, fingerprint=site.spec.fingerprint, must_ack=must_ack,
            ack_before_next_call=external and outcome is not CallOutcome.STARTED,
            what=f"the result of call {position} to {resource_name!r} in action {site.action}",
        )

    def trace_call(self, record: CallRecord, how: CallHow, started_ns: int | None = None,
                   arguments: tuple[tuple, dict] | None = None) -> None:
        """Note a finished call in the run's trace, if it is traced."""
        trace = self.context.trace
        if trace is not None:
            call_id = self._call_id(record.position, record.resource, record.args_digest)
            trace.call(record, how, call_id, self.scope.path, time.time_ns() if started_ns is None else started_ns,
                       arguments)

    def _took_journaled(self, record: CallRecord, arguments: tuple[tuple, dict] | None = None) -> None:
        """A journaled outcome stands for the call: listed in the run's calls, traced as reused."""
        self.context.calls.append(record)
        self.trace_call(record, CallHow.REUSED, arguments=arguments)

    def _call_at(self, position: int, record: CallRecord | None, resource_name: str, resource: Any,
                 args_digest: str, args: tuple, kwargs: dict) -> Any:
        if record is not None and record.outcome is not CallOutcome.STARTED:
            self.stats.calls_reused += 1
            self._took_journaled(record, (args, kwargs))
            return resource.restore_result(recorded_outcome(record), args, kwargs)
        if record is not None:
            settled = self._settle_in_doubt(position, record, resource_name, resource, args_digest, args, kwargs)
            if settled is not NOT_DONE:
                return settled
        self.scope.check(self.context, f"call {position} to {resource_name!r} in action {self.site.action}")
        decision = self.context.gate.admit(GatedCall(
            key=self.context.run.key, seq=self.context.run.seq, event_id=self.site.event.id, action=self.site.action,
            position=position, resource_name=resource_name, resource=resource, args_digest=args_digest, args=args,
            kwargs=kwargs))
        if isinstance(decision, Recorded):
            self.stats.calls_recorded += 1
            self.write_call(position, resource_name, args_digest, decision.record.outcome, decision.record.result,
                            how=CallHow.RECORDED)
            return resource.restore_result(recorded_outcome(decision.record), args, kwargs)
        if isinstance(decision, Blocked):
            self.stats.calls_blocked += 1
            self.context.blocked.append(decision.report)
            raise decision.error
        return self._make(position, resource_name, resource, args_digest, args, kwargs, decision,
                          in_doubt=None if record is None else dict(record.meta))

    def _settle_in_doubt(self, position: int, record: CallRecord, resource_name: str, resource: Resource,
                         args_digest: str, args: tuple, kwargs: dict) -> Any:
        """A call in doubt (started, never reported back), as its policy settles it: its result (assumed done, or
        as a reconciler found it), its exception raised (``fail``, or as a reconciler found it), or
        :data:`NOT_DONE` to make it again under the same call id."""
        self.stats.calls_in_doubt += 1
        run = self.context.run
        where = f"key {run.key!r} seq {run.seq} action {self.site.action}: call {position} to {resource_name!r}"
        policy = resource.in_doubt
        if isinstance(policy, Reconciler):
            return self._reconciled(position, record, resource_name, resource, args_digest, args, kwargs, where)
        if policy is InDoubtPolicy.FAIL:
            raise CallInDoubtError(
                f"{where} started before a failure and never reported back; its in_doubt policy is 'fail'")
        if policy is InDoubtPolicy.ASSUME_DONE:
            log.warning("%s in doubt: assumed done (returns None)", where)
            self.write_call(position, resource_name, args_digest, CallOutcome.RETURNED, None, how=CallHow.SETTLED)
            return None
        log.warning("%s in doubt: made again (in_doubt policy 'rerun')", where)
        return NOT_DONE

    def _reconciled(self, position: int, record: CallRecord, resource_name: str, resource: Resource,
                    args_digest: str, args: tuple, kwargs: dict, where: str) -> Any:
        """Ask the resource's reconciler what became of the call in doubt, and journal its answer as the call's
        outcome (a :class:`ReconcileError` when it cannot tell journals nothing: the call stays in doubt)."""
        run = self.context.run
        call_args, call_kwargs = private_copy((args, kwargs))
        by_name = resource.arguments_by_name if isinstance(resource, Tool) else _arguments_by_index
        question = InDoubtCall(
            call_id=self._call_id(position, resource_name, args_digest), resource=resource_name, key=run.key,
            seq=run.seq, action=self.site.action, args=call_args, kwargs=call_kwargs,
            arguments=by_name(call_args, call_kwargs), started=dict(record.meta))
        try:
            answer = resource.in_doubt.reconcile(question)
        except ReconcileError:
            self.stats.calls_reconciled_unknown += 1
            log.warning("%s in doubt: its reconciler could not tell whether it took effect; it stays in doubt",
                        where)
            raise
        except Exception as exc:  # noqa: BLE001 - the call took effect as this failure: journaled, re-raised
            self.stats.calls_reconciled += 1
            log.warning("%s in doubt: its reconciler found it failed (%s)", where, type(exc).__name__)
            self.write_call(position, resource_name, args_digest, CallOutcome.RAISED, encode_exception(exc),
                            external=True, meta={"reconciled": "failed", _STILL_IN_DOUBT_IF_FAILED: True,
                                                 _STARTED_META: dict(record.meta)}, how=CallHow.SETTLED)
            raise
        if answer is NOT_DONE:
            log.warning("%s in doubt: its reconciler found it not done; made now, under the same call id", where)
            return NOT_DONE
        self.stats.calls_reconciled += 1
        log.warning("%s in doubt: its reconciler found it done", where)
        self.write_call(position, resource_name, args_digest, CallOutcome.RETURNED, answer, external=True,
                        meta={"reconciled": "done"}, how=CallHow.SETTLED)
        return resource.restore_result(private_copy(answer), args, kwargs)

    def _make(self, position: int, resource_name: str, resource: Resource, args_digest: str, args: tuple,
              kwargs: dict, live: Live, *, in_doubt: dict[str, Any] | None = None) -> Any:
        """Make the call for real, journaling it: 'started' first for an external resource, then its outcome.

        ``in_doubt``: for a call made again after it was in doubt, what its started record noted (the resource is
        told). Such a call notes so with its exception: if that leaves the action, the call is in doubt again for
        the next attempt (its first try may have taken effect), not made under a new id."""
        external = resource.tracks_start
        if self.context.journal is not None:
            if external:
                self.write_call(position, resource_name, args_digest, CallOutcome.STARTED, None, must_ack=True)
            elif resource.writes(args, kwargs):
                self.context.journal.acknowledge()  # what the run read before may not be read again after it
            else:
                self.context.journal.before_call()  # an earlier external call's outcome, if unacknowledged
            # Either wait may outlast the operator's close: no call is made after it (the next attempt finds an
            # external one in doubt, and its policy decides there).
            self.scope.check(self.context, f"call {position} to {resource_name!r} in action {self.site.action}")
        self.note_retry(position, resource_name)
        token = _CALL_SITE.set(self._site(position, resource_name, args_digest, live, in_doubt))
        meta: dict[str, Any] = {}
        report = _CALL_REPORT.set(meta)
        started = [in_doubt or {}]  # what the call's last started record noted (kept with its exception)
        attempt = _CALL_ATTEMPT.set(
            lambda noted: started.append(self._journal_attempt(position, resource_name, args_digest, noted)))
        # A copy: what the resource does to its arguments must not reach the action's objects (memory, events),
        # since a reused call could not do it again.
        call_args, call_kwargs = private_copy((args, kwargs))
        begun, begun_ns = time.monotonic(), time.time_ns()
        try:
            result = resource.invoke(*call_args, **call_kwargs)
        except CallTimeoutError:
            # It may still take effect: not an outcome to reuse. The next attempt finds the call in doubt (an
            # external resource's 'started' record) and its in_doubt policy decides, or simply makes it again.
            self.stats.calls_in_doubt += 1
            raise
        except (RunCancelled, JournalError):  # the run stopped in the call (journal_attempt): no outcome of it
            raise
        except Exception as exc:  # noqa: BLE001 - journaled, then re-raised as the same type
            self.stats.calls_executed += 1
            if in_doubt is not None:
                meta.update({_STILL_IN_DOUBT_IF_FAILED: True, _STARTED_META: started[-1]})
            self.write_call(position, resource_name, args_digest, CallOutcome.RAISED, encode_exception(exc),
                            external=external, meta=_with_latency(meta, begun, begun_ns), started_ns=begun_ns,
                            arguments=(args, kwargs))
            raise
        finally:
            _CALL_ATTEMPT.reset(attempt)
            _CALL_REPORT.reset(report)
            _CALL_SITE.reset(token)
        self.stats.calls_executed += 1
        self.write_call(position, resource_name, args_digest, CallOutcome.RETURNED, result,
                        external=external, meta=_with_latency(meta, begun, begun_ns), started_ns=begun_ns,
                        arguments=(args, kwargs))
        # A copy: the journaled result stays as it was, whatever the action does to its copy.
        return resource.restore_result(private_copy(result), args, kwargs)

    def _journal_attempt(self, position: int, resource_name: str, args_digest: str,
                         noted: dict[str, Any]) -> dict[str, Any]:
        """A started record of the call under way, noting what it tries now (``journal_attempt``), acknowledged;
        returns what it noted."""
        if self.context.journal is None:
            return noted
        where = f"call {position} to {resource_name!r} in action {self.site.action}"
        self.scope.check(self.context, where)
        self.write_call(position, resource_name, args_digest, CallOutcome.STARTED, None, must_ack=True, meta=noted)
        self.scope.check(self.context, where)  # the wait may outlast the operator's close: nothing tried after it
        return noted

    def _site(self, position: int, resource_name: str, args_digest: str, live: Live,
              in_doubt: dict[str, Any] | None) -> CallSite:
        """What the resource learns about the call (``current_call_site()``)."""
        run = self.context.run
        return CallSite(call_id=live.call_id_prefix + self._call_id(position, resource_name, args_digest),
                        stable_id=self._call_id(position, resource_name, args_digest, retry=0),
                        agent=self.scope.path[0], resource=resource_name, key_digest=self.context.digest_of_key,
                        seq=run.seq, event_time_ms=run.event_time, epoch=run.epoch,
                        step=self.site.order * _CALLS_PER_ACTION + position, fork=live.fork, in_doubt=in_doubt)

    def _call_id(self, position: int, resource_name: str, args_digest: str, *, retry: int | None = None) -> str:
        # A retry after a failure gets an id of its own: a service may have stored the failure under the old one.
        retry = self._retried.get(position, 0) if retry is None else retry
        return action_call_id(self.scope.path[0], self.site.record_key, self.context.input_digest, self.site.action,
                              self.context.run.seq, position, resource_name, args_digest, retry)


def _check_wait(name: str, payload: Any, timeout_s: float | None) -> None:
    """A wait's name, payload and timeout as ``wait_for`` takes them, or a clear error naming what is wrong."""
    if not isinstance(name, str) or not name or not name.isprintable():
        raise TypeError(f"wait_for takes a non-empty, printable name (str), got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise TypeError(f"wait_for({ascii(name)}): the name is not valid Unicode (a lone surrogate)") from None
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"wait_for({name!r}): the payload goes to people and tools as JSON, and this one is not "
                        f"JSON data ({exc})") from None
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not 0 < timeout_s < math.inf):
        raise ValueError(f"wait_for({name!r}): timeout_s must be a positive number of seconds or None, got "
                         f"{timeout_s!r}")


def _arguments_by_index(args: tuple, kwargs: dict) -> dict[str, Any]:
    """A call's arguments by name, positional ones by their index (a resource without a signature to bind)."""
    return {**{str(index): value for index, value in enumerate(args)}, **kwargs}


def _with_latency(meta: dict[str, Any], begun: float, begun_ns: int) -> dict[str, Any]:
    """The call's meta: when it began (ms since the epoch: a reused call's trace shows it made then), how long it
    took, and what the resource reported (``report_call``)."""
    return {"at_ms": begun_ns // 1_000_000, "latency_ms": round((time.monotonic() - begun) * 1000, 3), **meta}


def action_call_id(agent: str, record_key: bytes, input_digest: str, action: str, seq: int, position: int,
                   resource: str, args_digest: str, retry: int) -> str:
    """The call id of the call at ``position`` of the action execution journaled under ``record_key``: what
    identifies its request is that key, the input's digest, the resource, the arguments' digest and its retry."""
    return call_id(agent, action, seq, position, (record_key.decode(), input_digest, resource, args_digest, retry))


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


def recorded_outcome(record: CallRecord) -> Any:
    """What a finished recorded call gives the action again: its result, or its exception raised."""
    if record.outcome is CallOutcome.RAISED:
        raise decode_exception(record.result)
    return private_copy(record.result)
