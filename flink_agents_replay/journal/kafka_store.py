"""The journal on Kafka (confluent-kafka): one topic, partitions = max parallelism, partition = key group.

The user's Kafka settings (``bootstrap.servers``, SASL/SSL, timeouts...) are passed to every client
untouched; this module adds only what correctness needs: an idempotent producer with ``acks=all`` (a
journal record that may be lost or duplicated would break reuse). A setting that contradicts those two
is refused rather than silently overridden.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from flink_agents_replay.errors import ConfigError, JournalError, TopicMismatchError
from flink_agents_replay.journal.store import Delivery, JournalStore, StoredRecord

__all__ = ["KafkaJournalStore"]

log = logging.getLogger(__name__)

_REQUIRED_PRODUCER_SETTINGS = {"enable.idempotence": True, "acks": "all"}
_READ_BATCH = 2000
_TRANSIENT = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)
_NOT_ALLOWED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)
T = TypeVar("T")


def _compacts(policy: str | None) -> bool:
    """Whether a ``cleanup.policy`` value (``delete``, ``compact``, ``compact,delete``) compacts."""
    return policy is not None and "compact" in {part.strip().lower() for part in policy.split(",")}


class _KafkaDelivery(Delivery):
    __slots__ = ("_done", "offset", "error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.offset: int | None = None
        self.error: Any = None

    def _complete(self, error: Any, message: Any) -> None:
        if error is not None:
            self.error = error
        else:
            self.offset = message.offset()
        self._done.set()

    def wait(self, timeout_s: float) -> int:
        if not self._done.wait(timeout_s):
            raise JournalError(f"a journal record was not acknowledged by Kafka within {timeout_s:.0f} s")
        if self.error is not None:
            raise JournalError(f"Kafka rejected a journal record: {self.error}")
        return self.offset  # type: ignore[return-value]


class KafkaJournalStore(JournalStore):
    """The journal topic ``topic`` with ``partitions`` partitions.

    Args:
        kafka_config: confluent-kafka settings, at least ``bootstrap.servers``; passed through as given.
        topic: the journal topic.
        partitions: required partition count (the job's max parallelism).
        create_topic: create the topic if missing (else a missing topic is an error).
        replication_factor: for a created topic (default: the broker's default).
        topic_config: topic-level settings for a created topic (e.g. ``retention.ms``).
        timeout_s: bound on start-up requests (an unreachable broker fails within it).
        allow_compaction: accept a compacted topic (``cleanup.policy`` with ``compact``). Off for journal
            and capture topics: compaction keeps only the last record per Kafka key and would drop earlier
            ones silently. On only for a topic compacted on purpose (the capture manifest).
    """

    def __init__(self, kafka_config: Mapping[str, Any], topic: str, partitions: int, *, create_topic: bool = True,
                 replication_factor: int | None = None, topic_config: Mapping[str, str] | None = None,
                 timeout_s: float = 30.0, allow_compaction: bool = False):
        if "bootstrap.servers" not in kafka_config:
            raise ConfigError("the Kafka settings need 'bootstrap.servers' (e.g. {'bootstrap.servers': 'host:9092'})")
        for name, required in _REQUIRED_PRODUCER_SETTINGS.items():
            if name in kafka_config and str(kafka_config[name]).lower() != str(required).lower():
                raise ConfigError(f"the journal needs Kafka setting {name}={required}; remove {name} from the config")
        topic_config = dict(topic_config or {})
        if not allow_compaction:
            if _compacts(topic_config.get("cleanup.policy")):
                raise ConfigError(
                    f"topic_config for topic {topic!r} sets cleanup.policy={topic_config['cleanup.policy']}: "
                    "compaction keeps only the last record per Kafka key, so earlier journal or capture records "
                    "would be dropped without an error; remove cleanup.policy from topic_config (pruning and "
                    "retention delete records)")
            # Explicit, so a broker whose default policy compacts does not compact a topic created here.
            topic_config.setdefault("cleanup.policy", "delete")
        self._config = dict(kafka_config)
        self.topic = topic
        self._partitions = partitions
        self.timeout_s = timeout_s
        self.max_message_bytes: int | None = None  # the topic's max.message.bytes, once read
        self._allow_compaction = allow_compaction
        self._admin = AdminClient(self._config)
        self.topic_id = self._ensure_topic(create_topic, replication_factor, topic_config)
        self._producer: Producer | None = None
        self._producer_lock = threading.Lock()
        self._poller: threading.Thread | None = None
        self._closing = threading.Event()

    @property
    def partitions(self) -> int:
        return self._partitions

    # -- topic -------------------------------------------------------------------------------------
    def _ensure_topic(self, create: bool, replication_factor: int | None, topic_config: dict) -> str:
        bootstrap = self._config["bootstrap.servers"]
        try:
            metadata = self._admin.list_topics(topic=self.topic, timeout=self.timeout_s)
        except KafkaException as exc:
            raise JournalError(
                f"could not reach Kafka at {bootstrap} within {self.timeout_s:.0f} s ({exc.args[0]}): check "
                "bootstrap.servers, that the broker runs, and the security settings"
            ) from None
        found = metadata.topics.get(self.topic)
        missing = found is None or (found.error is not None and
                                    found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)
        if missing:
            if not create:
                raise JournalError(f"journal topic {self.topic!r} does not exist and topic creation is off")
            self._create(replication_factor, topic_config)
        elif found.error is not None:
            raise JournalError(f"journal topic {self.topic!r} cannot be used: {found.error}")
        elif len(found.partitions) != self._partitions:
            raise TopicMismatchError(
                f"journal topic {self.topic!r} has {len(found.partitions)} partitions but the job's max parallelism "
                f"is {self._partitions} (one partition per key group). Fix: use a new journal topic name, or set "
                f"max parallelism to {len(found.partitions)} if that is what the job's savepoints were taken with"
            )
        topic_settings = self._topic_settings()
        if topic_settings is not None and "max.message.bytes" in topic_settings:
            self.max_message_bytes = int(topic_settings["max.message.bytes"])
        if not missing and not self._allow_compaction and topic_settings is not None:
            self._check_cleanup_policy(topic_settings.get("cleanup.policy"))
        return self._describe_topic_id()

    def _topic_settings(self) -> dict[str, str] | None:
        """The topic's settings; ``None`` when the broker does not let this client read them."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)

        def describe() -> dict[str, str] | None:
            future = self._admin.describe_configs([resource], request_timeout=self.timeout_s)[resource]
            try:
                return {name: entry.value for name, entry in future.result(timeout=self.timeout_s).items()}
            except KafkaException as exc:
                if exc.args[0].code() in _NOT_ALLOWED:  # a start-up check must not need more than producing does
                    log.warning("cannot read the settings of topic %s (%s): grant DescribeConfigs on it to have its "
                                "cleanup policy and record size limit checked", self.topic, exc.args[0])
                    return None
                raise

        return self._with_retries(f"describe the configuration of topic {self.topic!r}", describe)

    def _with_retries(self, what: str, request: Callable[[], T]) -> T:
        """``request()``, tried again on retriable errors (a new topic's leaders, a leader moving) for ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        pause = 0.05
        while True:
            try:
                return request()
            except KafkaException as exc:
                error = exc.args[0]
                if not (error.retriable() or error.code() in _TRANSIENT) or time.monotonic() + pause > deadline:
                    raise JournalError(f"could not {what}: {error}") from None
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _check_cleanup_policy(self, policy: str | None) -> None:
        if _compacts(policy):
            raise TopicMismatchError(
                f"topic {self.topic!r} has cleanup.policy={policy}: compaction keeps only the last record per Kafka "
                "key, so earlier journal or capture records of a key would be dropped without an error and a restore "
                "or a replay would miss them. Fix: use a new topic name (this package creates it with "
                "cleanup.policy=delete), or change this topic: kafka-configs.sh --bootstrap-server "
                f"{self._config['bootstrap.servers']} --alter --entity-type topics --entity-name {self.topic} "
                "--add-config cleanup.policy=delete"
            )

    def _create(self, replication_factor: int | None, topic_config: dict) -> None:
        new_topic = NewTopic(self.topic, self._partitions, replication_factor or -1, config=topic_config)
        future = self._admin.create_topics([new_topic], request_timeout=self.timeout_s)[self.topic]
        try:
            future.result(timeout=self.timeout_s)
            log.info("created journal topic %s with %d partitions", self.topic, self._partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another subtask won the race
                raise JournalError(f"could not create journal topic {self.topic!r}: {exc.args[0]}") from None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:  # metadata of a new topic spreads asynchronously
            found = self._admin.list_topics(topic=self.topic, timeout=self.timeout_s).topics.get(self.topic)
            if found is not None and found.error is None and len(found.partitions) == self._partitions:
                return
            time.sleep(0.1)
        raise JournalError(f"journal topic {self.topic!r} was created but did not become visible")

    def _describe_topic_id(self) -> str:
        futures = self._admin.describe_topics(TopicCollection([self.topic]), request_timeout=self.timeout_s)
        try:
            return str(futures[self.topic].result(timeout=self.timeout_s).topic_id)
        except KafkaException as exc:
            raise JournalError(f"could not describe journal topic {self.topic!r}: {exc.args[0]}") from None

    # -- writing -----------------------------------------------------------------------------------
    def _get_producer(self) -> Producer:
        with self._producer_lock:
            if self._producer is None:
                self._producer = Producer({**self._config, **_REQUIRED_PRODUCER_SETTINGS})
                self._poller = threading.Thread(target=self._poll_loop, name="journal-delivery", daemon=True)
                self._poller.start()
            return self._producer

    def _poll_loop(self) -> None:
        # Serves delivery callbacks, so a run waiting for its acknowledgement never has to poll itself.
        while not self._closing.is_set():
            self._producer.poll(0.05)

    def append(self, partition: int, key: bytes, value: bytes) -> Delivery:
        producer = self._get_producer()
        delivery = _KafkaDelivery()
        while True:
            try:
                producer.produce(self.topic, value=value, key=key, partition=partition, on_delivery=delivery._complete)
                return delivery
            except BufferError:  # local queue full: wait for deliveries to drain it
                time.sleep(0.01)

    def flush(self, timeout_s: float) -> None:
        if self._producer is None:
            return
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise JournalError(f"{remaining} journal records were not acknowledged by Kafka within {timeout_s:.0f} s")

    # -- offsets, reading, pruning -----------------------------------------------------------------
    def _list_offsets(self, partitions: Iterable[int], spec: OffsetSpec) -> dict[int, int]:
        request = {TopicPartition(self.topic, p): spec for p in partitions}
        if not request:
            return {}

        def list_offsets() -> dict[int, int]:
            futures = self._admin.list_offsets(request, request_timeout=self.timeout_s)
            return {tp.partition: future.result(timeout=self.timeout_s).offset for tp, future in futures.items()}

        return self._with_retries(f"list offsets of journal topic {self.topic!r}", list_offsets)

    def end_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        return self._list_offsets(partitions, OffsetSpec.latest())

    def start_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        return self._list_offsets(partitions, OffsetSpec.earliest())

    def read(self, start: Mapping[int, int], end: Mapping[int, int]) -> Iterator[StoredRecord]:
        wanted = {p: (start[p], end[p]) for p in start if start[p] < end[p]}
        if not wanted:
            return
        consumer = Consumer({
            **self._config,
            "group.id": f"flink-agents-replay-recovery-{uuid.uuid4().hex[:8]}",  # assign() only; never committed
            "enable.auto.commit": False,
            "auto.offset.reset": "error",  # never skip silently past a gap
        })
        try:
            consumer.assign([TopicPartition(self.topic, p, s) for p, (s, _) in wanted.items()])
            remaining = dict(wanted)
            deadline_idle = time.monotonic() + self.timeout_s
            while remaining:
                messages = consumer.consume(_READ_BATCH, timeout=0.5)
                if not messages and time.monotonic() > deadline_idle:
                    raise JournalError(
                        f"reading journal topic {self.topic!r} stalled for {self.timeout_s:.0f} s with partitions "
                        f"{sorted(remaining)} unfinished"
                    )
                if messages:
                    deadline_idle = time.monotonic() + self.timeout_s
                for message in messages:
                    if message.error():
                        raise JournalError(f"reading journal topic {self.topic!r} failed: {message.error()}")
                    partition, offset = message.partition(), message.offset()
                    bounds = remaining.get(partition)
                    if bounds is None or offset >= bounds[1]:
                        continue
                    yield StoredRecord(partition, offset, message.key(), message.value())
                    if offset + 1 >= bounds[1]:
                        del remaining[partition]  # later messages of a finished partition are skipped above
        finally:
            consumer.close()

    def delete_before(self, offsets: Mapping[int, int]) -> None:
        request = [TopicPartition(self.topic, p, o) for p, o in offsets.items() if o > 0]
        if not request:
            return
        for tp, future in self._admin.delete_records(request, request_timeout=self.timeout_s).items():
            future.add_done_callback(lambda f, tp=tp: f.exception() and log.warning(
                "pruning journal partition %d below offset %d failed: %s", tp.partition, tp.offset, f.exception()))

    def close(self) -> None:
        self._closing.set()
        if self._poller is not None:
            self._poller.join(5)
        if self._producer is not None:
            self._producer.flush(10)
