"""Writing journal records with the configured durability: group commit, acknowledged off the critical path.

Every run of a subtask appends to one shared producer, which batches the records of all of them
(librdkafka's ``linger.ms``/``batch.size``). A run waits for an acknowledgement only where the
guarantee needs one; the modes differ in where that is (docs/design.md, "durability modes"):

* ``per_run`` (default): no run ever waits on its own. A run's outputs leave the operator once its
  records are acknowledged, which the operator checks without blocking (:meth:`RunJournal.outputs_may_leave`):
  the run's slot is free for the next input while the acknowledgement travels. Suits any sink, including a
  non-transactional one: no output is seen outside before the journal holds what produced it.
* ``at_checkpoint``: outputs leave at once; the checkpoint's snapshot flushes the journal, so a checkpoint
  never completes with a record missing behind it. Suits an exactly-once (transactional) sink, which
  publishes outputs only when that checkpoint completes: an output of a run whose records were lost in a
  crash is aborted with its transaction. With a non-transactional sink an output could be seen and then
  produced differently by the re-executed run.
* ``per_action`` / ``per_call``: an action's completion / every record is acknowledged before the run
  goes on, then as ``per_run``. Fewer calls made again after a crash, a broker round trip per action or call.

In every mode a *started* record (external side effects) is acknowledged before its call is made, and
the outcome of such a call before the run makes its next call: once a run has gone on past an external
call's outcome (a tool loop's next model turn), that call is never made again (unless its exception
failed the action: then it is retried). Acknowledgements come in partition order (an idempotent
producer), so each wait also covers every earlier record of the key group. After a crash, a call whose
record was not yet acknowledged is made again by the next attempt (with the same idempotency key,
``ctx.call_id``); the counters ``calls_executed`` against a failure-free run, and a service that honours
the key, tell how many.

Every record a run writes carries this attempt's fence in its partition (:mod:`.fencing`), set by
:meth:`JournalWriter.begin_attempt` once the attempt's markers are acknowledged. With a
:class:`~.fence_watch.FenceWatch`, an external call's started record, once acknowledged, is followed by a check of
the fence topic before the call is made: a newer attempt of the task (Flink restored it elsewhere) refuses the call
and every later record of this one (:class:`~.fence_watch.AttemptFencedError`).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flink_agents_replay.core.errors import NO_RESTART_MARKER, JournalClosedError, JournalRecordTooLargeError
from flink_agents_replay.storage.journal.fence_watch import FenceWatch
from flink_agents_replay.storage.journal.store import Delivery, JournalStore
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import CallOutcome, RecordKind

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "Durability", "JournalClosedError", "JournalWriter", "RunJournal",
           "acknowledged_offset", "max_record_bytes"]

#: librdkafka's default ``message.max.bytes``; the broker's default ``max.message.bytes`` is a little more.
DEFAULT_MAX_RECORD_BYTES = 1_000_000
#: Room for the record key, headers and batch framing inside ``message.max.bytes``.
_FRAMING_BYTES = 512


def max_record_bytes(kafka_config: Mapping[str, Any], topic_limit: int | None = None) -> int:
    """The largest record Kafka takes: the producer's ``message.max.bytes`` (the user's setting, else the
    default), or the topic's ``max.message.bytes`` when that is smaller (the broker would refuse the rest)."""
    producer_limit = int(kafka_config.get("message.max.bytes", DEFAULT_MAX_RECORD_BYTES))
    return producer_limit if topic_limit is None else min(producer_limit, topic_limit)


class Durability(str, enum.Enum):
    """When journal records must be acknowledged."""

    PER_CALL = "per_call"
    PER_ACTION = "per_action"
    PER_RUN = "per_run"
    AT_CHECKPOINT = "at_checkpoint"

    @classmethod
    def _missing_(cls, value: object) -> Durability | None:
        return cls.PER_RUN if value == "per_bundle" else None  # 0.2's name of per_run


class JournalWriter:
    """Encodes records and appends them to a store; shared by all runs of a subtask (thread-safe)."""

    def __init__(self, store: JournalStore, codec: RecordCodec, durability: Durability | str,
                 ack_timeout_s: float = 60.0, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, *,
                 fence_watch: FenceWatch | None = None):
        self.store = store
        #: Checks the fence topic before each external call (``None``: no check, e.g. a replay or a test store).
        self.fence_watch = fence_watch
        self.codec = codec
        self.durability = Durability(durability)
        self.ack_timeout_s = ack_timeout_s
        self.max_record_bytes = max_record_bytes
        self._closed = False
        self._lock = threading.Lock()  # a write either lands before close() returns or is refused
        self.fences: dict[int, int] = {}  # partition -> this attempt's fence there (0: none, e.g. a replay)
        self._last: dict[int, Delivery] = {}  # partition -> its last record appended

    def begin_attempt(self, fences: Mapping[int, int]) -> None:
        """This attempt's markers are acknowledged: stamp its fences on every record from now on."""
        self.fences = dict(fences)

    def close(self) -> None:
        """Refuse every later write (runs abandoned on close may still be running)."""
        with self._lock:
            self._closed = True

    def append(self, partition: int, record_key: bytes, value: bytes, what: str) -> Delivery:
        """Append an encoded record, unless the writer is closed (:class:`JournalClosedError`)."""
        with self._lock:
            if self._closed:
                raise JournalClosedError(f"{what} was not journaled: the subtask closed its journal")
            if self.fence_watch is not None:
                self.fence_watch.refuse_if_fenced(what)  # a newer attempt owns the partitions now
            delivery = self._last[partition] = self.store.append(partition, record_key, value)
            return delivery

    def acknowledge_appended(self, timeout_s: float) -> dict[int, int | None]:
        """Wait until every record appended so far is acknowledged (what a checkpoint barrier covers); return,
        per partition this writer has written, the offset after the last of them (``None``: Kafka acknowledged it
        without an offset, as librdkafka does for a retried batch the broker already had).

        Not a flush of the producer: under saturation the runs keep appending, and a flush would wait for those
        records too, possibly never finding the queue empty. Kafka acknowledges a partition's records in order
        (an idempotent producer), so waiting for each partition's last record is enough; an earlier one that
        failed is reported by :meth:`JournalStore.check_deliveries`.
        """
        with self._lock:
            last = dict(self._last)
        deadline = time.monotonic() + timeout_s
        ends: dict[int, int | None] = {}
        for partition, delivery in last.items():
            offset = acknowledged_offset(delivery, max(0.0, deadline - time.monotonic()))
            ends[partition] = None if offset is None else offset + 1
        self.store.check_deliveries()
        return ends

    def encode(self, record_key: bytes, kind: RecordKind, payload: Any, *, partition: int, fingerprint: str,
               what: str, attempt: int = 0) -> bytes:
        """The record's bytes, signed for the store's topic and ``partition`` and stamped with ``attempt``; a
        record Kafka would refuse is a :class:`JournalRecordTooLargeError` now."""
        value = self.codec.encode(record_key, kind, payload, topic=self.store.topic, partition=partition,
                                  fingerprint=fingerprint, what=what, attempt=attempt)
        size = len(value) + len(record_key)
        if size + _FRAMING_BYTES > self.max_record_bytes:
            raise JournalRecordTooLargeError(
                f"{what} is {size:,} bytes as a journal record, more than Kafka accepts ({self.max_record_bytes:,} "
                f"bytes, message.max.bytes) {NO_RESTART_MARKER}")
        return value

    def run_journal(self, partition: int) -> RunJournal:
        """A journal handle for one run, writing to ``partition``."""
        return RunJournal(self, partition)


class RunJournal:
    """The records of one run: appends them and keeps their deliveries until acknowledged.

    Thread-safe: the sub-agent calls of one action write concurrently.
    """

    def __init__(self, writer: JournalWriter, partition: int):
        self._writer = writer
        self.partition = partition
        self._pending: list[Delivery] = []
        self._lock = threading.Lock()
        self.first_delivery: Delivery | None = None
        self.records_written = 0
        self._owed_before_next_call: Delivery | None = None  # the last external call outcome's delivery

    def write(self, record_key: bytes, kind: RecordKind, payload: Any, *, fingerprint: str = "",
              what: str = "journal record", must_ack: bool = False, ack_before_next_call: bool = False) -> None:
        """Append one record; wait for it when ``must_ack`` or the durability mode asks for it, or (with
        ``ack_before_next_call``) at the run's next :meth:`before_call`."""
        value = self._writer.encode(record_key, kind, payload, partition=self.partition, fingerprint=fingerprint,
                                    what=what, attempt=self._writer.fences.get(self.partition, 0))
        with self._lock:  # the first delivery must be the first record appended
            delivery = self._writer.append(self.partition, record_key, value, what)
            if self.first_delivery is None:
                self.first_delivery = delivery
            self.records_written += 1
            self._pending.append(delivery)
            if ack_before_next_call:
                self._owed_before_next_call = delivery
        durability = self._writer.durability
        if must_ack or durability is Durability.PER_CALL or (
            durability is Durability.PER_ACTION and kind is RecordKind.COMPLETION
        ):
            self.acknowledge()
        watch = self._writer.fence_watch
        if must_ack and watch is not None and kind is RecordKind.CALL and (
                getattr(payload, "outcome", None) is CallOutcome.STARTED):
            # The call is made next: not if a newer attempt started since (the broker's answer after the
            # started record's acknowledgement, docs/design.md §5.3).
            watch.check(self.partition, what.removeprefix("the result of "))

    def before_call(self) -> None:
        """Before the run makes a call: wait for the last external call outcome written, if any (its
        acknowledgement covers the records before it: partition order). Cleared only once acknowledged, so
        every thread of the run (sub-agent calls) that looks meanwhile waits too."""
        owed = self._owed_before_next_call
        if owed is None:
            return
        owed.wait(self._writer.ack_timeout_s)
        with self._lock:
            if self._owed_before_next_call is owed:
                self._owed_before_next_call = None

    def acknowledge(self) -> None:
        """Wait until every record written so far is acknowledged. The records stay listed until then: another
        thread of the run (sub-agent calls) acknowledging at the same time waits for them too, not for none."""
        with self._lock:
            pending = list(self._pending)
        for delivery in pending:
            delivery.wait(self._writer.ack_timeout_s)
        waited = {id(delivery) for delivery in pending}
        with self._lock:  # only those waited for here: a failure of a later one is its writer's to see
            while self._pending and id(self._pending[0]) in waited:
                self._pending.pop(0)

    def acknowledged(self) -> bool:
        """Whether every record written so far is acknowledged, without waiting (``JournalError`` if one failed)."""
        with self._lock:
            while self._pending and self._pending[0].done():
                self._pending.pop(0).wait(0)  # raises if it failed
            return not self._pending

    def outputs_may_leave(self) -> bool:
        """Whether the run's outputs may leave the operator now, by the durability mode (never waits): at once
        with ``at_checkpoint`` (the snapshot flushes), else once its records are acknowledged."""
        return self._writer.durability is Durability.AT_CHECKPOINT or self.acknowledged()

    def when_outputs_may_leave(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once :meth:`outputs_may_leave` would say yes for the records written so far: at once,
        or from the thread that receives the last acknowledgement (also when a record failed, so the caller
        finds out). Acknowledgements come in partition order, so the last record's answer covers the others."""
        with self._lock:
            last = self._pending[-1] if self._pending else None
        if last is None or self._writer.durability is Durability.AT_CHECKPOINT:
            callback()
        else:
            last.add_done_callback(callback)

    def first_offset(self, timeout_s: float) -> int | None:
        """Offset of the run's first record (waits for its acknowledgement), or None if none was written or Kafka
        acknowledged it without an offset (see :func:`acknowledged_offset`)."""
        return None if self.first_delivery is None else acknowledged_offset(self.first_delivery, timeout_s)


def acknowledged_offset(delivery: Delivery, timeout_s: float) -> int | None:
    """The record's offset once acknowledged, or None when Kafka acknowledged it without one (librdkafka's answer
    for a retried batch the broker already had)."""
    offset = delivery.wait(timeout_s)
    return offset if isinstance(offset, int) and offset >= 0 else None
