"""The operator's waiting runs: parked in keyed state, resumed by their decision or their deadline.

A run that stops at ``ctx.wait_for`` comes back from the engine as *waiting*
(:attr:`flink_agents_replay.engine.RunResult.waiting`). The operator then **parks** it: the run's records so
far go to the key's ``parked_runs`` state (by seq; ``parked_waits`` indexes them by wait id, with the deadline),
a processing-time timer is set at the wait's deadline, and the run's slot and thread are free. Nothing of the run
is applied: no memory update, no output. By default its input stays the key's run in flight: the key's later
inputs wait behind it, in order, without counting toward the input hold (they could otherwise hold back the very
decision that frees them). With ``later_inputs_while_waiting="run"`` the operator keeps it aside instead (its
input and starting memory in the entry) and runs the key's next input; a key may then hold several parked runs.

Decisions arrive as :class:`~flink_agents_replay.flink.signals.Signal` s on the key. Each received decision
is kept in the key's ``decisions`` map state by wait id (:class:`~flink_agents_replay.storage.records.parked.
ReceivedDecision`):

- one for the parked run's wait is *applied*: the run is resumed with it;
- one for no wait of the key is *early* (the wait is not reached yet: normal after a failover, when a
  decision is read again before its run re-opens the wait); it is applied when the wait opens, or dropped
  after ``early_decision_ttl_s`` and reported as unmatched;
- a second one for a wait already decided is a *duplicate*: ignored and reported. The first decision wins,
  and a finished wait's is kept (*closed*) for ``early_decision_ttl_s`` to recognise late duplicates.

A deadline that passes with no decision is a decision too (``timed_out``), applied the same way. Timers and
state are checkpointed, so all of this survives failover, savepoints and rescaling; a deadline that passed
while the job was down fires right after the restore.

Resuming submits the input again with the parked records as its history (and what the journal holds of the
seq, after a failure of an earlier resumed attempt) and the decision: every action and call before the wait is
reused, the waiting action gets its decision. A resumed run that waits again (a second wait) is parked again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from flink_agents_replay.flink.signals import MalformedSignal, Signal
from flink_agents_replay.storage.records.journal import CallRecord
from flink_agents_replay.storage.records.parked import (
    DecisionStatus,
    ParkedWait,
    ReceivedDecision,
    WaitingRun,
    decode_decision,
    decode_parked_wait,
    decode_waiting_run,
    encode_decision,
    encode_parked_wait,
    encode_waiting_run,
)
from flink_agents_replay.storage.records.waits import DECISION_RESOURCE, WAIT_RESOURCE, Decision

__all__ = ["OperatorWaits", "WaitEvent"]

log = logging.getLogger("flink_agents_replay.operator")


@dataclass(frozen=True)
class WaitEvent:
    """What happened to a wait, for people and systems that decide (a chat, a ticket system).

    ``kind``: ``opened`` (a run waits: ``name``, ``payload`` and ``deadline_ms`` say for what), ``resumed`` (its
    decision was applied; ``timed_out`` ones say so in ``decision``), ``closed`` (its run finished; ``decision`` is
    the one its effects followed, the journaled one after a restore, which may differ from ``resumed``'s; ``reason``
    when a timeout or denial the action did not handle ended it, with no output and its memory as before),
    ``decision_early`` (a decision for no wait of the key yet: kept for ``early_decision_ttl_s``),
    ``decision_ignored`` (a duplicate: the wait has its decision), ``decision_unmatched`` (an early decision
    whose wait never came), ``decision_rejected`` (a decision that could not be read: ``reason``).
    """

    kind: str
    key: Any
    wait_id: str | None
    agent: str
    action: str | None = None
    seq: int | None = None
    name: str | None = None
    payload: Any = None
    deadline_ms: int | None = None
    opened_at_ms: int | None = None
    decision: Decision | None = None
    reason: str | None = None


class OperatorWaits:
    """Parking, deciding and resuming the waiting runs of one subtask (see the module docstring).

    ``resume(key, waiting_run, decision, ctx)`` is the operator's: it submits the run again (at once, or when
    the key's run under way ends, when the key's later inputs run while it waits).
    """

    def __init__(self, *, agent_name: str, event_types, runtime_context, counters, ttl_s: float, max_early: int,
                 resume, time_out: bool = True) -> None:
        from pyflink.common import Types
        from pyflink.datastream.state import MapStateDescriptor

        self.agent_name = agent_name
        self.event_types = event_types
        self.counters = counters
        self.ttl_ms = int(ttl_s * 1000)
        self.time_out = time_out  # False in a replay: deadlines do not fire
        self._resume = resume
        # Keyed state names are part of every savepoint: never change them.
        self.runs = runtime_context.get_map_state(
            MapStateDescriptor("parked_runs", Types.LONG(), Types.PICKLED_BYTE_ARRAY()))  # seq -> WaitingRun
        self.waits = runtime_context.get_map_state(
            MapStateDescriptor("parked_waits", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))  # wait id -> ParkedWait
        self.decisions = runtime_context.get_map_state(
            MapStateDescriptor("decisions", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))
        self.refused = 0  # decisions that could not be read, in this attempt
        #: Whether a run kept aside was seen here (one parked under later_inputs_while_waiting="run" before a restore).
        self.kept_aside_seen = False
        #: Per key group, the runs parked now (kept in the checkpoint markers: keyed state cannot be counted).
        self.open_by_group: dict[int, int] = {}
        self.max_early = max_early

    def restored(self, open_by_group: dict[int, int]) -> None:
        """The parked runs of this subtask's key groups at the restored checkpoint."""
        self.open_by_group = dict(open_by_group)
        self.counters["runs_waiting"].inc(sum(open_by_group.values()))

    def _opened(self, group: int, change: int) -> None:
        self.open_by_group[group] = self.open_by_group.get(group, 0) + change
        self.counters["runs_waiting"].inc(change)

    # -- the key's state ------------------------------------------------------------------------------
    def parked(self, seq: int) -> WaitingRun | None:
        """The current key's run ``seq``, if it is parked."""
        raw = self.runs.get(seq)
        if raw is None:
            return None
        waiting = decode_waiting_run(raw, self.event_types)
        self.kept_aside_seen = self.kept_aside_seen or waiting.kept_aside
        return waiting

    def is_parked(self, seq: int) -> bool:
        """Whether the current key's run ``seq`` is parked."""
        return self.runs.contains(seq)

    def any_parked(self) -> bool:
        """Whether the current key has a parked run."""
        return not self.runs.is_empty()

    def parked_seqs(self) -> frozenset[int]:
        """The seqs of the current key's parked runs."""
        return frozenset(self.runs.keys())

    def add_records(self, seq: int, records: list) -> None:
        """Records the journal holds of the parked run ``seq`` (see the operator's ``_adopt_records``)."""
        waiting = self.parked(seq)
        self.runs.put(seq, encode_waiting_run(replace(waiting, records=[*waiting.records, *records])))

    def deadline_at(self, when: int) -> bool:
        """Whether a parked run of the current key has its deadline at ``when`` (epoch ms)."""
        return any(decode_parked_wait(raw).deadline_ms == when for raw in self.waits.values())

    def decided(self) -> list[int]:
        """The current key's parked runs whose decision was applied, in the order their decisions came (a resumed run
        under way is among them until it finishes or parks again: the caller knows its run in flight)."""
        ready = []
        for wait_id, raw in self.waits.items():
            received = self._decision(wait_id)
            if received is not None and received.status is DecisionStatus.APPLIED:
                ready.append((received.arrival, received.received_at_ms, decode_parked_wait(raw).seq))
        return [seq for *_, seq in sorted(ready)]

    def decision_for(self, seq: int) -> tuple[WaitingRun, Decision | None] | None:
        """The parked run ``seq`` and its applied decision (``None`` in a replay, whose gate decides), or ``None``
        if it has no decision yet."""
        waiting = self.parked(seq)
        if waiting is None:
            return None
        received = self._decision(waiting.wait.wait_id)
        if received is None or received.status is not DecisionStatus.APPLIED:
            return None
        # In a replay the call gate decides every wait: what is kept here only says the run resumed.
        return waiting, received.decision if self.time_out else None

    def _decision(self, wait_id: str) -> ReceivedDecision | None:
        raw = self.decisions.get(wait_id)
        return None if raw is None else decode_decision(raw)

    def _keep(self, wait_id: str, received: ReceivedDecision) -> None:
        self.decisions.put(wait_id, encode_decision(received))

    # -- a run stopped at a wait -----------------------------------------------------------------------
    def park(self, key: Any, group: int, waiting: WaitingRun, ctx) -> Iterator[WaitEvent]:
        """Keep ``waiting`` (a run stopped at a wait); resume it at once if its decision came early."""
        earlier = self.parked(waiting.seq)
        if earlier is None:
            self._opened(group, 1)
        else:  # the resumed run waits again: its first wait is over
            self._close(earlier.wait.wait_id, ctx)
            self.waits.remove(earlier.wait.wait_id)
        self.runs.put(waiting.seq, encode_waiting_run(waiting))
        self.waits.put(waiting.wait.wait_id, encode_parked_wait(ParkedWait(waiting.seq, waiting.wait.deadline_ms)))
        self.counters["waits_opened"].inc()
        if waiting.wait.deadline_ms is not None and self.time_out:
            ctx.timer_service().register_processing_time_timer(waiting.wait.deadline_ms)
        yield self._event("opened", key, waiting)
        received = self._decision(waiting.wait.wait_id)
        if received is not None and received.status is DecisionStatus.EARLY:
            yield from self._apply_in_time(key, waiting, received, ctx)

    def finished(self, key: Any, group: int, seq: int, ctx, *, reason: str | None = None,
                 calls: Iterable[CallRecord] = ()) -> Iterator[WaitEvent]:
        """The key's resumed run ``seq`` finished (``reason``: the timeout or denial that ended it; ``calls``: its
        calls, with the decision it used): its wait is closed (its decision kept a while for duplicates)."""
        waiting = self.parked(seq)
        if waiting is None:
            return
        self.runs.remove(seq)
        self.waits.remove(waiting.wait.wait_id)
        self._opened(group, -1)
        self._close(waiting.wait.wait_id, ctx)
        yield from self._expire(key, _now_ms())
        yield replace(self._event("closed", key, waiting, decision=_used_decision(waiting, calls)), reason=reason)

    def _close(self, wait_id: str, ctx) -> None:
        """The wait's run went past it: its decision is kept ``early_decision_ttl_s`` more, to recognise a duplicate,
        and dropped at a timer then."""
        received = self._decision(wait_id)
        if received is not None:
            until = _now_ms() + self.ttl_ms
            self._keep(wait_id, replace(received, status=DecisionStatus.CLOSED, keep_until_ms=until))
            ctx.timer_service().register_processing_time_timer(until)

    def resume_in_replay(self, key: Any, seq: int, ctx) -> None:
        """Production finished its run of ``seq``: if the key holds that run parked (from the replay's savepoint),
        resume it; the replay's call gate decides its wait (production's recorded decision, or the policy)."""
        waiting = self.parked(seq)
        if waiting is not None and not self.decisions.contains(waiting.wait.wait_id):
            self._keep(waiting.wait.wait_id, ReceivedDecision(Decision(by="replay"), DecisionStatus.APPLIED,
                                                              _now_ms(), None))
            self._resume(key, waiting, None, ctx)

    # -- decisions -------------------------------------------------------------------------------------
    def on_signal(self, signal: Signal | MalformedSignal, ctx) -> Iterator[WaitEvent]:
        """A decision for the current key: applied, kept as early, or ignored as a duplicate. Never raises on
        bad data: a decision that cannot be read is reported."""
        if isinstance(signal, MalformedSignal):
            self.counters["decisions_rejected"].inc()
            self.refused += 1
            if self.refused <= 10 or self.refused % 1000 == 0:  # every one is an event; a flood is not a log flood
                log.warning("agent %s key %r: a decision was refused (%s; %d refused here so far, each reported as "
                            "a decision_rejected event): %s", self.agent_name, signal.key, signal.reason,
                            self.refused, signal.raw[:200])
            yield WaitEvent("decision_rejected", signal.key, None, self.agent_name, payload=signal.raw,
                            reason=signal.reason)
            return
        yield from self._expire(signal.key, _now_ms())  # an expiry its timer skipped (the key was busy)
        if self.decisions.contains(signal.wait_id):
            self.counters["decisions_ignored"].inc()
            yield WaitEvent("decision_ignored", signal.key, signal.wait_id, self.agent_name,
                            decision=signal.decision, reason="the wait already has a decision")
            return
        now = _now_ms()
        parked = self.waits.get(signal.wait_id)
        if parked is not None:
            waiting = self.parked(decode_parked_wait(parked).seq)
            received = ReceivedDecision(signal.decision, DecisionStatus.EARLY, now, None, signal.signal_id)
            yield from self._apply_in_time(signal.key, waiting, received, ctx)
            return
        if self._early_count() >= self.max_early:
            self.counters["decisions_rejected"].inc()
            yield WaitEvent("decision_rejected", signal.key, signal.wait_id, self.agent_name, decision=signal.decision,
                            reason=f"the key already keeps {self.max_early} decisions for waits it has not reached "
                                   "(max_early_decisions_per_key)")
            return
        self._keep(signal.wait_id, ReceivedDecision(signal.decision, DecisionStatus.EARLY, now, now + self.ttl_ms,
                                                    signal.signal_id))
        ctx.timer_service().register_processing_time_timer(now + self.ttl_ms)
        self.counters["decisions_early"].inc()
        yield WaitEvent("decision_early", signal.key, signal.wait_id, self.agent_name, decision=signal.decision)

    def _early_count(self) -> int:
        return sum(decode_decision(raw).status is DecisionStatus.EARLY for raw in self.decisions.values())

    def _next_arrival(self) -> int:
        return 1 + max((decode_decision(raw).arrival for raw in self.decisions.values()), default=0)

    def _apply_in_time(self, key: Any, waiting: WaitingRun, received: ReceivedDecision,
                       ctx) -> Iterator[WaitEvent]:
        """Apply ``received`` if it came in time; one decided after the wait's deadline loses to the timeout (its
        timer may not have fired yet: after a restore, or while the key was busy), and is reported ignored."""
        deadline = waiting.wait.deadline_ms
        if not self.time_out or deadline is None or _in_time(received, deadline):
            yield from self._apply(key, waiting, received, ctx)
            return
        timeout = Decision(timed_out=True, by="timeout", decided_at_ms=deadline)
        yield from self._apply(key, waiting, ReceivedDecision(timeout, DecisionStatus.EARLY, deadline, None), ctx)
        self.counters["decisions_ignored"].inc()
        yield WaitEvent("decision_ignored", key, waiting.wait.wait_id, self.agent_name, decision=received.decision,
                        reason=f"it was decided after the wait's deadline ({deadline} epoch ms): the wait timed out")

    def _apply(self, key: Any, waiting: WaitingRun, received: ReceivedDecision, ctx) -> Iterator[WaitEvent]:
        self._keep(waiting.wait.wait_id, replace(received, status=DecisionStatus.APPLIED, keep_until_ms=None,
                                                 arrival=self._next_arrival()))
        self.counters["waits_timed_out" if received.decision.timed_out else "decisions_applied"].inc()
        yield self._event("resumed", key, waiting, decision=received.decision)
        self._resume(key, waiting, received.decision, ctx)

    # -- timers ----------------------------------------------------------------------------------------
    def on_timer(self, key: Any, timestamp: int, ctx) -> Iterator[WaitEvent]:
        """A processing-time timer of the key: drop the decisions kept long enough, time out the parked runs'
        waits whose deadline passed."""
        yield from self._expire(key, timestamp)
        if not self.time_out:
            return
        due = [(wait.seq, wait_id) for wait_id, wait in
               ((wait_id, decode_parked_wait(raw)) for wait_id, raw in self.waits.items())
               if wait.deadline_ms is not None and wait.deadline_ms <= timestamp]
        for seq, wait_id in sorted(due):
            if not self.decisions.contains(wait_id):
                timeout = Decision(timed_out=True, by="timeout", decided_at_ms=timestamp)
                yield from self._apply(key, self.parked(seq),
                                       ReceivedDecision(timeout, DecisionStatus.EARLY, timestamp, None), ctx)

    def _expire(self, key: Any, timestamp: int) -> Iterator[WaitEvent]:
        expired = []
        for wait_id, raw in self.decisions.items():
            received = decode_decision(raw)
            if received.keep_until_ms is not None and received.keep_until_ms <= timestamp:
                expired.append(wait_id)
                if received.status is DecisionStatus.EARLY:
                    self.counters["decisions_unmatched"].inc()
                    yield WaitEvent("decision_unmatched", key, wait_id, self.agent_name, decision=received.decision,
                                    reason="no wait of the key had this id within early_decision_ttl_s")
        for wait_id in expired:
            self.decisions.remove(wait_id)

    def _event(self, kind: str, key: Any, waiting: WaitingRun, *, decision: Decision | None = None) -> WaitEvent:
        wait = waiting.wait
        return WaitEvent(kind, key, wait.wait_id, self.agent_name, waiting.action, waiting.seq, wait.name,
                         wait.payload, wait.deadline_ms, wait.opened_at_ms, decision)


def _used_decision(waiting: WaitingRun, calls: Iterable[CallRecord]) -> Decision | None:
    """The decision the run journaled (or reused) for its parked wait: a ``@decision`` call asking what the wait's
    ``@wait`` call asked."""
    asked = next((record.args_digest for record in waiting.records if isinstance(record, CallRecord)
                  and record.resource == WAIT_RESOURCE and record.result == waiting.wait), None)
    where = (waiting.event_id, waiting.action, asked)  # the same question asked in another action is another wait
    return next((call.result for call in calls if call.resource == DECISION_RESOURCE
                 and (call.event_id, call.action, call.args_digest) == where), None)


def _in_time(received: ReceivedDecision, deadline_ms: int) -> bool:
    """Whether a decision came by the deadline: received by then, or sent by then as its sender says
    (``sent_at_ms``: one sent in time while the job was down counts; a sender's clock running fast does not make
    one received in time late)."""
    sent = received.decision.decided_at_ms
    return received.received_at_ms <= deadline_ms or (sent is not None and sent <= deadline_ms)


def _now_ms() -> int:
    return int(time.time() * 1000)
