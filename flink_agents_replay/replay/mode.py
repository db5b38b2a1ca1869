"""Replay as a plug-in of the agent operator: everything that makes the production operator a replay.

The operator asks its job mode at a few named points (see :mod:`flink_agents_replay.flink.mode`, whose
interface :class:`ReplayMode` implements structurally). A replay:

* is never resumed from its own checkpoints (``resumable`` is false): it writes no journal markers, prunes
  nothing, writes no attempt records and no capture manifest; it is run again from the savepoint;
* reads production's journal, read only, to finish the runs in flight in the savepoint
  (:meth:`~ReplayMode.journal_to_restore`);
* takes its inputs from production's capture: a :class:`~flink_agents_replay.storage.capture.records.CapturedInput`
  becomes a waiting input with production's seq and event time, and inputs the savepoint already holds
  (production had accepted them before the savepoint) are dropped (:meth:`~ReplayMode.admit`,
  :meth:`~ReplayMode.drop_held`); a key's order is the capture's (``restores_input_order`` is false);
* runs each input as the seq production gave it, warning when the capture lacks inputs in between;
* tells the live calls of resources that keep state outside the job (long-term memory) to read it as of the
  savepoint and to write into the replay's own overlay, named after the replay's capture topic
  (:class:`~flink_agents_replay.api.call_site.Fork`);
* gates every call of a run by the side-effect policy, serving ``recorded`` calls from what production's
  run of the same input made (:meth:`~ReplayMode.gate_for`, :class:`~.gate.ReplayCalls`), those calls
  loaded from the capture when the subtask opens: a finished run's, or, for a run production had parked at a
  wait and not finished when the capture ended, the calls it made before the wait (the gate then leaves that wait
  open: the replay's run parks too);
* reports a failed run in its capture (for the diff) instead of failing the job (``report_failures``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from flink_agents_replay.api.call_site import Fork
from flink_agents_replay.core.errors import NO_RESTART_MARKER, ReplayConfigError
from flink_agents_replay.integrations.kafka.settings import KafkaSettingsLike
from flink_agents_replay.replay.gate import ReplayCalls
from flink_agents_replay.replay.policy import WaitPolicy
from flink_agents_replay.replay.settings import ReplaySettings
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedParked, CapturedRun
from flink_agents_replay.storage.formats.state import WaitingInput, decode_waiting
from flink_agents_replay.storage.journal.checkpoints import describe_partitions
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.store import JournalStore
from flink_agents_replay.storage.records.journal import CallRecord, key_digest

__all__ = ["ReplayMode"]

log = logging.getLogger("flink_agents_replay.operator")

RecordedCalls = dict[tuple[str, str, int], CallRecord]  # (event id, action, position) -> production's call


class ReplayMode:
    """The job mode of a replay (see the module docstring).

    Args:
        settings: the replay's settings (production's capture and journal, start offsets, policies).
        kafka: the user's Kafka settings, passed to every client.
        signing_key, uid: what production's capture records are verified with.
        verification_keys: older signing keys still accepted (key rotation).
        journal_topic: the replay's own journal topic (its live calls' ids are prefixed with it).
        name: the replay's name (its capture topic): names its overlays of outside state.
        max_parallelism: the job's max parallelism (partitions of the capture and the journal).
        read_production_journal: whether the replay has a journal (then it reads production's).
        kafka_timeout_s: bound on start-up requests and reads.
    """

    resumable = False
    restores_input_order = False
    report_failures = True
    waits_time_out = False  # production's decisions, timeouts included, come from the gate

    @property
    def decides_parked_at_end(self) -> bool:
        """Approve-all and deny-all decide every wait: also those of runs parked in the savepoint that production
        never finished (resumed at the end of the input); ``recorded`` has no decision for them."""
        return self.settings.wait_policy is not WaitPolicy.RECORDED

    def __init__(self, *, settings: ReplaySettings, kafka: KafkaSettingsLike, signing_key: bytes, uid: str,
                 journal_topic: str | None, max_parallelism: int, read_production_journal: bool,
                 kafka_timeout_s: float, name: str, verification_keys: tuple[bytes, ...] = ()):
        self.settings = settings
        self.kafka = kafka
        self.signing_key = signing_key
        self.verification_keys = verification_keys
        self.uid = uid
        self.call_id_prefix = f"replay:{journal_topic}:"
        # Without the savepoint's time or id (settings built by hand), production's outside state is not read.
        self.fork = Fork(as_of=settings.memory_as_of, name=name)
        self.max_parallelism = max_parallelism
        self.read_production_journal = read_production_journal
        self.kafka_timeout_s = kafka_timeout_s
        self.production_journal: KafkaJournalStore | None = None
        self.recorded_calls: dict[tuple[str, int], RecordedCalls] = {}
        #: The runs production finished after the savepoint (key digest, seq): a wait of one of them that production
        #: recorded no decision for is blocked; one of a run production never finished stays open.
        self.finished_runs: set[tuple[str, int]] = set()
        self.counters: Mapping[str, Any] = {}
        self.subtask = 0

    def open(self, *, owned: range, subtask: int, counters: Mapping[str, Any]) -> None:
        """Open production's journal (read only) and load production's calls of the owned partitions."""
        self.subtask = subtask
        self.counters = counters
        if self.settings.production_journal_topic and self.read_production_journal:
            # Read-only: runs in flight in the savepoint finish with what production journaled.
            self.production_journal = KafkaJournalStore(
                self.kafka, self.settings.production_journal_topic, self.max_parallelism, create_topic=False,
                timeout_s=self.kafka_timeout_s)
        self._load_recorded_calls(owned)

    def _load_recorded_calls(self, owned: range) -> None:
        """Index the calls production made in the runs after the savepoint (owned partitions only): of each finished
        run, and of each run parked at a wait that production did not finish (its calls before the wait)."""
        begun = time.monotonic()
        partitions = set(owned)
        start = {p: o for p, o in self.settings.start_offsets.items() if p in partitions}
        decoder = CaptureDecoder(self.signing_key, self.uid, verification_keys=self.verification_keys)
        runs = 0
        for record in read_capture(self.kafka, self.settings.production_capture_topic, self.max_parallelism,
                                   decoder, start=start, partitions_to_read=partitions,
                                   timeout_s=self.kafka_timeout_s, skip_invalid=self._skip_invalid):
            identity = (key_digest(record.key), record.seq)
            if isinstance(record, CapturedRun):
                runs += 1
                self.finished_runs.add(identity)
            elif not isinstance(record, CapturedParked) or identity in self.finished_runs:
                continue  # an input; or a parked record of a run already finished (captured again after a failure)
            self.recorded_calls[identity] = {(call.event_id, call.action, call.position): call for call in record.calls}
        log.info("subtask %d replay from checkpoint %s: read %d production runs (%d inputs with recorded calls) "
                 "from capture %s partitions %s in %.2f s", self.subtask, self.settings.checkpoint_id, runs,
                 len(self.recorded_calls), self.settings.production_capture_topic, describe_partitions(partitions),
                 time.monotonic() - begun)

    def _skip_invalid(self, error: Exception) -> None:
        """A capture record that does not verify holds no call to serve: skipped, counted and logged (the replay's
        source sends it to the dead letters if it is an input)."""
        self.counters["replay_capture_records_skipped"].inc()
        log.warning("subtask %d replay: skipped a capture record that does not verify: %s", self.subtask, error)

    def journal_to_restore(self, own: JournalStore | None) -> JournalStore | None:
        """Production's journal: what is left of it finishes the savepoint's runs in flight; what production
        pruned since is re-executed under the side-effect policy."""
        return self.production_journal

    def restored(self, *, checkpoint_id: int, checkpoint_time_ms: int | None) -> None:
        """Refuse a savepoint that is not the checkpoint the capture manifest's entry describes: checkpoint ids
        restart with every job started without a savepoint, so on a capture topic two jobs shared, the manifest
        may name another job's checkpoint of the same id (its trigger time tells them apart)."""
        expected = self.settings.checkpoint_time_ms
        if expected is not None and checkpoint_time_ms is not None and expected != checkpoint_time_ms:
            raise ReplayConfigError(
                f"the savepoint's checkpoint {checkpoint_id} was taken at {checkpoint_time_ms}, but the capture "
                f"manifest of {self.settings.production_capture_topic!r} describes a checkpoint {checkpoint_id} "
                f"taken at {expected}, by another job on the same capture topic (the manifest kept only that job's "
                f"entries): give each job started without a savepoint its own capture topic {NO_RESTART_MARKER}")

    def admit(self, value: Any, event_time: int | None, accepted_seq: Callable[[], int]) -> WaitingInput | None:
        """A captured input as a waiting input with production's seq, event time and traceparent; ``None`` when the
        savepoint already holds it (the key had accepted that seq, ``accepted_seq()``)."""
        if not isinstance(value, CapturedInput):
            return WaitingInput(value, event_time)
        waiting = WaitingInput(value.payload, value.event_time, value.seq, traceparent=value.traceparent)
        return None if self._held_by_savepoint(waiting, accepted_seq()) else waiting

    def drop_held(self, waiting: list[bytes], accepted_seq: Callable[[], int]) -> list[bytes]:
        """The waiting inputs (encoded) the savepoint does not already hold."""
        accepted = accepted_seq()
        return [raw for raw in waiting if not self._held_by_savepoint(decode_waiting(raw), accepted)]

    def _held_by_savepoint(self, waiting: WaitingInput, accepted_seq: int) -> bool:
        """Whether production had accepted this captured input before the savepoint (or the restored key has
        started it since): the savepoint's state already accounts for it."""
        if waiting.captured_seq is None or waiting.captured_seq > accepted_seq:
            return False
        self.counters["replay_inputs_skipped"].inc()
        return True

    def seq_for(self, key: Any, waiting: WaitingInput, next_seq: int) -> int:
        """Production's seq of a captured input (the key's next seq otherwise)."""
        if waiting.captured_seq is None or waiting.captured_seq == next_seq:
            return next_seq
        # The capture lacks inputs in between (lost before a failure): keep production's numbering.
        log.warning("subtask %d key %r: captured input has seq %d, expected %d; running it as seq %d",
                    self.subtask, key, waiting.captured_seq, next_seq, waiting.captured_seq)
        return waiting.captured_seq

    def gate_for(self, key_digest: str, seq: int) -> ReplayCalls:
        """The side-effect policy for one run, with the calls production's run of the same input made, and whether
        production finished that run."""
        return ReplayCalls(dict(self.settings.policies), self.recorded_calls.pop((key_digest, seq), {}),
                           self.call_id_prefix, self.fork, self.settings.wait_policy,
                           production_finished=(key_digest, seq) in self.finished_runs)

    def close(self) -> None:
        """Release production's journal."""
        if self.production_journal is not None:
            self.production_journal.close()
