"""A partitioned, append-only topic the package writes durably and reads back between offsets.

The journal, the capture and the capture manifest are all such topics: records appended to a chosen
partition by an idempotent producer with ``acks=all`` (each append confirmed by a :class:`TopicDelivery`),
read back per partition from one offset to another, and deleted below an offset (pruning). Only their
role differs: it names the topic in errors, and decides whether compaction is allowed (the manifest) or
refused (the others). The journal puts its own interface on top
(:mod:`flink_agents_replay.storage.journal.kafka_store`).

The producer is created on the first append, with a thread serving its delivery callbacks, so a writer
waiting for an acknowledgement never has to poll itself.

When the broker fails underneath (docs/design.md, "infrastructure faults: the broker"):

* a record is acknowledged or fails within ``ack_timeout_s`` (the producer's ``message.timeout.ms``, see
  :mod:`.settings`); it never waits longer and is never delivered after the writer gave up on it;
* once one record failed, the store refuses every later append and flush (:class:`JournalError`): a
  checkpoint must never complete with a record missing behind it, so the attempt fails and Flink restores
  it with a new store;
* :meth:`KafkaTopicStore.close` first delivers what was appended, for a bounded time: a journal record
  appended just before close is the outcome of a call already made, and dropping it would turn that call
  into one in doubt, made again by the next attempt (runs also wait for their own records before they stop,
  :mod:`flink_agents_replay.engine.run`). What a store whose role says so (the journal) still has unsent then
  is purged (the broker is away), so it cannot land up to ``ack_timeout_s`` later; a record already on the
  wire may still land, and one that lands after the next attempt's marker is ignored by fencing
  (:mod:`flink_agents_replay.storage.journal.fencing`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.integrations.kafka.admin import KafkaAdmin
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, KafkaSettingsLike
from flink_agents_replay.integrations.kafka.topics import TopicRole

__all__ = ["FILLER_KEY", "KafkaTopicStore", "TopicDelivery", "TopicRecord"]

#: The key of a placeholder record that holds an offset in a topic moved to another cluster with its offsets kept
#: (:mod:`flink_agents_replay.storage.journal.transfer`): never a record of ours, so every read passes over it.
FILLER_KEY = b"_moved:filler"

_READ_BATCH = 2000
#: How long closing waits for the deliveries still queued; after it, a purging store drops the rest.
_CLOSE_DELIVER_S = 5.0
#: How long closing then waits for the purge reports (every delivery is reported, failed or not).
_CLOSE_REPORT_S = 5.0

log = logging.getLogger("flink_agents_replay.kafka")


class TopicRecord(NamedTuple):
    """One record as read back (a tuple: a restore creates one per record)."""

    partition: int
    offset: int
    key: bytes
    value: bytes


class TopicDelivery:
    """The pending acknowledgement of one appended record.

    No lock or event per record (one is made per record under way): a waiter registers a callback like any
    other, and each callback runs once whichever thread gets to it first (see :meth:`_run_callbacks`).
    """

    __slots__ = ("_done", "offset", "error", "_role", "_on_failure", "_callbacks")

    def __init__(self, role: TopicRole, on_failure: Callable[[Any], None] | None = None) -> None:
        self._done = False
        self._role = role
        self._on_failure = on_failure
        self.offset: int | None = None
        self.error: Any = None
        self._callbacks: list[Callable[[], None]] | None = None  # created by the first add_done_callback

    def _complete(self, error: Any, message: Any) -> None:
        if error is not None:
            self.error = error
            if self._on_failure is not None:
                self._on_failure(error)
        else:
            self.offset = message.offset()
        self._done = True  # before the callbacks are looked at: an adder after this point runs its own
        self._run_callbacks()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once Kafka has answered: at once if it has, else from the thread delivering the
        answer (the producer's poller, or a flush)."""
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)
        if self._done:
            self._run_callbacks()

    def _run_callbacks(self) -> None:
        # list.pop is atomic: each callback runs once, whether the adding or the answering thread gets to it.
        callbacks = self._callbacks
        while callbacks:
            try:
                callback = callbacks.pop()
            except IndexError:
                return
            try:
                callback()
            except Exception:  # noqa: BLE001 - raising here would stop the producer's poller
                log.exception("a callback on a %s delivery failed", self._role.label)

    def done(self) -> bool:
        """Whether Kafka has answered (acknowledged or failed)."""
        return self._done

    def wait(self, timeout_s: float) -> int:
        """Block until Kafka acknowledged the record; return its offset or raise ``JournalError``."""
        if not self._done:
            answered = threading.Event()
            self.add_done_callback(answered.set)
            answered.wait(timeout_s)
        if not self._done:
            raise JournalError(f"a record of the {self._role.label} was not acknowledged by Kafka within "
                               f"{timeout_s:.0f} s")
        if self.error is not None:
            raise JournalError(describe_failed_delivery(self._role, self.error))
        return self.offset  # type: ignore[return-value]


def describe_failed_delivery(role: TopicRole, error: Any) -> str:
    """Why a record of ``role`` was not written, for people (a timeout says which setting bounds it)."""
    code = error.code() if hasattr(error, "code") else None
    if code == KafkaError._MSG_TIMED_OUT:
        return (f"a record of the {role.label} was not acknowledged by Kafka within message.timeout.ms (set from "
                f"ack_timeout_s): is the broker down or overloaded? ({error})")
    if code in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
        return f"a record of the {role.label} was dropped unsent: the store was closed ({error})"
    return f"Kafka rejected a record of the {role.label}: {error}"


class KafkaTopicStore:
    """Topic ``topic`` of role ``role``, with ``partitions`` partitions, created if missing or checked.

    Args:
        settings: the user's Kafka settings (a mapping or :class:`KafkaSettings`), passed to every client.
        topic: the topic.
        partitions: the partition count it must have.
        role: what the topic is (errors name it so); see :mod:`flink_agents_replay.integrations.kafka.topics`.
        create_topic: create the topic if missing (else a missing topic is an error).
        replication_factor: for a created topic (default: the broker's default).
        topic_config: topic-level settings for a created topic (e.g. ``retention.ms``).
        timeout_s: bound on start-up requests (an unreachable broker fails within it).
        allow_compaction: accept a compacted topic (``role.compacted`` topics only, by default).
        ack_timeout_s: how long appended records are waited for; the producer's ``message.timeout.ms`` is no
            longer (a record is acknowledged or failed by then).
    """

    #: What :meth:`read` yields; a subclass may name another tuple type with the same four fields.
    record_type: Callable[[int, int, bytes, bytes], Any] = TopicRecord
    #: Whether :meth:`close` drops the records still unsent after its bounded delivery (a cancelled attempt's
    #: behind an unreachable broker) instead of leaving them to librdkafka's own timeout.
    purge_unsent_on_close: bool = False

    def __init__(self, *, settings: KafkaSettingsLike, topic: str, partitions: int, role: TopicRole,
                 create_topic: bool = True, replication_factor: int | None = None,
                 topic_config: Mapping[str, str] | None = None, timeout_s: float = 30.0,
                 allow_compaction: bool | None = None, ack_timeout_s: float = 60.0):
        self.settings = KafkaSettings.of(settings)
        self.role = role
        # Checked before Kafka is contacted: a contradicting setting is a config error, not a broker one.
        self._producer_config = self.settings.producer_config(durable=True, what=role.label,
                                                              ack_timeout_s=ack_timeout_s)
        self.failed_delivery: Any = None  # the first delivery error; the store refuses to go on after it
        self.topic = topic
        self._partitions = partitions
        self.timeout_s = timeout_s
        self.admin = KafkaAdmin(self.settings, timeout_s=timeout_s)
        if allow_compaction is None:
            allow_compaction = role.compacted
        info = self.admin.prepare_topic(topic, partitions, role=role, create=create_topic,
                                        replication_factor=replication_factor, topic_config=topic_config,
                                        allow_compaction=allow_compaction)
        self.topic_id = info.topic_id
        self.max_message_bytes: int | None = info.max_message_bytes  # the topic's max.message.bytes, if readable
        self._producer: Producer | None = None
        self._producer_lock = threading.Lock()
        self._poller: threading.Thread | None = None
        self._closing = threading.Event()

    @property
    def partitions(self) -> int:
        """The topic's partition count."""
        return self._partitions

    # -- writing -----------------------------------------------------------------------------------
    def _get_producer(self) -> Producer:
        producer = self._producer
        if producer is not None:  # every append: no lock once the producer exists
            return producer
        with self._producer_lock:
            if self._producer is None:
                self._producer = Producer(self._producer_config)
                thread_name = f"{self.role.label.replace(' ', '-')}-delivery"  # e.g. journal-topic-delivery
                self._poller = threading.Thread(target=self._poll_loop, name=thread_name, daemon=True)
                self._poller.start()
            return self._producer

    def prepare_writes(self) -> None:
        """Create the producer now: its connection and idempotent set-up (about half a second for a new producer's
        first acknowledged write) overlap the caller's other work."""
        self._get_producer()

    def _poll_loop(self) -> None:
        while not self._closing.is_set():
            self._producer.poll(0.05)

    def _delivery_failed(self, error: Any) -> None:
        if self.failed_delivery is None:
            self.failed_delivery = error

    def check_deliveries(self) -> None:
        """Raise ``JournalError`` if a record failed: what is appended after it would lie behind a gap."""
        if self.failed_delivery is not None:
            raise JournalError(f"{describe_failed_delivery(self.role, self.failed_delivery)}; this attempt writes no "
                               "further records (Flink restores it)")

    def append(self, partition: int, key: bytes, value: bytes) -> TopicDelivery:
        """Append asynchronously; the returned delivery confirms it."""
        return self.append_to(self.topic, partition, key, value)

    def append_to(self, topic: str, partition: int, key: bytes, value: bytes) -> TopicDelivery:
        """Append to another topic through this store's producer (durable, idempotent; the journal's fence topic
        shares the journal's producer): asynchronously, the returned delivery confirms it."""
        self.check_deliveries()
        producer = self._get_producer()
        delivery = TopicDelivery(self.role, self._delivery_failed)
        while True:
            self.check_deliveries()  # a full queue drains by failing too, when the broker is gone
            try:
                producer.produce(topic, value=value, key=key, partition=partition, on_delivery=delivery._complete)
                return delivery
            except BufferError:  # local queue full: wait for deliveries to drain it
                time.sleep(0.01)

    def flush(self, timeout_s: float) -> None:
        """Wait until every appended record is acknowledged; ``JournalError`` if one failed or is still waiting."""
        if self._producer is None:
            return
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise JournalError(f"{remaining} records of the {self.role.label} were not acknowledged by Kafka within "
                               f"{timeout_s:.0f} s")
        self.check_deliveries()

    # -- offsets, reading, pruning -----------------------------------------------------------------
    def end_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """Next offset to be written in each partition (the high watermark)."""
        return self.admin.end_offsets(self.topic, partitions, self.role)

    def start_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """First offset still stored in each partition (the low watermark)."""
        return self.admin.start_offsets(self.topic, partitions, self.role)

    def read(self, start: Mapping[int, int], end: Mapping[int, int]) -> Iterator[Any]:
        """Records of each partition in ``start`` from its start offset up to (excluding) its end offset."""
        wanted = {p: (start[p], end[p]) for p in start if start[p] < end[p]}
        if not wanted:
            return
        consumer = Consumer(self.settings.reader_config(purpose="recovery"))
        try:
            consumer.assign([TopicPartition(self.topic, p, s) for p, (s, _) in wanted.items()])
            yield from self._read_assigned(consumer, dict(wanted))
        finally:
            consumer.close()

    def _read_assigned(self, consumer: Consumer, remaining: dict[int, tuple[int, int]]) -> Iterator[Any]:
        make_record = self.record_type
        deadline_idle = time.monotonic() + self.timeout_s
        while remaining:
            # consume() returns when it has the number asked for, else at its timeout: asking for no more than
            # the records left makes a short read take what fetching them takes, not the timeout.
            left = sum(end - start for start, end in remaining.values())
            messages = consumer.consume(max(1, min(_READ_BATCH, left)), timeout=0.5)
            if not messages and time.monotonic() > deadline_idle:
                raise JournalError(f"reading {self.role.label} {self.topic!r} stalled for {self.timeout_s:.0f} s "
                                   f"with partitions {sorted(remaining)} unfinished")
            if messages:
                deadline_idle = time.monotonic() + self.timeout_s
            for message in messages:
                if message.error():
                    raise JournalError(f"reading {self.role.label} {self.topic!r} failed: {message.error()}")
                partition, offset = message.partition(), message.offset()
                bounds = remaining.get(partition)
                if bounds is None or offset >= bounds[1]:
                    continue
                if message.key() != FILLER_KEY:
                    yield make_record(partition, offset, message.key(), message.value())
                if offset + 1 >= bounds[1]:
                    del remaining[partition]  # later messages of a finished partition are skipped above
                else:
                    remaining[partition] = (offset + 1, bounds[1])

    def delete_before(self, offsets: Mapping[int, int]) -> None:
        """Delete every record below ``offsets[p]`` in each partition (asynchronous)."""
        self.admin.delete_records(self.topic, offsets, self.role)

    def close(self) -> None:
        """Stop the delivery thread; deliver what was appended (bounded); then purge what is still unsent
        (:attr:`purge_unsent_on_close`: every delivery is then reported, so no writer is left waiting; a store
        that does not purge leaves the rest to ``message.timeout.ms``)."""
        self._closing.set()
        if self._poller is not None:
            self._poller.join(5)
        producer = self._producer
        if producer is None:
            return
        remaining = producer.flush(_CLOSE_DELIVER_S)
        if remaining and self.purge_unsent_on_close:
            # Queued records are dropped; records on the wire may still land (Kafka cannot take them back).
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.flush(_CLOSE_REPORT_S)
