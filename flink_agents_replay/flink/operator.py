"""ActionExecutionOperator: runs an agent per input inside Flink, journals it, and reuses the journal.

Per key, Flink keyed state holds the seq of the last accepted input (``seq``), the short-term memory (``memory``),
the run in flight, its seq and input (``in_flight``), the inputs waiting behind it (``pending``), and the runs
parked at ``ctx.wait_for`` with the decisions received (:mod:`flink_agents_replay.flink.waits`: a parked run holds
its key, or is kept aside while the key's later inputs run). Runs of *different* keys execute concurrently on a
thread pool (``max_concurrent_runs`` per subtask, each run holding a slot: :mod:`flink_agents_replay.flink.runs`);
Flink state is touched only on the task thread, which keyed processing-time timers bring back to a key to apply a
finished run: write its memory, emit its outputs, start the key's next input. At a checkpoint, a run in flight is
just keyed state; after a restore its timer fires, the run is not in memory, and it is submitted again, reusing
every call and action it had journaled, so it repeats no effect. The run itself is the engine's
(:mod:`flink_agents_replay.engine`).

Checkpoint hooks (through the checkpoint bridge, see :mod:`flink_agents_replay.flink.checkpoint_bridge`), each
handed to :class:`~flink_agents_replay.storage.journal.checkpoints.JournalCheckpoints`, and each also moving the run
epochs on (:mod:`flink_agents_replay.flink.epochs`): a run's *epoch*, the checkpoint its effects belong to, kept with
the run in ``in_flight``, is the last checkpoint's trigger time + 1 when the run starts (for long-term memory's
as-of views, docs/design.md §13).

* ``initialize_state``: take, per owned journal partition, the offset recorded at the checkpoint and
  read the partition from there into a recovery index (docs/design.md §5.1); without a checkpoint, reuse an earlier
  attempt's records (attempt records).
* ``snapshot_state``: the observers see the checkpoint first (capture flushes and writes its manifest
  entry); then the journal is flushed and the marker is, per owned partition, the next offset, lowered to
  the first record of any run still in flight and of any recovered history not yet replayed.
* ``notify_checkpoint_complete``: delete journal records below that checkpoint's marker (docs/design.md §7).

The other parts the operator calls without knowing what they do:

* order restoration (:mod:`flink_agents_replay.flink.order`): after a restore, a key's next input is the
  one the journal recorded next (docs/design.md §8);
* observers (:mod:`flink_agents_replay.flink.observer`): told of every accepted input, applied run,
  checkpoint and the close; with capture on, the capture's (:mod:`flink_agents_replay.flink.capture_observer`,
  docs/design.md §9);
* the job mode (:mod:`flink_agents_replay.flink.mode`): production's, or a replay's
  (:mod:`flink_agents_replay.replay.mode`, docs/design.md §9), which adapts captured inputs, gates each run's
  calls, reads production's journal read only, reports failed runs and writes no markers.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, TimeDomain
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor

from flink_agents_replay.api.agent import Agent
from flink_agents_replay.api.memory import Memory
from flink_agents_replay.api.tool_definitions import tool_digests
from flink_agents_replay.core.events import traceparent_of, untraced
from flink_agents_replay.core.keygroups import key_group, key_group_range
from flink_agents_replay.engine import RunInput, RunResult, RunStats, execute_run
from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.engine.run import resume_history
from flink_agents_replay.flink import metrics as metrics_table
from flink_agents_replay.flink import parts
from flink_agents_replay.flink.capture_observer import CaptureObserver
from flink_agents_replay.flink.checkpoint_bridge.task_stop import TaskStop
from flink_agents_replay.flink.checkpoint_bridge.wakeups import CompletionWakeups
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.flink.epochs import RunEpochs
from flink_agents_replay.flink.input_hold import InputHold
from flink_agents_replay.flink.logs import LOG_FILE_ENV, configure_logging, describe_stats
from flink_agents_replay.flink.order import DRAIN_TIMER, OrderRestoration
from flink_agents_replay.flink.runs import RunPool
from flink_agents_replay.flink.runtime_info import subtask_info
from flink_agents_replay.flink.signals import KeyedInput, MalformedSignal, Signal
from flink_agents_replay.flink.tool_check import check_restored_tools
from flink_agents_replay.flink.trace_observer import TraceObserver
from flink_agents_replay.flink.waits import OperatorWaits, WaitEvent
from flink_agents_replay.storage.capture.records import CapturedRunEnd
from flink_agents_replay.storage.formats.state import (
    InFlightInput,
    WaitingInput,
    decode_in_flight,
    decode_memory,
    encode_in_flight,
    encode_memory,
    encode_waiting,
)
from flink_agents_replay.storage.journal.checkpoints import RunInFlight
from flink_agents_replay.storage.journal.markers import checkpoint_time, restored_lineage, waits_open
from flink_agents_replay.storage.records.journal import CallRecord, key_digest
from flink_agents_replay.storage.records.parked import WaitingRun

__all__ = ["LOG_FILE_ENV", "WAIT_EVENTS", "ActionExecutionOperator", "AgentOutput", "WaitEvent"]

#: The side output of the operator's :class:`WaitEvent` s (``wait_events(outputs)`` in the pipeline).
WAIT_EVENTS_TAG_NAME = "flink-agents-replay-wait-events"


def _wait_events_tag():
    from pyflink.common import Types
    from pyflink.datastream import OutputTag

    return OutputTag(WAIT_EVENTS_TAG_NAME, Types.PICKLED_BYTE_ARRAY())


WAIT_EVENTS = WAIT_EVENTS_TAG_NAME

log = logging.getLogger("flink_agents_replay.operator")

#: How a run came to be applied: woken by its end (or found by another timer of its key), found by its key's
#: check timer (polling, or the fallback behind wake-ups), or waited for at the end of a bounded input.
APPLIED_BY = ("runs_woken", "runs_checked", "runs_drained")


@dataclass(frozen=True)
class AgentOutput:
    """One OutputEvent leaving the operator: the key, the input's seq, the event's id and its ``output``."""

    key: Any
    seq: int
    event_id: str
    output: Any


class ActionExecutionOperator(KeyedProcessFunction):
    """The agent operator (a thread-mode ``KeyedProcessFunction`` with checkpoint hooks).

    Built by :func:`flink_agents_replay.flink.pipeline.connect_to_agent`; not usually constructed directly.
    """

    def __init__(self, agent: Agent, config: AgentConfig, key_type: str):
        self.agent = agent
        self.config = config
        self.key_type = key_type
        #: Made where the job is built, so every subtask and every restart of this submission has it, and no other
        #: submission does: a fresh start's lineage holds it (a fixed job id, as in HA application mode, is reused).
        self.submission = uuid.uuid4().hex[:12]

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self, runtime_context) -> None:
        configure_logging()
        info = subtask_info(runtime_context)
        self.subtask, self.job_id, self.max_parallelism = info.index, info.job_id, info.max_parallelism
        self.owned = key_group_range(info.index, info.parallelism, info.max_parallelism)
        self._declare_state(runtime_context)
        self._create_metrics(runtime_context)
        self.totals = RunStats()
        self.epochs = RunEpochs()
        self.restored_from: int | None = None
        self.applied = dict.fromkeys(APPLIED_BY, 0)
        self.wakeups: CompletionWakeups | None = None  # attached by the bridge (attach_wakeups)
        self.task_stop: TaskStop | None = None  # attached by the bridge (attach_task_stop)
        self._fence_watch = None  # the journal's (below), once it exists
        self._checks: dict[Any, int] = {}  # key -> when its registered run check fires (at most one per key)
        self._tokens: dict[Any, int] = {}  # key -> the wake-up token of its run under way
        self.hold = InputHold(bound=self.config.waiting_inputs_bound, wakeups=None,  # wakeups: attach_wakeups
                              timeout_s=self.config.slot_wait_timeout_s,
                              queued_runs_bound=self.config.max_concurrent_runs)
        self.runs = RunPool(max_runs=self.config.max_concurrent_runs,
                            max_child_calls=self.config.max_concurrent_child_calls,
                            slot_wait_timeout_s=self.config.slot_wait_timeout_s,
                            close_timeout_s=self.config.close_timeout_s, subtask=self.subtask, counters=self.counters,
                            stopping=self._stopping)
        self.mode = parts.job_mode(self.config, max_parallelism=self.max_parallelism)
        self.mode.open(owned=self.owned, subtask=self.subtask, counters=self.counters)
        self.observers = parts.observers(self.config, self.agent, key_type=self.key_type,
                                         max_parallelism=self.max_parallelism, mode=self.mode, info=info,
                                         counters=self.counters)
        self.tracer = next((o for o in self.observers if isinstance(o, TraceObserver)), None)
        self.capture = next((o for o in self.observers if isinstance(o, CaptureObserver)), None)
        #: The job lineage: the job id and submission of the start with nothing to restore, kept in the markers through
        #: every restore (a run's trace id derives from it, docs/design.md §17). A replay's is its own.
        self._take_lineage(f"{self.job_id or ''}/{self.submission}")

        self.journal = parts.journal_checkpoints(self.config, self.agent, owned=self.owned, subtask=self.subtask,
                                                 max_parallelism=self.max_parallelism, mode=self.mode)
        self._fence_watch = getattr(self.journal.writer, "fence_watch", None)
        self.tool_digests = tool_digests(self.agent.resources)  # kept with each checkpoint: a restore names changes
        self.waits = OperatorWaits(agent_name=self.agent.name, event_types=self.agent.event_types(),
                                   runtime_context=runtime_context, counters=self.counters,
                                   ttl_s=self.config.early_decision_ttl_s,
                                   max_early=self.config.max_early_decisions_per_key, resume=self._resume,
                                   time_out=self.mode.waits_time_out)
        #: Keys whose run under way was resumed from a wait -> whether it was kept aside (its memory writes go over).
        self._resumed_kept_aside: dict[Any, bool] = {}
        self.run_later_inputs = self.config.later_inputs_while_waiting == "run"
        self._events_tag = _wait_events_tag()
        self.order = OrderRestoration(
            seq_state=self.seq_state, pending_state=self.pending_state, wait_state=self.order_wait_state,
            journal=self.journal, enabled=self.config.restore_input_order and self.mode.restores_input_order,
            timeout_s=self.config.order_restore_timeout_s, counters=self.counters, subtask=self.subtask)

    def _declare_state(self, runtime_context) -> None:
        """The keyed state (names and types are part of every savepoint: never change them)."""
        self.seq_state = runtime_context.get_state(ValueStateDescriptor("seq", Types.LONG()))
        self.memory_state = runtime_context.get_state(ValueStateDescriptor("memory", Types.PICKLED_BYTE_ARRAY()))
        self.in_flight_state = runtime_context.get_state(
            ValueStateDescriptor("in_flight", Types.PICKLED_BYTE_ARRAY()))
        self.pending_state = runtime_context.get_list_state(ListStateDescriptor("pending", Types.PICKLED_BYTE_ARRAY()))
        # When a restored key waits for a recorded predecessor (docs/design.md §8): the deadline of that wait.
        self.order_wait_state = runtime_context.get_state(ValueStateDescriptor("order_wait_deadline", Types.LONG()))

    def _create_metrics(self, runtime_context) -> None:
        metrics = runtime_context.get_metrics_group().add_group(metrics_table.GROUP)
        self.counters = {name: metrics.counter(name) for name in metrics_table.COUNTERS}
        # Counters holding a value, not Python gauges (flink/metrics.py says why).
        self.restore_gauge = metrics.counter("last_restore_duration_ms")
        metrics.counter("run_pool_size").inc(self.config.max_concurrent_runs)
        metrics.counter("child_pool_size").inc(self.config.max_concurrent_child_calls)
        self.counters["runs_waiting"] = metrics.counter("runs_waiting")  # a value: up at a park, down at the end

    def close(self) -> None:
        """Stop the runs (:meth:`RunPool.close`: bounded, hung calls abandoned), then release the clients.

        Runs on cancellation, failure and stop-with-savepoint too (the checkpoint bridge sees to it), so no
        run of this attempt still calls or journals when the next attempt of the task reads the journal: an
        abandoned run can no longer journal (the journal is closed right after).
        """
        try:
            if getattr(self, "runs", None) is not None:
                self.runs.close()
                # Named by agent: on a shared TaskManager several jobs' operators close into one log.
                log.info("agent %s subtask %d closing: %s; runs applied: %s; inputs waiting at most %d, input held "
                         "%d times", self.agent.name, self.subtask, describe_stats(self.totals),
                         ", ".join(f"{name.removeprefix('runs_')} {n}" for name, n in self.applied.items()),
                         self.hold.most, self.hold.holds)
        finally:
            if getattr(self, "wakeups", None) is not None:
                self.wakeups.close()
            if getattr(self, "task_stop", None) is not None:
                self.task_stop.close()
            self._count_fenced()
            self._release_clients()

    def _count_fenced(self) -> None:
        """Count the external calls a newer attempt's start refused (task thread: metrics are not thread-safe)."""
        watch = getattr(self, "_fence_watch", None)
        if watch is not None and watch.refused:
            self.counters["external_calls_fenced"].inc(watch.refused)

    def _release_clients(self) -> None:
        """Close the journal, the observers and the mode, each whatever the others did (no client leaks)."""
        closers = [getattr(getattr(self, "journal", None), "close", None)]
        closers += [observer.close for observer in getattr(self, "observers", ())]
        closers.append(getattr(getattr(self, "mode", None), "close", None))
        closers += [resource.close for resource in _all_resources(getattr(self, "agent", None))]
        errors = []
        for close in filter(None, closers):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - close the others, then raise the first
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- checkpoint hooks --------------------------------------------------------------------------
    def attach_wakeups(self, wakeups) -> None:
        """The bridge offers completion wake-ups: a run that can be applied brings the task thread to its key."""
        if self.config.wake_on_completion:
            self.wakeups = self.hold.wakeups = CompletionWakeups(wakeups)

    def attach_task_stop(self, signal) -> None:
        """The bridge offers its task-stop signal: runs start no call, action or run once the task is being
        cancelled or failed (:meth:`_stopping`)."""
        self.task_stop = TaskStop(signal)

    def _stopping(self) -> bool:
        """Whether runs must stop at their next boundary (asked before every call, action and run, on any thread):
        the operator is closing, Flink is cancelling or failing the task (the bridge's signal, which comes well
        before the close), or a newer attempt of the task started elsewhere (the fence topic, docs/design.md §5.3)."""
        if self.runs.closing.is_set():
            return True
        task_stop, watch = self.task_stop, self._fence_watch
        return (task_stop is not None and task_stop.stopping()) or (watch is not None and watch.fenced)

    def restored_checkpoint(self, checkpoint_id: int) -> None:
        """This attempt restored checkpoint (or savepoint) ``checkpoint_id`` (its markers follow)."""
        self.restored_from = checkpoint_id

    def _take_lineage(self, lineage: str) -> None:
        """The lineage this job's runs are traced under, for the operator's markers, the spans and the capture (which
        names each run's trace id)."""
        self.lineage = lineage
        for observer in (self.tracer, self.capture):
            if observer is not None:
                observer.lineage = lineage

    def initialize_state(self, values: list[bytes]) -> None:
        """Find this subtask's journal offsets in the restored markers and read the journal from them; runs
        started from now on belong after the restored checkpoint (their epoch)."""
        if self.restored_from is not None:
            restored_time = checkpoint_time(values)
            self.mode.restored(checkpoint_id=self.restored_from, checkpoint_time_ms=restored_time)
            self.epochs.restored(self.restored_from, restored_time)
        if self.restored_from is not None:
            changed = check_restored_tools(values, self.tool_digests, checkpoint_id=self.restored_from,
                                           policy=self.config.fingerprint_policy, subtask=self.subtask)
            self.counters["tools_changed"].inc(len(changed))
        if self.restored_from is not None and self.config.replay is None:  # a replay's runs are not production's
            self._take_lineage(restored_lineage(values) or self.lineage)
        self.journal.restore(values, job_id=self.job_id)
        self.waits.restored(waits_open(values, self.owned))
        self.counters["earlier_attempt_records_ignored"].inc(self.journal.earlier_attempt_records_ignored)  # fenced
        if self.journal.last_restore_ms is not None:
            self.restore_gauge.inc(int(self.journal.last_restore_ms))  # set: it starts at 0 in every attempt

    def snapshot_state(self, checkpoint_id: int, timestamp_ms: int) -> bytes | None:
        """The recovery marker: per owned partition, the first offset a restore from here must read."""
        self.epochs.checkpoint(timestamp_ms)  # runs started after this barrier belong after this checkpoint
        for observer in self.observers:
            observer.checkpoint(checkpoint_id=checkpoint_id, checkpoint_time_ms=timestamp_ms, subtask=self.subtask,
                                partitions=self.owned)
        in_flight = self.runs.in_flight()
        expired = self.journal.expire_histories(in_flight)  # before the marker: expired records are not kept
        if expired:
            self.counters["histories_expired"].inc(expired)
        return self.journal.snapshot(checkpoint_id, in_flight, checkpoint_time_ms=timestamp_ms,
                                     waits_open=self.waits.open_by_group, tools=self.tool_digests,
                                     lineage=self.lineage)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Delete the journal records this checkpoint made unnecessary."""
        pruned = self.journal.completed(checkpoint_id)
        if pruned:
            self.counters["journal_records_pruned"].inc(pruned)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """An aborted checkpoint prunes nothing."""
        self.journal.aborted(checkpoint_id)

    # -- records and timers ------------------------------------------------------------------------
    def process_element(self, value, ctx):
        key = ctx.get_current_key()
        if isinstance(value, KeyedInput):  # inputs keyed next to decisions (connect_to_agent(signals=...))
            value = value.value
        elif isinstance(value, (Signal, MalformedSignal)):
            yield from self._emit(self.waits.on_signal(value, ctx))
            return
        elif isinstance(value, CapturedRunEnd):  # a replay: production finished this run after the savepoint
            self.waits.resume_in_replay(key, value.seq, ctx)
            return
        # A record with a traceparent header comes wrapped (records_from_kafka): the agent sees the record itself.
        traceparent = traceparent_of(value)
        waiting = self.mode.admit(untraced(value), ctx.timestamp(), self._accepted_seq)
        if waiting is None:  # the restored state already holds this input
            return
        if traceparent is not None:
            waiting = replace(waiting, traceparent=traceparent)
        if self.in_flight_state.value() is not None:
            self.pending_state.add(encode_waiting(waiting))  # one run per key: wait, in order
            if self.runs.has(key) or not self.waits.any_parked():  # behind a wait, it must not hold the decision
                self.hold.queued(key)
            return
        if self.order.recorded_next_input(key) is not None:
            # The recorded order decides which input is next.
            self.pending_state.add(encode_waiting(waiting))
            self._start_next(key, ctx)
            return
        self._start(key, waiting, ctx)
        yield from ()

    def on_timer(self, timestamp, ctx):
        key = ctx.get_current_key()
        self.hold.runs_waiting_for_slot(self.runs.waiting_for_slot())  # a slot may have freed since the hold
        own_check = self._checks.get(key) == timestamp  # the key's check timer, not a wake-up or an order timer
        if own_check:
            # Fired: forgotten, so the key's next check is registered anew. A timer may fire while time.time()
            # still reads below its timestamp, and the entry would make _schedule_check skip the registration.
            del self._checks[key]
        draining = ctx.time_domain() == TimeDomain.EVENT_TIME
        if draining and self.mode.report_failures and self.waits.any_parked():
            self._end_parked(key, ctx)  # a replay's end: its policy decides them, or its capture shows them waiting
        applies = not draining and self.runs.has(key) and self.runs.done(key)
        if not draining and not applies:
            # The wake-up or check that applies a finished run (the hot path) reads no wait state: deadlines are a
            # parked run's, which holds its key with no run under way, and an expiry falling on that moment waits
            # for the next. (Runs kept aside are not: see below.)
            yield from self._emit(self.waits.on_timer(key, timestamp, ctx))
        raw = self.in_flight_state.value()
        if raw is None:
            if self.order.wait_over(timestamp, draining):
                self.order.give_up(key, "the input ended" if draining else "timed out")
                self._start_next(key, ctx)
            return
        if not self.runs.has(key) and not self._resubmit(key, raw, ctx):
            return  # parked: its decision or its deadline resumes it
        # At the end of a bounded input (draining), wait for the run, so no output is lost.
        if not self.runs.done(key, wait_for_it=draining):
            if own_check:
                self._schedule_check(key, ctx)
            return
        self._count_applied("runs_drained" if draining else "runs_checked" if own_check else "runs_woken")
        self._settle(key)
        yield from self._applied(key, self.runs.finished(key), ctx)
        if applies and self._keeps_runs_aside() and self.waits.any_parked():
            # A run kept aside may have its deadline at this very timer, which the hot path above passed by.
            yield from self._emit(self.waits.on_timer(key, timestamp, ctx))

    def _applied(self, key, result: RunResult, ctx):
        """The key's run ended: park it at its wait, or apply it and start the key's next input."""
        if result.waiting is not None:
            # Before the park registers the wait's deadline: Flink keeps one timer per key and time, and
            # deleting a check that fell on the deadline's millisecond would delete the deadline too.
            self._drop_check(key, ctx)
            yield from self._park(key, result, ctx)
            return
        yield from self._apply(key, result, ctx)
        # Also when draining: _start re-registers the drain timer, which fires later in the same
        # final-watermark pass (Flink re-reads its timer queue), so keys keep running concurrently.
        self._start_next(key, ctx)
        if not self.runs.has(key):
            self._drop_check(key, ctx)  # the key is idle: its check would only fire to find nothing

    def _resubmit(self, key, raw: bytes, ctx) -> bool:
        """The key has a run in flight in state and none under way (restored from a checkpoint): submit it again,
        resumed if it was parked with its decision; ``False`` if it stays parked, waiting for one."""
        in_flight = decode_in_flight(raw)
        if self.waits.is_parked(in_flight.seq):
            decided = self.waits.decision_for(in_flight.seq)
            if decided is None:
                return False
            self._submit_resumed(key, *decided, ctx)
            return True
        # It keeps its epoch; one saved before epochs were kept was in flight at the checkpoint restored.
        epoch = in_flight.epoch if in_flight.epoch is not None else self.epochs.of_restored_run()
        self._submit(key, in_flight.seq, _waiting(in_flight), ctx, epoch)
        return True

    # -- runs --------------------------------------------------------------------------------------
    def _start_next(self, key, ctx) -> None:
        """Start the key's next waiting input: the one the journal recorded next, else the first to arrive; a
        parked run kept aside whose decision came goes first (or where the journal recorded it)."""
        if self.waits.any_parked() and self._resume_next(key, ctx):
            return
        waiting = list(self.pending_state.get() or [])
        kept = self.mode.drop_held(waiting, self._accepted_seq)
        if len(kept) != len(waiting):
            self.pending_state.update(kept)
        chosen = self.order.take_next(key, kept, ctx)
        self.hold.left(key, len(kept) - (chosen is not None))
        if chosen is not None:
            self._start(key, chosen, ctx)

    def _accepted_seq(self) -> int:
        """The seq of the current key's last accepted input (0: none yet)."""
        return self.seq_state.value() or 0

    def _start(self, key, waiting: WaitingInput, ctx) -> None:
        seq = self.mode.seq_for(key, waiting, self._accepted_seq() + 1)
        self.seq_state.update(seq)
        epoch = self.epochs.current
        self.in_flight_state.update(encode_in_flight(InFlightInput(seq, waiting.value, waiting.event_time, epoch,
                                                                   traceparent=waiting.traceparent)))
        ctx.timer_service().register_event_time_timer(DRAIN_TIMER)
        group = key_group(key, self.key_type, self.max_parallelism)
        for observer in self.observers:
            observer.input_accepted(key=key, group=group, seq=seq, value=waiting.value,
                                    event_time=waiting.event_time, traceparent=waiting.traceparent)
        self._submit(key, seq, waiting, ctx, epoch)

    def _resume(self, key, waiting_run: WaitingRun, decision, ctx) -> None:
        """A parked run has its decision (:mod:`flink_agents_replay.flink.waits`): submit it again now if it holds
        the key, or if it was kept aside and the key is idle (and the journal recorded no other step first);
        else it resumes when the key's run under way ends (:meth:`_resume_next`)."""
        raw = self.in_flight_state.value()
        if raw is not None:
            if decode_in_flight(raw).seq == waiting_run.seq and not self.runs.has(key):
                self._submit_resumed(key, waiting_run, decision, ctx)
            return
        recorded = self.order.recorded_resume(key)
        if recorded == waiting_run.seq or (recorded is None and self.order.recorded_next_input(key) is None):
            self.order.resuming()
            self._submit_resumed(key, waiting_run, decision, ctx)
        else:  # resumes after what the journal recorded first, or when that does not come back (bounded)
            self.order.hold_for_recorded(ctx)

    def _resume_next(self, key, ctx) -> bool:
        """The key is idle: resume a parked run kept aside that has its decision (the one the journal recorded
        resuming here, while a restore replays); whether one was."""
        recorded = self.order.recorded_resume(key)
        input_first = recorded is None and self.order.recorded_next_input(key) is not None
        candidates = [] if input_first else [recorded] if recorded is not None else self.waits.decided()
        for seq in candidates:
            decided = self.waits.decision_for(seq)
            if decided is not None and decided[0].kept_aside:
                self.order.resuming()
                self._submit_resumed(key, *decided, ctx)
                return True
        if recorded is not None or (input_first and self.waits.decided()):
            # The journal recorded a resume whose decision is not back, or an input before a decided run: wait
            # for it, bounded (order_restore_timeout_s), then the decided runs resume.
            self.order.hold_for_recorded(ctx)
        return False

    def _submit_resumed(self, key, waiting_run: WaitingRun, decision, ctx) -> None:
        """Submit a parked run again with its decision; it becomes the key's run in flight."""
        epoch = self.epochs.current  # what it does from now on belongs after the last checkpoint
        if waiting_run.kept_aside:
            in_flight = InFlightInput(waiting_run.seq, waiting_run.input, waiting_run.event_time, epoch,
                                      traceparent=waiting_run.traceparent)
        else:
            held = decode_in_flight(self.in_flight_state.value())
            in_flight = InFlightInput(held.seq, held.value, held.event_time, epoch, traceparent=held.traceparent)
        self.in_flight_state.update(encode_in_flight(in_flight))
        ctx.timer_service().register_event_time_timer(DRAIN_TIMER)
        self._resumed_kept_aside[key] = waiting_run.kept_aside
        self._submit(key, in_flight.seq, _waiting(in_flight), ctx, epoch, resume=(waiting_run, decision))

    def _submit(self, key, seq: int, waiting: WaitingInput, ctx, epoch: int, resume=None) -> None:
        kept_aside = resume is not None and resume[0].kept_aside
        raw_memory = resume[0].memory if kept_aside else self.memory_state.value()  # as the run started
        memory = decode_memory(raw_memory) if raw_memory is not None else {}
        group = key_group(key, self.key_type, self.max_parallelism)
        digest = key_digest(key)
        history = self.journal.history(digest)
        if history is not None and self.waits.any_parked():
            self._adopt_records(history, resuming=seq if resume is not None else None)
        journal = self.journal.run_journal(group)
        run = RunInput(key, group, seq, waiting.value, waiting.event_time, epoch, traceparent=waiting.traceparent)
        if resume is not None:
            waiting_run, decision = resume
            history = resume_history(waiting_run, history)
            run = RunInput(key, group, seq, waiting.value, waiting.event_time, epoch,
                           decisions={} if decision is None else {waiting_run.wait.wait_id: decision}, resuming=True,
                           resumed_after=self._accepted_seq() if kept_aside else None,
                           resumed_wait=waiting_run.wait.wait_id, traceparent=waiting.traceparent)
        gate = self.mode.gate_for(digest, seq)

        def execute() -> RunResult:
            return execute_run(self.agent, run, memory, history=history, journal=journal,
                               fingerprint_policy=self.config.fingerprint_policy, cancelled=self._stopping,
                               child_pool=self.runs.child_pool, gate=gate, report_failures=self.mode.report_failures,
                               acknowledge=False,  # group commit: the slot is free at once (RunPool.done)
                               trace=self.tracer is not None,
                               trace_content=self.tracer is not None and self.tracer.content)

        on_ready = None
        if self.wakeups is not None:
            token = self._tokens[key] = self.wakeups.remember_current_key()
            on_ready = functools.partial(self.wakeups.wake, token)
        self.runs.submit(key, RunInFlight(group, digest, seq, journal), execute, on_ready=on_ready)
        if self.wakeups is None:
            self.runs.await_slot()  # nothing could wake a held input: block until the run has a slot
        else:
            self.hold.runs_waiting_for_slot(self.runs.waiting_for_slot())
        self._schedule_check(key, ctx)

    def _adopt_records(self, history, resuming: int | None) -> None:
        """While a restore replays: what the journal holds of the key's parked runs (journaled after a resume, before
        the failure) goes into their parked entries: it travels with them, outlives the later runs that finish
        first, and the key's recovered history can end (a wait of days must not hold pruning back)."""
        for seq in self.waits.parked_seqs() - {resuming}:
            records = history.take_records(seq)
            if records:
                self.waits.add_records(seq, records)

    def _schedule_check(self, key, ctx) -> None:
        """Have the key's run check registered: the fallback behind wake-ups, or the polling interval without them.

        A check still pending from the key's last run serves this run too: it finds the run under way and
        registers the next; a key left idle deletes its check (:meth:`on_timer`). A timer registered and
        deleted per run was 3.5-6 % of a subtask's CPU at 0 ms calls (py-spy), where a busy key starts its next
        input at once. The clock is Flink's processing time (the wall clock), read without a call into Java.
        """
        now = int(time.time() * 1000)
        if self._checks.get(key, 0) > now:
            return
        interval = self.config.poll_interval_ms if self.wakeups is None else self.config.fallback_check_ms
        when = self._checks[key] = now + interval
        ctx.timer_service().register_processing_time_timer(when)

    def _drop_check(self, key, ctx) -> None:
        """Delete the key's pending check timer, if it has one."""
        when = self._checks.pop(key, None)
        # Flink keeps one timer per key and time: a check on a kept-aside run's deadline is the deadline too.
        if when is not None and not (self._keeps_runs_aside() and self.waits.any_parked()
                                     and self.waits.deadline_at(when)):
            ctx.timer_service().delete_processing_time_timer(when)

    def _keeps_runs_aside(self) -> bool:
        """Whether runs kept aside may be parked here: this job keeps them, or a restored one did (their deadlines
        are not protected by holding the key)."""
        return self.run_later_inputs or self.waits.kept_aside_seen

    def _count_applied(self, how: str) -> None:
        self.applied[how] += 1
        self.counters[how].inc()

    def _settle(self, key) -> None:
        """The key's run is about to be applied: drop its wake-up token. Its check timer is :meth:`on_timer`'s to
        keep for the key's next run or to delete if the key goes idle."""
        token = self._tokens.pop(key, None)
        if token is not None:
            self.wakeups.settle(token)

    def _emit(self, events):
        """The wait events, to the side output (``wait_events(outputs)``)."""
        for event in events:
            yield self._events_tag, event

    def _count(self, result: RunResult) -> None:
        for name, value in result.stats.as_dict().items():
            if value and name in self.counters:
                self.counters[name].inc(value)
        self.totals.add(result.stats)

    def _park(self, key, result: RunResult, ctx):
        """The run stopped at a wait: nothing of it is applied. It holds the key until its decision, or, with
        ``later_inputs_while_waiting="run"``, it is kept aside with its input and the memory it started with, and
        the key's next input starts. (In a replay only a wait its gate leaves open parks: one production never
        decided either.)"""
        # The drain timer stays: a bounded input ends with the run parked, and a replay reports it then.
        ctx.timer_service().register_event_time_timer(DRAIN_TIMER)
        self._resumed_kept_aside.pop(key, None)
        self._count(result)
        self.journal.run_applied(key_digest(key))
        group = key_group(key, self.key_type, self.max_parallelism)
        for observer in self.observers:
            observer.run_parked(key=key, group=group, result=result)
        waiting = self._kept_aside(result.waiting)
        if waiting.kept_aside:
            self.in_flight_state.clear()
        else:
            self.hold.left(key, 0)  # the inputs behind it wait for the decision, uncounted
        yield from self._emit(self.waits.park(key, group, waiting, ctx))
        if waiting.kept_aside and self.in_flight_state.value() is None:  # its decision may have resumed it at once
            self._start_next(key, ctx)

    def _end_parked(self, key, ctx) -> None:
        """The end of a replay's input with runs of the key still parked (restored parked from the savepoint, and
        production never finished them): resumed, for the gate to decide, when the replay's wait policy decides
        every wait; else reported to the observers, so the replay's capture, and its diff, show them waiting."""
        if self.mode.decides_parked_at_end:
            for seq in sorted(self.waits.parked_seqs()):
                self.waits.resume_in_replay(key, seq, ctx)
            return
        group = key_group(key, self.key_type, self.max_parallelism)
        raw = self.in_flight_state.value()
        held = decode_in_flight(raw) if raw is not None else None
        for seq in sorted(self.waits.parked_seqs()):
            if self.runs.has(key) and held is not None and held.seq == seq:
                continue  # resumed, under way: it ends as a run
            waiting = self.waits.parked(seq)
            value = waiting.input if waiting.kept_aside else held.value if held is not None else None
            calls = [record for record in waiting.records if isinstance(record, CallRecord)]
            still = RunResult(seq, {}, [], RunStats(), calls, [], digest_value(value), waiting=waiting)
            for observer in self.observers:
                observer.run_parked(key=key, group=group, result=still)

    def _kept_aside(self, waiting: WaitingRun) -> WaitingRun:
        """``waiting`` as it parks: kept aside with its input and the memory it started with if the key's later
        inputs run meanwhile (a resumed run keeps what it was parked with the first time)."""
        earlier = self.waits.parked(waiting.seq)
        if earlier is not None:
            return replace(waiting, input=earlier.input, event_time=earlier.event_time, memory=earlier.memory,
                           kept_aside=earlier.kept_aside, traceparent=earlier.traceparent)
        if not self.run_later_inputs:
            return waiting
        in_flight = decode_in_flight(self.in_flight_state.value())
        return replace(waiting, input=in_flight.value, event_time=in_flight.event_time,
                       memory=self.memory_state.value(), kept_aside=True, traceparent=in_flight.traceparent)

    def _apply(self, key, result: RunResult, ctx):
        memory = result.memory
        if key in self._resumed_kept_aside:
            if self._resumed_kept_aside.pop(key):  # kept aside: its writes go over what the key's later runs wrote
                memory = _written_over(self.memory_state.value(), result.memory_updates)
            yield from self._emit(self.waits.finished(key, key_group(key, self.key_type, self.max_parallelism),
                                                      result.seq, ctx, reason=result.error, calls=result.calls))
        self.memory_state.update(encode_memory(memory, what=f"the memory of key {key!r} after input {result.seq}"))
        self.in_flight_state.clear()
        if not (self._keeps_runs_aside() and self.waits.any_parked()):  # a key's parked runs keep theirs
            ctx.timer_service().delete_event_time_timer(DRAIN_TIMER)
        self._count(result)
        if result.error is not None:  # a replay's reported failure, or a run its wait's timeout or denial ended
            self.counters["replay_runs_failed" if self.mode.report_failures else "runs_ended_at_wait"].inc()
        group = key_group(key, self.key_type, self.max_parallelism)
        for observer in self.observers:
            observer.run_applied(key=key, group=group, result=result)
        if self.journal.run_applied(key_digest(key)):
            log.info("subtask %d: recovered journal fully replayed; so far %s", self.subtask,
                     describe_stats(self.totals))
        for output in result.outputs:
            yield AgentOutput(key, result.seq, output.id, output.output)


def _waiting(in_flight: InFlightInput) -> WaitingInput:
    """The input of a run in flight, as the run takes it (with its traceparent)."""
    return WaitingInput(in_flight.value, in_flight.event_time, traceparent=in_flight.traceparent)


def _written_over(raw_memory: bytes | None, updates) -> dict:
    """The key's memory (state bytes) with a run's memory updates applied over it, in order."""
    memory = Memory(decode_memory(raw_memory) if raw_memory is not None else {})
    memory.apply(updates)
    return memory.data


def _all_resources(agent) -> list:
    """The resources of ``agent`` and of its sub-agents, each once (a resource may be shared)."""
    found: dict[int, object] = {}
    seen: set[int] = set()
    pending = [agent] if agent is not None else []
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.update((id(resource), resource) for resource in current.resources.values())
        pending.extend(current.sub_agents.values())
    return list(found.values())
