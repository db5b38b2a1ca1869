"""ActionExecutionOperator: runs an agent per input inside Flink, journals it, and reuses the journal.

Per key, Flink keyed state holds the seq of the last accepted input, the short-term memory, the run in
flight (its seq and input) and the inputs waiting behind it. Runs of *different* keys execute
concurrently on a thread pool (``max_concurrent_runs`` per subtask); Flink state is touched only on the
task thread, which keyed processing-time timers bring back to a key to apply a finished run: write its
memory, emit its outputs, start the key's next input. At a checkpoint, a run in flight is just keyed
state; after a restore its timer fires, the run is not in memory, and it is submitted again — reusing
every call and action it had journaled, so it repeats no effect.

Checkpoint hooks (through the checkpoint bridge, see :mod:`flink_agents_replay.checkpoint_bridge`):

* ``initialize_state``: take, per owned journal partition, the offset recorded at the checkpoint and
  read the partition from there into a recovery index (docs/design.md §5.1).
* ``snapshot_state``: flush the producer; the marker is, per owned partition, the next offset, lowered
  to the first record of any run still in flight and of any recovered history not yet replayed.
* ``notify_checkpoint_complete``: delete journal records below that checkpoint's marker (docs/design.md §7).

With capture on (docs/design.md §4, §9), every accepted input and every applied run also go to the capture
topic, and ``snapshot_state`` writes the checkpoint's capture offsets to the manifest. In replay mode
(``config.replay``) the operator reads production's journal (never writing it) to finish the runs in
flight in the savepoint, applies the side-effect policy to every call, serves ``recorded`` calls from
production's capture, drops captured inputs the savepoint already holds, reports a failed run instead of
failing the job, and neither writes markers nor prunes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, TimeDomain
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor

from flink_agents_replay.agent import Agent
from flink_agents_replay.capture.manifest import CaptureDescription
from flink_agents_replay.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.capture.records import CapturedInput, CapturedOutput, CapturedRun
from flink_agents_replay.capture.schemas import capture_codec
from flink_agents_replay.capture.writer import CaptureWriter
from flink_agents_replay.child_pool import ChildCallPool
from flink_agents_replay.config import AgentConfig
from flink_agents_replay.digest import digest_value
from flink_agents_replay.engine import RunInput, RunResult, RunStats, execute_run
from flink_agents_replay.errors import JournalGapError, RunSlotTimeoutError
from flink_agents_replay.formats.state import (
    InFlightInput,
    WaitingInput,
    decode_in_flight,
    decode_memory,
    decode_waiting,
    encode_in_flight,
    encode_memory,
    encode_waiting,
)
from flink_agents_replay.journal.attempts import read_job_history, write_attempt_records
from flink_agents_replay.journal.index import RecoveryIndex
from flink_agents_replay.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.journal.markers import PruneTracker, build_marker, encode_marker, plan_restore
from flink_agents_replay.journal.recovery import read_recovery_index
from flink_agents_replay.journal.transfer import moved_journal_refusal
from flink_agents_replay.journal.writer import JournalWriter, RunJournal, max_record_bytes
from flink_agents_replay.keygroups import key_group, key_group_range
from flink_agents_replay.records.codec import FORMAT_VERSION, RecordCodec
from flink_agents_replay.records.journal import CallRecord, RunPosition, key_digest
from flink_agents_replay.replay.gate import ReplayCalls
from flink_agents_replay.runtime_info import subtask_info

__all__ = ["ActionExecutionOperator", "AgentOutput"]

log = logging.getLogger("flink_agents_replay.operator")

#: Set to a file path to have every subtask append its log lines there (the worker's stderr is hard to find).
LOG_FILE_ENV = "FLINK_AGENTS_REPLAY_LOG_FILE"
_DRAIN_TIMER = 2**63 - 2  # event-time timer fired by the final watermark of a bounded input

_COUNTERS = ("actions_executed", "actions_reused", "calls_executed", "calls_reused", "calls_in_doubt",
             "divergences", "fingerprint_mismatches", "journal_records_pruned", "child_calls_executed",
             "child_calls_reused", "order_restore_timeouts", "inputs_reordered", "calls_recorded", "calls_blocked",
             "replay_inputs_skipped", "replay_runs_failed", "calls_retried_after_failure", "runs_abandoned")


@dataclass(frozen=True)
class AgentOutput:
    """One OutputEvent leaving the operator: the key, the input's seq, the event's id and its ``output``."""

    key: Any
    seq: int
    event_id: str
    output: Any


@dataclass
class _InFlight:
    seq: int
    future: Future
    journal: RunJournal | None


class ActionExecutionOperator(KeyedProcessFunction):
    """The agent operator (a thread-mode ``KeyedProcessFunction`` with checkpoint hooks).

    Built by :func:`flink_agents_replay.pipeline.connect_to_agent`; not usually constructed directly.
    """

    def __init__(self, agent: Agent, config: AgentConfig, key_type: str):
        self.agent = agent
        self.config = config
        self.key_type = key_type

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self, runtime_context) -> None:
        _configure_logging()
        info = subtask_info(runtime_context)
        self.subtask = info.index
        self.job_id = info.job_id
        self.max_parallelism = info.max_parallelism
        self.owned = key_group_range(info.index, info.parallelism, info.max_parallelism)
        self.seq_state = runtime_context.get_state(ValueStateDescriptor("seq", Types.LONG()))
        self.memory_state = runtime_context.get_state(ValueStateDescriptor("memory", Types.PICKLED_BYTE_ARRAY()))
        self.in_flight_state = runtime_context.get_state(
            ValueStateDescriptor("in_flight", Types.PICKLED_BYTE_ARRAY()))
        self.pending_state = runtime_context.get_list_state(ListStateDescriptor("pending", Types.PICKLED_BYTE_ARRAY()))
        # When a restored key waits for a recorded predecessor (docs/design.md §8): the deadline of that wait.
        self.order_wait_state = runtime_context.get_state(ValueStateDescriptor("order_wait_deadline", Types.LONG()))
        metrics = runtime_context.get_metrics_group().add_group("flink_agents_replay")
        self.counters = {name: metrics.counter(name) for name in _COUNTERS}
        # A counter holding a value, not a Python gauge: Flink reads gauges on its metrics thread, and a
        # gauge calling into the embedded interpreter from there crashes the JVM (seen with PyFlink 2.3).
        self.restore_gauge = metrics.counter("last_restore_duration_ms")
        self.last_restore_ms = 0
        self.totals = RunStats()
        self.pool = ThreadPoolExecutor(self.config.max_concurrent_runs, thread_name_prefix=f"agent-{self.subtask}")
        # Sub-agent calls never wait for a run slot: they have a pool of their own (see child_pool).
        self.child_pool = ChildCallPool(self.config.max_concurrent_child_calls,
                                        thread_name_prefix=f"sub-agent-{self.subtask}")
        # Pool sizes as counters holding a value (no Python gauges, see above), for dashboards.
        metrics.counter("run_pool_size").inc(self.config.max_concurrent_runs)
        metrics.counter("child_pool_size").inc(self.config.max_concurrent_child_calls)
        self.slots = threading.BoundedSemaphore(self.config.max_concurrent_runs)
        self.closing = threading.Event()
        self.runs: dict[Any, _InFlight] = {}
        self.index = RecoveryIndex()
        self.prunes = PruneTracker()
        self.restored = False
        self.store = self.writer = self.capture = self.production_journal = None
        self.replay = self.config.replay
        self.recorded_calls: dict[tuple[str, int], dict[tuple[str, str, int], CallRecord]] = {}
        if self.config.capture:
            self.capture = self._open_capture()
        if self.replay is not None and self.replay.production_journal_topic and self.config.journal_enabled:
            # Read-only: runs in flight in the savepoint finish with what production journaled.
            self.production_journal = KafkaJournalStore(
                self.config.kafka_settings(), self.replay.production_journal_topic, self.max_parallelism,
                create_topic=False, timeout_s=self.config.kafka_timeout_s)
        if self.config.journal_enabled:
            self.store = KafkaJournalStore(
                self.config.kafka_settings(), self.config.journal_topic, self.max_parallelism,
                create_topic=self.config.create_topic, replication_factor=self.config.replication_factor,
                topic_config=self.config.topic_config, timeout_s=self.config.kafka_timeout_s)
            codec = RecordCodec(self.config.signing_key_bytes, self.config.uid, event_types=self.agent.event_types())
            self.writer = JournalWriter(self.store, codec, self.config.durability, self.config.ack_timeout_s,
                                        max_record_bytes(self.config.kafka, self.store.max_message_bytes))

    def _open_capture(self) -> CaptureWriter:
        config = self.config
        description = CaptureDescription(config.uid, config.capture_topic, self.key_type, self.max_parallelism,
                                         FORMAT_VERSION, config.journal_topic if config.journal_enabled else None,
                                         tuple(config.output_topics))
        # A replay's capture feeds the diff, it is never replayed itself: no manifest.
        return CaptureWriter.to_kafka(
            config.kafka_settings(), description=description,
            codec=capture_codec(config.signing_key_bytes, config.uid), with_manifest=self.replay is None,
            create_topic=config.create_topic, replication_factor=config.replication_factor,
            topic_config=config.capture_topic_config, kafka_timeout_s=config.kafka_timeout_s,
            ack_timeout_s=config.ack_timeout_s)

    def _load_recorded_calls(self) -> None:
        """Replay: index the calls production made in the runs after the savepoint (owned partitions only)."""
        begun = time.monotonic()
        owned = set(self.owned)
        start = {p: o for p, o in self.replay.start_offsets.items() if p in owned}
        decoder = CaptureDecoder(self.config.signing_key_bytes, self.config.uid)
        runs = 0
        for record in read_capture(self.config.kafka, self.replay.production_capture_topic, self.max_parallelism,
                                   decoder, start=start, partitions_to_read=owned,
                                   timeout_s=self.config.kafka_timeout_s):
            if isinstance(record, CapturedRun):
                runs += 1
                self.recorded_calls[(key_digest(record.key), record.seq)] = {
                    (call.event_id, call.action, call.position): call for call in record.calls}
        log.info("subtask %d replay from checkpoint %s: read %d production runs (%d inputs with recorded calls) "
                 "from capture %s partitions %s in %.2f s", self.subtask, self.replay.checkpoint_id, runs,
                 len(self.recorded_calls), self.replay.production_capture_topic, _ranges(owned),
                 time.monotonic() - begun)

    def close(self) -> None:
        """Stop every run at its next action or call boundary, wait a bounded time for calls under way, release
        clients.

        Runs on cancellation, failure and stop-with-savepoint too (the checkpoint bridge sees to it), so no
        run of this attempt still calls or journals when the next attempt of the task reads the journal. A call
        that hangs past ``close_timeout_s`` is abandoned (counted, its run logged as in doubt) and its run can
        no longer journal: waiting longer would outlast Flink's ``task.cancellation.timeout``, which kills the
        TaskManager.
        """
        pool = getattr(self, "pool", None)
        if pool is not None:
            self.closing.set()
            pool.shutdown(wait=False, cancel_futures=True)
            self.child_pool.shutdown()
            self._abandon_hung_runs()
            log.info("subtask %d closing: %s", self.subtask, _describe(self.totals))
        if getattr(self, "writer", None) is not None:
            self.writer.close()
        for client in ("store", "capture", "production_journal"):
            if getattr(self, client, None) is not None:
                getattr(self, client).close()

    def _abandon_hung_runs(self) -> None:
        """Wait up to ``close_timeout_s`` for the runs still under way; count and log the ones that do not end."""
        futures = {run.future: key for key, run in self.runs.items()}
        _, hung = wait(futures, timeout=self.config.close_timeout_s)
        if hung:
            self.counters["runs_abandoned"].inc(len(hung))
            log.warning("subtask %d closing: %d runs still had a call under way after %.0f s (close_timeout_s) and "
                        "were abandoned; their calls are in doubt and the next attempt makes them again "
                        "(keys %s)", self.subtask, len(hung), self.config.close_timeout_s,
                        ", ".join(repr(futures[f]) for f in list(hung)[:10]))

    # -- checkpoint hooks --------------------------------------------------------------------------
    def initialize_state(self, values: list[bytes]) -> None:
        """Find this subtask's journal offsets in the restored markers and read the journal from them."""
        if self.replay is not None:
            self._load_recorded_calls()
        journal = self.production_journal if self.replay is not None else self.store
        if journal is None:
            return
        # A replay reads what is left of production's journal; what production pruned since the savepoint
        # is re-executed under the side-effect policy (with recorded calls from the capture).
        accept_gap = self.config.accept_reexecution_after_gap or self.replay is not None
        plan = plan_restore(values, self.owned)
        if plan.fresh:
            if self.replay is None:
                self._start_without_checkpoint()
            return
        offsets = dict(plan.offsets)
        begun = time.monotonic()
        refusal = self._moved_journal_refusal(journal, plan) if plan.topic_ids != {journal.topic_id} else None
        if refusal is not None:
            message = (f"the journal topic {journal.topic!r} is not the topic this checkpoint was taken with "
                       f"(topic id {journal.topic_id}, checkpoint: {sorted(plan.topic_ids)}): it was deleted and "
                       "recreated, so recorded actions are gone")
            if not accept_gap:
                raise JournalGapError(
                    f"{message}; set accept_reexecution_after_gap=True to run them again. If the journal was moved to "
                    "another Kafka cluster with `flink-agents-replay journal dump` and `journal load` (offsets kept), "
                    f"set accept_moved_journal_from={sorted(plan.topic_ids)[0]!r} instead (now: {refusal})")
            log.warning("%s; running them again (accept_reexecution_after_gap)", message)
            offsets = {}
        low = journal.start_offsets(offsets)
        gaps = {p: (offsets[p], low[p]) for p in offsets if offsets[p] < low[p]}
        if gaps:
            shown = ", ".join(f"partition {p}: needs {o}, earliest {lw}" for p, (o, lw) in sorted(gaps.items())[:5])
            message = (f"journal records this checkpoint needs were already deleted ({shown}); this happens when "
                       "restoring an older savepoint after later checkpoints pruned the journal")
            if not accept_gap:
                raise JournalGapError(message + ". Actions in that gap would run again: set "
                                      "accept_reexecution_after_gap=True to accept that")
            log.warning("%s; reading from the earliest records (accept_reexecution_after_gap)", message)
            offsets.update({p: low[p] for p in gaps})
        end = journal.end_offsets(offsets)
        # A replay takes only what the savepoint's runs in flight need, not production's later runs (design §9).
        keep = plan.needed_by_replay if self.replay is not None else plan.needs
        self.index = read_recovery_index(journal, self.writer.codec, offsets, end, keep=keep)
        self.restored = True
        self.last_restore_ms = (time.monotonic() - begun) * 1000
        self.restore_gauge.inc(int(self.last_restore_ms))  # set: it starts at 0 in every attempt
        log.info("subtask %d restored: read %d journal records for %d keys from partitions %s in %.2f s; "
                 "%d runs were in flight at the checkpoint", self.subtask, self.index.records_read, len(self.index),
                 _ranges(offsets), self.last_restore_ms / 1000, len(plan.in_flight))

    def _moved_journal_refusal(self, journal: KafkaJournalStore, plan) -> str | None:
        """Why ``accept_moved_journal_from`` does not let this checkpoint of another topic id restore; ``None``
        when it does (a journal moved with offsets kept, :mod:`flink_agents_replay.journal.transfer`)."""
        refusal = moved_journal_refusal(
            marker_topic_ids=plan.topic_ids, current_topic_id=journal.topic_id,
            accepted_from=self.config.accept_moved_journal_from, marker_ends=plan.barrier_ends,
            current_ends=journal.end_offsets(self.owned), owned=self.owned)
        if refusal is None:
            log.info("subtask %d: accepted the moved journal %s (topic id %s -> %s, accept_moved_journal_from)",
                     self.subtask, journal.topic, ", ".join(sorted(plan.topic_ids)), journal.topic_id)
        return refusal

    def _start_without_checkpoint(self) -> None:
        """No checkpoint: reuse what earlier attempts of this job wrote, if any; then mark this attempt's start.

        See :mod:`flink_agents_replay.journal.attempts` for how records are tied to a job.
        """
        if self.job_id is None:
            log.warning("subtask %d: the job id is unknown here, so a restart before the first checkpoint will run "
                        "its inputs' calls again", self.subtask)
            return
        begun = time.monotonic()
        job_id = self.job_id
        found = read_job_history(self.store, self.writer.codec, self.owned,
                                 {job_id} | ({self.config.continue_job} if self.config.continue_job else set()))
        attempt = found.last_attempt + 1
        if found.found:
            self.index = found.index
            self.restored = True
            self.last_restore_ms = (time.monotonic() - begun) * 1000
            self.restore_gauge.inc(int(self.last_restore_ms))
            log.info("subtask %d restored: read %d journal records for %d keys from partitions %s in %.2f s; job %s "
                     "restarted before its first completed checkpoint (attempt %d): the records of its earlier "
                     "attempts are reused", self.subtask, found.index.records_read - found.other_records,
                     len(found.index), _ranges(found.starts), self.last_restore_ms / 1000, job_id, attempt)
        else:
            log.info("subtask %d: fresh start of job %s, no checkpoint and no earlier attempt in the journal "
                     "(partitions %s); %d records of earlier jobs are not reused", self.subtask, job_id,
                     _ranges(self.owned), found.other_records)
        write_attempt_records(self.writer, self.owned, job_id, attempt, self.subtask)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        """The recovery marker: per owned partition, the first offset a restore from here must read."""
        if self.capture is not None:
            self.capture.checkpoint(checkpoint_id, self.subtask, self.owned)
        if self.store is None or self.replay is not None:  # a replay is run again from the savepoint, not resumed
            return None
        self.store.flush(self.config.ack_timeout_s)
        ends = self.store.end_offsets(self.owned)
        in_flight: dict[int, list[tuple[str, int]]] = {}
        firsts = []
        for key, run in self.runs.items():
            group = key_group(key, self.key_type, self.max_parallelism)
            in_flight.setdefault(group, []).append((key_digest(key), run.seq))
            first = run.journal.first_offset(self.config.ack_timeout_s) if run.journal is not None else None
            if first is not None:
                firsts.append((group, first))
        marker = build_marker(ends, firsts, self.index.floor_offsets())
        self.prunes.remember(checkpoint_id, marker)
        return encode_marker(self.store.topic_id, self.subtask, marker, ends, in_flight, self.index.unreplayed())

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Delete the journal records this checkpoint made unnecessary."""
        if self.store is None or self.replay is not None:
            return
        low = None if self.prunes.seeded else self.store.start_offsets(self.owned)
        deletions = self.prunes.complete(checkpoint_id, low)
        if deletions:
            self.store.delete_before(deletions)
            self.counters["journal_records_pruned"].inc(self.prunes.pruned(deletions))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """An aborted checkpoint prunes nothing."""
        self.prunes.abort(checkpoint_id)

    # -- records and timers ------------------------------------------------------------------------
    def process_element(self, value, ctx):
        key = ctx.get_current_key()
        waiting = WaitingInput(value, ctx.timestamp())
        if self.replay is not None and isinstance(value, CapturedInput):  # production's seq and event time
            waiting = WaitingInput(value.payload, value.event_time, value.seq)
            if self._held_by_savepoint(waiting):
                return
        if self.in_flight_state.value() is not None:
            self.pending_state.add(encode_waiting(waiting))  # one run per key: wait, in order
            return
        if self._recorded_next_input(key) is not None:
            # The recorded order decides which input is next.
            self.pending_state.add(encode_waiting(waiting))
            self._start_next(key, ctx)
            return
        self._start(key, waiting, ctx)
        yield from ()

    def _held_by_savepoint(self, waiting: WaitingInput) -> bool:
        """Replay: whether production had accepted this captured input before the savepoint (or the restored
        key has started it since): the savepoint's state already accounts for it."""
        if waiting.captured_seq is None or waiting.captured_seq > (self.seq_state.value() or 0):
            return False
        self.counters["replay_inputs_skipped"].inc()
        return True

    def on_timer(self, timestamp, ctx):
        key = ctx.get_current_key()
        raw = self.in_flight_state.value()
        draining = ctx.time_domain() == TimeDomain.EVENT_TIME
        if raw is None:
            deadline = self.order_wait_state.value()
            if deadline is not None and (draining or timestamp >= deadline):
                self._order_wait_timed_out(key, "the input ended" if draining else "timed out", ctx)
            return
        run = self.runs.get(key)
        if run is None:  # restored from a checkpoint with this run in flight: submit it again
            in_flight = decode_in_flight(raw)
            self._submit(key, in_flight.seq, WaitingInput(in_flight.value, in_flight.event_time), ctx)
            run = self.runs[key]
        if not run.future.done():
            if not draining:
                self._schedule_check(ctx)
                return
            run.future.exception()  # end of a bounded input: wait, so no output is lost
        try:
            result: RunResult = self.runs.pop(key).future.result()  # an action's exception fails the task here
        except Exception:
            raise
        except BaseException as exc:  # SystemExit and the like inside an action: fail the task as any error would
            raise RuntimeError(f"the run of key {key!r} ended with {type(exc).__name__}: {exc}") from exc
        yield from self._apply(key, result, ctx)
        # Also when draining: _start re-registers the drain timer, which fires later in the same
        # final-watermark pass (Flink re-reads its timer queue), so keys keep running concurrently.
        self._start_next(key, ctx)

    # -- order restoration (docs/design.md §8) ------------------------------------------------------------
    def _recorded_next_input(self, key) -> str | None:
        """While a restore replays: the digest of the input the journal recorded as ``key``'s next one, or
        ``None`` when any input may run next (nothing recorded there, or order restoration is off)."""
        if not (self.restored and self.config.restore_input_order) or self.replay is not None:
            return None  # a replay's order is the capture's
        history = self.index.history(key_digest(key))
        return history.recorded_input((self.seq_state.value() or 0) + 1) if history is not None else None

    def _start_next(self, key, ctx) -> None:
        """Start the key's next waiting input: the one the journal recorded next, else the first to arrive."""
        waiting = list(self.pending_state.get() or [])
        if self.replay is not None:
            kept = [raw for raw in waiting if not self._held_by_savepoint(decode_waiting(raw))]
            if len(kept) != len(waiting):
                self.pending_state.update(kept)
                waiting = kept
        if not waiting:
            return
        expected = self._recorded_next_input(key)
        chosen = 0 if expected is None else next(
            (i for i, raw in enumerate(waiting) if digest_value(decode_waiting(raw).value) == expected), None)
        if chosen is None:  # its recorded predecessor has not come back yet: wait for it (bounded)
            self._await_predecessor(ctx)
            return
        if chosen:
            self.counters["inputs_reordered"].inc()
        if self.restored:  # only a restored key can be waiting (its history keeps the index non-empty)
            self._end_order_wait(ctx)
        self.pending_state.update(waiting[:chosen] + waiting[chosen + 1:])
        self._start(key, decode_waiting(waiting[chosen]), ctx)

    def _await_predecessor(self, ctx) -> None:
        if self.order_wait_state.value() is not None:
            return
        deadline = ctx.timer_service().current_processing_time() + int(self.config.order_restore_timeout_s * 1000)
        self.order_wait_state.update(deadline)
        ctx.timer_service().register_processing_time_timer(deadline)
        ctx.timer_service().register_event_time_timer(_DRAIN_TIMER)  # a bounded input's end ends the wait too

    def _end_order_wait(self, ctx) -> None:
        deadline = self.order_wait_state.value()
        if deadline is not None:
            self.order_wait_state.clear()
            ctx.timer_service().delete_processing_time_timer(deadline)

    def _order_wait_timed_out(self, key, why: str, ctx) -> None:
        """A recorded input never came back: drop the key's recorded history from there, run what waits."""
        next_seq = (self.seq_state.value() or 0) + 1
        history = self.index.history(key_digest(key))
        dropped = history.drop_after(RunPosition(next_seq - 1, 2**62)) if history is not None else 0
        waiting = len(list(self.pending_state.get() or []))
        self.counters["order_restore_timeouts"].inc()
        log.warning("subtask %d key %r: order restore %s after %.1f s waiting for the input recorded at seq %d; "
                    "the key's recorded history from there on is invalidated (%d records) and its %d waiting "
                    "inputs run in arrival order", self.subtask, key, why, self.config.order_restore_timeout_s,
                    next_seq, dropped, waiting)
        self.order_wait_state.clear()
        self.index.forget_if_empty(key_digest(key))
        self._start_next(key, ctx)

    # -- internals ---------------------------------------------------------------------------------
    def _start(self, key, waiting: WaitingInput, ctx) -> None:
        seq = (self.seq_state.value() or 0) + 1
        if waiting.captured_seq is not None and waiting.captured_seq != seq:
            # The capture lacks inputs in between (lost before a failure): keep production's numbering.
            log.warning("subtask %d key %r: captured input has seq %d, expected %d; running it as seq %d",
                        self.subtask, key, waiting.captured_seq, seq, waiting.captured_seq)
            seq = waiting.captured_seq
        self.seq_state.update(seq)
        self.in_flight_state.update(encode_in_flight(InFlightInput(seq, waiting.value, waiting.event_time)))
        ctx.timer_service().register_event_time_timer(_DRAIN_TIMER)
        if self.capture is not None:
            group = key_group(key, self.key_type, self.max_parallelism)
            self.capture.write_input(group, CapturedInput(key, seq, waiting.event_time, waiting.value,
                                                          digest_value(waiting.value)))
        self._submit(key, seq, waiting, ctx)

    def _submit(self, key, seq: int, waiting: WaitingInput, ctx) -> None:
        if not self.slots.acquire(timeout=self.config.slot_wait_timeout_s):
            raise RunSlotTimeoutError(f"no agent run finished within {self.config.slot_wait_timeout_s:.0f} s "
                              f"(max_concurrent_runs={self.config.max_concurrent_runs}); a call may hang")
        raw_memory = self.memory_state.value()
        memory = decode_memory(raw_memory) if raw_memory is not None else {}
        group = key_group(key, self.key_type, self.max_parallelism)
        digest = key_digest(key)
        history = self.index.history(digest) if self.restored else None
        journal = self.writer.run_journal(group) if self.writer is not None else None
        run = RunInput(key, group, seq, waiting.value, waiting.event_time)
        replay = None
        if self.replay is not None:
            replay = ReplayCalls(dict(self.replay.policies), self.recorded_calls.pop((digest, seq), {}),
                                 f"replay:{self.config.journal_topic}:")

        def execute() -> RunResult:
            try:
                return execute_run(self.agent, run, memory, history=history, journal=journal,
                                   fingerprint_policy=self.config.fingerprint_policy, cancelled=self.closing.is_set,
                                   child_pool=self.child_pool, gate=replay, report_failures=replay is not None)
            finally:
                self.slots.release()

        self.runs[key] = _InFlight(seq, self.pool.submit(execute), journal)
        self._schedule_check(ctx)

    def _schedule_check(self, ctx) -> None:
        now = ctx.timer_service().current_processing_time()
        ctx.timer_service().register_processing_time_timer(now + self.config.poll_interval_ms)

    def _apply(self, key, result: RunResult, ctx):
        self.memory_state.update(encode_memory(result.memory, what=f"the memory of key {key!r} after input "
                                                                  f"{result.seq}"))
        self.in_flight_state.clear()
        ctx.timer_service().delete_event_time_timer(_DRAIN_TIMER)
        for name, value in result.stats.as_dict().items():
            if value and name in self.counters:
                self.counters[name].inc(value)
        if result.error is not None:
            self.counters["replay_runs_failed"].inc()
        if self.capture is not None:
            self.capture.write_run(key_group(key, self.key_type, self.max_parallelism), CapturedRun(
                key, result.seq, result.input_digest, [CapturedOutput(o.id, o.output) for o in result.outputs],
                result.calls, result.blocked, result.error))
        self.totals.add(result.stats)
        if self.restored:
            self.index.forget_if_empty(key_digest(key))
            if not len(self.index):
                self.restored = False
                log.info("subtask %d: recovered journal fully replayed; so far %s", self.subtask,
                         _describe(self.totals))
        for output in result.outputs:
            yield AgentOutput(key, result.seq, output.id, output.output)


_LOGGING_SET_UP = threading.Lock()


def _configure_logging() -> None:
    """Make the operator's INFO lines visible: to $FLINK_AGENTS_REPLAY_LOG_FILE, else to stderr (once per process:
    the handler is marked, so a second copy of this module does not add another and double every line)."""
    logger = logging.getLogger("flink_agents_replay")
    with _LOGGING_SET_UP:  # subtasks of one TaskManager open concurrently: check and add as one step
        if any(getattr(handler, "_flink_agents_replay", False) for handler in logger.handlers):
            return
        path = os.environ.get(LOG_FILE_ENV)
        handler = logging.FileHandler(path) if path else logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._flink_agents_replay = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _ranges(partitions) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2,5"``."""
    spans: list[list[int]] = []
    for p in sorted(partitions):
        if spans and p == spans[-1][1] + 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "none"


def _describe(stats: RunStats) -> str:
    return (f"actions executed {stats.actions_executed}, reused {stats.actions_reused}; calls executed "
            f"{stats.calls_executed}, reused {stats.calls_reused}, in doubt {stats.calls_in_doubt}; "
            f"sub-agent calls executed {stats.child_calls_executed}, reused {stats.child_calls_reused}; "
            f"divergences {stats.divergences}"
            + (f"; replay: calls served from production's capture {stats.calls_recorded}, blocked "
               f"{stats.calls_blocked}" if stats.calls_recorded or stats.calls_blocked else ""))
