"""Moving a topic (journal, capture, manifest) to another Kafka cluster with every record at its offset.

Why offsets matter: a checkpoint's marker (:mod:`.markers`) names, per journal partition, the offset a
restore reads from and the partition's end at the barrier. A journal copied record by record into a new
topic would number its records from 0 again, and every marker pointing into it would point at the wrong
records. So this module copies a topic so that each record keeps its offset:

* :func:`dump_topic` reads every partition from its low watermark to its end and writes a plain-data
  file: gzip-compressed JSON lines, first a header line ::

      {"format": "flink-agents-replay-topic-dump", "version": 1, "topic": ..., "topic_id": ...,
       "partitions": N, "low": {"0": ..}, "high": {"0": ..}, "configs": {"cleanup.policy": ..}}

  then one line per record ``{"p", "offset", "timestamp", "key", "value", "headers"}`` with key, value
  and header values in base64. Bytes are copied verbatim: the dump knows nothing of the records'
  format (no pickles, no module paths), so a dump of any version's journal loads with any later version.
* :func:`load_topic` creates the topic on the target cluster (same partition count, the dumped settings)
  and produces the records in offset order with an idempotent producer (one request in flight: nothing
  is reordered or duplicated). Offsets that hold no record in the dump get a *filler* record: those below
  the low watermark (records pruned before the dump), and gaps inside (transaction markers, aborted
  records, compacted-away keys). Fillers below the low watermark are then deleted with
  ``delete_records``, so the new topic has the old one's low and high watermarks exactly; fillers
  inside the range cannot be deleted and stay, with the reserved key :data:`FILLER_KEY` and an empty
  value. The journal's reader (:meth:`KafkaJournalStore.read`) passes over them, so every reader of
  journal, capture and manifest topics does.
* The new topic has a new *topic id*. A restore compares the marker's topic id with the journal's and
  refuses a different one ("deleted and recreated"): set ``AgentConfig(accept_moved_journal_from=<old
  topic id>)`` (the id :func:`load_topic` reports) and the operator accepts the moved journal when every
  partition it owns reaches at least the marker's end offsets.

Limits: stop the job first (with a savepoint): a journal that is written or pruned while it is dumped
gives a dump of no consistent moment (a pruned prefix fails the dump). Records keep their timestamps; a
target topic whose ``retention.ms`` is shorter than their age deletes them (override it with
``config_overrides``). Producing fillers costs one small record per pruned offset.

The CLI: ``flink-agents-replay journal dump|load`` (:mod:`flink_agents_replay.cli`).
"""

from __future__ import annotations

import base64
import gzip
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from flink_agents_replay.errors import JournalError
from flink_agents_replay.kafka.store import FILLER_KEY

__all__ = ["DUMP_FORMAT", "DUMP_VERSION", "FILLER_KEY", "DumpHeader", "DumpedRecord", "LoadResult", "dump_topic",
           "load_topic", "moved_journal_refusal", "read_dump"]

DUMP_FORMAT = "flink-agents-replay-topic-dump"
DUMP_VERSION = 1
#: Kafka key of a filler record: an offset the source topic held no record at. Readers skip it.
#: Topic settings a dump carries (when set on the topic, not broker defaults).
KEPT_CONFIGS = ("cleanup.policy", "retention.ms", "max.message.bytes")
_BATCH = 2000
_TRANSIENT = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
              KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH)
T = TypeVar("T")


@dataclass(frozen=True)
class DumpHeader:
    """What a dump says about its topic: name, id, partitions, watermarks at the dump, kept settings."""

    topic: str
    topic_id: str
    partitions: int
    low: dict[int, int]
    high: dict[int, int]
    configs: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"format": DUMP_FORMAT, "version": DUMP_VERSION, "topic": self.topic, "topic_id": self.topic_id,
                "partitions": self.partitions, "low": {str(p): o for p, o in sorted(self.low.items())},
                "high": {str(p): o for p, o in sorted(self.high.items())}, "configs": dict(self.configs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> DumpHeader:
        if data.get("format") != DUMP_FORMAT:
            raise JournalError(f"{where} is not a topic dump of flink-agents-replay (format {data.get('format')!r})")
        if data.get("version") != DUMP_VERSION:
            raise JournalError(f"{where} is a topic dump of version {data.get('version')}; this version of "
                               f"flink-agents-replay reads version {DUMP_VERSION}")
        return cls(data["topic"], data["topic_id"], int(data["partitions"]),
                   {int(p): int(o) for p, o in data["low"].items()},
                   {int(p): int(o) for p, o in data["high"].items()}, dict(data["configs"]))


@dataclass(frozen=True)
class DumpedRecord:
    """One record of a dump, its bytes as Kafka held them."""

    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"p": self.partition, "offset": self.offset, "timestamp": self.timestamp, "key": _b64(self.key),
                "value": _b64(self.value), "headers": [[name, _b64(value)] for name, value in self.headers]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DumpedRecord:
        return cls(int(data["p"]), int(data["offset"]), data.get("timestamp"), _unb64(data["key"]),
                   _unb64(data["value"]), tuple((name, _unb64(value)) for name, value in data.get("headers") or ()))


@dataclass(frozen=True)
class LoadResult:
    """What :func:`load_topic` did: the topic, its old and new ids, records and fillers written."""

    topic: str
    old_topic_id: str
    new_topic_id: str
    records: int
    fillers: int


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


# -- dump ------------------------------------------------------------------------------------------------
def dump_topic(kafka_config: Mapping[str, Any], *, topic: str, path: str | Path,
               timeout_s: float = 30.0) -> DumpHeader:
    """Write every record of ``topic`` (all partitions, low watermark to end) to ``path``; return the header.

    ``kafka_config``: confluent-kafka settings (``bootstrap.servers``, SASL/SSL...), passed through.
    """
    admin = _reachable_admin(kafka_config, timeout_s)
    header = _describe_for_dump(admin, kafka_config, topic, timeout_s)
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(json.dumps(header.to_json(), sort_keys=True) + "\n")
        for record in _read_all(kafka_config, header, timeout_s):
            out.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
    return header


def _reachable_admin(kafka_config: Mapping[str, Any], timeout_s: float) -> AdminClient:
    """An admin client of the cluster, which answered a metadata request (else a clear :class:`JournalError`)."""
    admin = AdminClient(dict(kafka_config))
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise JournalError(f"could not reach Kafka at {kafka_config.get('bootstrap.servers')} within {timeout_s:.0f} s "
                           f"({exc.args[0]}): check the address, that the broker runs, and the security settings"
                           ) from None
    return admin


def _describe_for_dump(admin: AdminClient, kafka_config: Mapping[str, Any], topic: str,
                       timeout_s: float) -> DumpHeader:
    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic]
        description = described.result(timeout=timeout_s)
    except KafkaException as exc:
        raise JournalError(f"cannot dump topic {topic!r} from {kafka_config.get('bootstrap.servers')}: "
                           f"{exc.args[0]}") from None
    partitions = len(description.partitions)
    low = _offsets(admin, topic, range(partitions), OffsetSpec.earliest(), timeout_s)
    high = _offsets(admin, topic, range(partitions), OffsetSpec.latest(), timeout_s)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout=timeout_s)
    configs = {name: entries[name].value for name in KEPT_CONFIGS
               if name in entries and not entries[name].is_default and entries[name].value is not None}
    return DumpHeader(topic, str(description.topic_id), partitions, low, high, configs)


def _offsets(admin: AdminClient, topic: str, partitions: range, spec: OffsetSpec, timeout_s: float) -> dict[int, int]:
    def request() -> dict[int, int]:
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions}, request_timeout=timeout_s)
        return {tp.partition: future.result(timeout=timeout_s).offset for tp, future in futures.items()}

    return _retrying(f"list the offsets of topic {topic!r}", request, timeout_s)


def _retrying(what: str, request: Callable[[], T], timeout_s: float) -> T:
    """``request()``, tried again for ``timeout_s`` on retriable errors (a new topic's leaders being elected)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return request()
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in _TRANSIENT) or time.monotonic() > deadline:
                raise JournalError(f"could not {what}: {error}") from None
            time.sleep(0.1)


def _read_all(kafka_config: Mapping[str, Any], header: DumpHeader, timeout_s: float) -> Iterator[DumpedRecord]:
    """Each partition's records in ``[low, high)``, as committed readers see them (aborted ones become gaps)."""
    remaining = {p: header.high[p] for p in range(header.partitions) if header.low[p] < header.high[p]}
    if not remaining:
        return
    consumer = Consumer({**kafka_config, "group.id": f"flink-agents-replay-dump-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "error",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(header.topic, p, header.low[p]) for p in remaining])
        idle_deadline = time.monotonic() + timeout_s
        while remaining:
            messages = consumer.consume(_BATCH, timeout=0.5)
            for message in messages:
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise JournalError(f"reading topic {header.topic!r} failed: {error}; stop the job writing or "
                                       "pruning it before dumping it")
                if error is None and message.offset() < remaining.get(message.partition(), -1):
                    yield DumpedRecord(message.partition(), message.offset(), message.timestamp()[1],
                                       message.key(), message.value(), tuple(message.headers() or ()))
            _drop_finished(consumer, header.topic, remaining)
            if messages:
                idle_deadline = time.monotonic() + timeout_s
            elif remaining and time.monotonic() > idle_deadline:
                raise JournalError(f"reading topic {header.topic!r} stalled for {timeout_s:.0f} s with partitions "
                                   f"{sorted(remaining)} unfinished (an open transaction holds them back?)")
    finally:
        consumer.close()


def _drop_finished(consumer: Consumer, topic: str, remaining: dict[int, int]) -> None:
    """Forget partitions whose read position reached their end (past trailing transaction markers too)."""
    positions = consumer.position([TopicPartition(topic, p) for p in remaining])
    for position in positions:
        if position.offset >= remaining[position.partition]:
            del remaining[position.partition]


def read_dump(path: str | Path) -> tuple[DumpHeader, Iterator[DumpedRecord]]:
    """The header of the dump at ``path`` and an iterator of its records (which reads the file as it goes)."""
    try:
        dump = gzip.open(path, "rt", encoding="utf-8")
    except OSError as exc:
        raise JournalError(f"cannot open topic dump {path}: {exc.strerror or exc}") from None
    try:
        header = DumpHeader.from_json(json.loads(dump.readline() or "{}"), str(path))
    except (OSError, ValueError, KeyError) as exc:
        dump.close()
        raise JournalError(f"{path} is not a readable topic dump: {exc}") from None

    def records() -> Iterator[DumpedRecord]:
        with dump:
            for line in dump:
                yield DumpedRecord.from_json(json.loads(line))

    return header, records()


# -- load ------------------------------------------------------------------------------------------------
def load_topic(kafka_config: Mapping[str, Any], *, path: str | Path, topic: str | None = None,
               replication_factor: int | None = None, config_overrides: Mapping[str, str] | None = None,
               timeout_s: float = 30.0) -> LoadResult:
    """Create ``topic`` (default: the dumped topic's name) on the cluster of ``kafka_config`` and write the dump
    at ``path`` into it, every record at its original offset; return the old and new topic ids.

    The topic must not exist, or exist empty with the dump's partition count. After writing, each partition's
    low and high watermarks are checked against the dump's; a difference is a :class:`JournalError`.
    """
    header, records = read_dump(path)
    topic = topic or header.topic
    admin = _reachable_admin(kafka_config, timeout_s)
    _create_empty_topic(admin, topic, header, replication_factor, {**header.configs, **(config_overrides or {})},
                        timeout_s)
    written, fillers = _produce_in_place(kafka_config, topic, header, records, timeout_s)
    prefixes = [TopicPartition(topic, p, low) for p, low in header.low.items() if low > 0]
    if prefixes:
        def delete() -> None:
            for future in admin.delete_records(prefixes, request_timeout=timeout_s).values():
                future.result(timeout=timeout_s)

        _retrying(f"delete the filler prefix of topic {topic!r}", delete, timeout_s)
    _check_watermarks(admin, topic, header, timeout_s)
    new_id = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic].result(
        timeout=timeout_s).topic_id
    return LoadResult(topic, header.topic_id, str(new_id), written, fillers)


def _create_empty_topic(admin: AdminClient, topic: str, header: DumpHeader, replication_factor: int | None,
                        configs: Mapping[str, str], timeout_s: float) -> None:
    new = NewTopic(topic, header.partitions, replication_factor or -1, config=dict(configs))
    try:
        admin.create_topics([new], request_timeout=timeout_s)[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise JournalError(f"could not create topic {topic!r}: {exc.args[0]}") from None
    deadline = time.monotonic() + timeout_s
    while True:  # a new topic's metadata reaches the brokers asynchronously
        found = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            break
        if time.monotonic() > deadline:
            raise JournalError(f"topic {topic!r} was created but did not become visible")
        time.sleep(0.1)
    if len(found.partitions) != header.partitions:
        raise JournalError(f"topic {topic!r} exists with {len(found.partitions)} partitions, the dump has "
                           f"{header.partitions}: load into a new topic")
    ends = _offsets(admin, topic, range(header.partitions), OffsetSpec.latest(), timeout_s)
    if any(ends.values()):
        raise JournalError(f"topic {topic!r} already exists and is not empty: records would not keep their "
                           "offsets; delete it or load into a new topic")


def _produce_in_place(kafka_config: Mapping[str, Any], topic: str, header: DumpHeader,
                      records: Iterator[DumpedRecord], timeout_s: float) -> tuple[int, int]:
    """Produce every record at its offset, fillers before it; return (records, fillers) written."""
    producer = Producer({**kafka_config, "enable.idempotence": True, "acks": "all",
                         "max.in.flight.requests.per.connection": 1, "linger.ms": 20})
    misplaced: list[str] = []
    next_offset = {p: 0 for p in range(header.partitions)}
    counts = {"records": 0, "fillers": 0}

    def send(partition: int, key: bytes | None, value: bytes | None, timestamp: int | None = None,
             headers: tuple = (), filler: bool = False) -> None:
        expected = next_offset[partition]

        def delivered(error: Any, message: Any) -> None:
            if error is not None or message.offset() != expected:
                misplaced.append(f"partition {partition} offset {expected}: "
                                 f"{error if error is not None else f'landed at {message.offset()}'}")

        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, on_delivery=delivered,
                                 timestamp=timestamp if timestamp and timestamp > 0 else 0,
                                 headers=list(headers) or None)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        next_offset[partition] = expected + 1
        counts["fillers" if filler else "records"] += 1

    for record in records:
        while next_offset[record.partition] < record.offset:
            send(record.partition, FILLER_KEY, b"", filler=True)
        send(record.partition, record.key, record.value, record.timestamp, record.headers)
    for partition, high in header.high.items():
        while next_offset[partition] < high:
            send(partition, FILLER_KEY, b"", filler=True)
    if producer.flush(max(timeout_s, 60.0)):
        raise JournalError(f"loading topic {topic!r}: records were not acknowledged in time")
    if misplaced:
        raise JournalError(f"loading topic {topic!r}: {len(misplaced)} records did not land at their offsets "
                           f"(was something else writing to it?): {'; '.join(misplaced[:3])}")
    return counts["records"], counts["fillers"]


def _check_watermarks(admin: AdminClient, topic: str, header: DumpHeader, timeout_s: float) -> None:
    partitions = range(header.partitions)
    high = _offsets(admin, topic, partitions, OffsetSpec.latest(), timeout_s)
    low = _offsets(admin, topic, partitions, OffsetSpec.earliest(), timeout_s)
    wrong = [f"partition {p}: [{low[p]}, {high[p]}) instead of [{header.low[p]}, {header.high[p]})"
             for p in partitions if (low[p], high[p]) != (header.low[p], header.high[p])]
    if wrong:
        raise JournalError(f"loaded topic {topic!r} does not match the dump: {'; '.join(wrong[:5])}")


# -- restoring against a moved journal ---------------------------------------------------------------------
def moved_journal_refusal(*, marker_topic_ids: Iterable[str], current_topic_id: str,
                          accepted_from: str | Iterable[str] | None, marker_ends: Mapping[int, int],
                          current_ends: Mapping[int, int], owned: Iterable[int]) -> str | None:
    """Why a checkpoint taken against topic ids ``marker_topic_ids`` may not restore against the journal topic
    ``current_topic_id``; ``None`` when it may (the operator then reads the moved journal).

    It may when every marker names a topic id listed in ``accepted_from`` (the user's
    ``accept_moved_journal_from``) or the current one, and every owned partition is in the markers and its
    current end offset reaches the marker's end at the barrier (``marker_ends``): a journal loaded with
    :func:`load_topic` keeps its offsets, so it holds every record the checkpoint may need.
    """
    accepted = {accepted_from} if isinstance(accepted_from, str) else set(accepted_from or ())
    unknown = sorted(set(marker_topic_ids) - accepted - {current_topic_id})
    if unknown:
        return (f"topic id {', '.join(unknown)} is not in accept_moved_journal_from"
                f" ({', '.join(sorted(accepted)) or 'not set'})")
    owned = sorted(owned)
    missing = [p for p in owned if p not in marker_ends or p not in current_ends]
    if missing:
        return (f"partitions {missing[:10]} of the journal are not in the checkpoint's markers: the partition "
                "count (max parallelism) differs")
    short = [f"partition {p}: ends at {current_ends[p]}, the checkpoint needs up to {marker_ends[p]}"
             for p in owned if current_ends[p] < marker_ends[p]]
    if short:
        return f"the moved journal lacks records the checkpoint needs ({'; '.join(short[:5])})"
    return None
