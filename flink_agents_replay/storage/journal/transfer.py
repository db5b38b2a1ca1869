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
* Records of envelope version 3 are signed for the topic they were written to
  (:mod:`flink_agents_replay.storage.records.codec`). Loaded under the dumped topic's own name (the usual move: the
  same journal on another cluster), they verify as they are. Loaded under another name, they are
  re-signed for it with the job's keys (``signing_keys``; the CLI takes the signing key from
  ``$FLINK_AGENTS_REPLAY_SIGNING_KEY``), each verified for its old name first; without keys such a load is
  refused before anything is created. Why re-sign rather than let the reader accept the old name: a reader
  trusts only its config and its keys. A note of the old name carried by the topic itself could be
  written by anyone who can write the topic (and then any copied record would pass), and the topic id the
  job is told to accept (``accept_moved_journal_from``) changes with every move and is unknown to a
  replay's ``KafkaSource``. Records of versions 1 and 2 (not bound to a topic) and every other byte are
  copied verbatim.
* The new topic has a new *topic id*. A restore compares the marker's topic id with the journal's and
  refuses a different one ("deleted and recreated"): set ``AgentConfig(accept_moved_journal_from=<old
  topic id>)`` (the id :func:`load_topic` reports) and the operator accepts the moved journal when every
  partition it owns reaches at least the marker's end offsets.

Limits: stop the job first (with a savepoint): a journal that is written or pruned while it is dumped
gives a dump of no consistent moment (a pruned prefix fails the dump). Records keep their timestamps; a
target topic whose ``retention.ms`` is shorter than their age deletes them (override it with
``config_overrides``). Producing fillers costs one small record per pruned offset.

Kafka access goes through :mod:`flink_agents_replay.integrations.kafka`: the user's settings (SASL/SSL...) reach
the admin client, the consumer and the producer alike, because every configuration is derived from one
:class:`~flink_agents_replay.integrations.kafka.KafkaSettings`, and topic administration (describing, creating,
offsets, deleting records, retries) is :class:`~flink_agents_replay.integrations.kafka.KafkaAdmin`'s. This module
only decides what to read and where each record must land.

The CLI: ``flink-agents-replay journal dump|load`` (:mod:`flink_agents_replay.cli`).
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from flink_agents_replay.core.errors import JournalError, SignatureError
from flink_agents_replay.integrations.kafka.admin import KafkaAdmin
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, KafkaSettingsLike
from flink_agents_replay.integrations.kafka.store import FILLER_KEY
from flink_agents_replay.integrations.kafka.topics import TOPIC
from flink_agents_replay.storage.records.codec import FORMAT_VERSION, SigningKeys, signed_version

__all__ = ["DUMP_FORMAT", "DUMP_VERSION", "FILLER_KEY", "DumpHeader", "DumpedRecord", "LoadResult", "dump_topic",
           "load_topic", "moved_journal_refusal", "read_dump"]

DUMP_FORMAT = "flink-agents-replay-topic-dump"
DUMP_VERSION = 1
#: Topic settings a dump carries (when set on the topic, not broker defaults).
KEPT_CONFIGS = ("cleanup.policy", "retention.ms", "max.message.bytes")
_BATCH = 2000


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
    resigned: int = 0  # records re-signed for the new topic name


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


# -- dump ------------------------------------------------------------------------------------------------
def dump_topic(settings: KafkaSettingsLike, *, topic: str, path: str | Path, timeout_s: float = 30.0) -> DumpHeader:
    """Write every record of ``topic`` (all partitions, low watermark to end) to ``path``; return the header.

    ``settings``: the user's Kafka settings (a confluent-kafka mapping with ``bootstrap.servers``, SASL/SSL...,
    a :class:`~flink_agents_replay.integrations.kafka.KafkaSettings`, or a bare bootstrap string); the admin client
    and the consumer both get them. ``timeout_s`` bounds each request, and how long a read may make no progress.
    """
    settings = KafkaSettings.of(settings)
    admin = KafkaAdmin(settings, timeout_s=timeout_s)
    admin.check_reachable()
    header = _describe_for_dump(admin, topic=topic)
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(json.dumps(header.to_json(), sort_keys=True) + "\n")
        for record in _read_all(settings, header=header, timeout_s=timeout_s):
            out.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
    return header


def _describe_for_dump(admin: KafkaAdmin, *, topic: str) -> DumpHeader:
    """The header of a dump of ``topic``: id, partitions, watermarks now, and the :data:`KEPT_CONFIGS` set on it."""
    described = admin.describe_topic(topic, role=TOPIC)
    partitions = range(described.partitions)
    return DumpHeader(topic, described.topic_id, described.partitions, admin.start_offsets(topic, partitions, TOPIC),
                      admin.end_offsets(topic, partitions, TOPIC),
                      admin.topic_overrides(topic, KEPT_CONFIGS, role=TOPIC))


def _read_all(settings: KafkaSettings, *, header: DumpHeader, timeout_s: float) -> Iterator[DumpedRecord]:
    """Each partition's records in ``[low, high)``, as committed readers see them (aborted ones become gaps)."""
    remaining = {p: header.high[p] for p in range(header.partitions) if header.low[p] < header.high[p]}
    if not remaining:
        return
    # An end-of-partition event makes consume() return as soon as a partition is read to its end.
    consumer = Consumer({**settings.reader_config(purpose="dump", committed_only=True), "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(header.topic, p, header.low[p]) for p in remaining])
        idle_deadline = time.monotonic() + timeout_s
        while remaining:
            messages = consumer.consume(_BATCH, timeout=0.5)
            yield from _dumped(messages, topic=header.topic, remaining=remaining)
            _drop_finished(consumer, topic=header.topic, remaining=remaining)
            if messages:
                idle_deadline = time.monotonic() + timeout_s
            elif remaining and time.monotonic() > idle_deadline:
                raise JournalError(f"reading topic {header.topic!r} stalled for {timeout_s:.0f} s with partitions "
                                   f"{sorted(remaining)} unfinished (an open transaction holds them back?)")
    finally:
        consumer.close()


def _dumped(messages: list[Any], *, topic: str, remaining: Mapping[int, int]) -> Iterator[DumpedRecord]:
    """The records among ``messages`` below their partition's dumped end (end-of-partition events skipped)."""
    for message in messages:
        error = message.error()
        if error is not None and error.code() != KafkaError._PARTITION_EOF:
            raise JournalError(f"reading topic {topic!r} failed: {error}; stop the job writing or "
                               "pruning it before dumping it")
        if error is None and message.offset() < remaining.get(message.partition(), -1):
            yield DumpedRecord(message.partition(), message.offset(), message.timestamp()[1],
                               message.key(), message.value(), tuple(message.headers() or ()))


def _drop_finished(consumer: Consumer, *, topic: str, remaining: dict[int, int]) -> None:
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
def load_topic(settings: KafkaSettingsLike, *, path: str | Path, topic: str | None = None,
               replication_factor: int | None = None, config_overrides: Mapping[str, str] | None = None,
               signing_keys: SigningKeys | None = None, timeout_s: float = 30.0) -> LoadResult:
    """Create ``topic`` (default: the dumped topic's name) on the cluster of ``settings`` and write the dump
    at ``path`` into it, every record at its original offset; return the old and new topic ids.

    ``settings`` as for :func:`dump_topic`: the admin client and the producer both get them. The topic is
    created with the dumped settings, ``config_overrides`` on top. It must not exist, or exist empty with the
    dump's partition count. After writing, the filler records below each partition's dumped low watermark
    are deleted, and each partition's low and high watermarks are checked against the dump's; a difference
    is a :class:`JournalError`. Under another name than the dumped topic's, records signed for that name
    (envelope version 3) are re-signed with ``signing_keys``, which must then be given.
    """
    settings = KafkaSettings.of(settings)
    header, records = read_dump(path)
    topic = topic or header.topic
    renamed = topic != header.topic
    if renamed:
        _check_resignable(path, header=header, topic=topic, signing_keys=signing_keys)
    admin = KafkaAdmin(settings, timeout_s=timeout_s)
    admin.check_reachable()
    admin.create_empty_topic(topic, header.partitions, role=TOPIC, replication_factor=replication_factor,
                             topic_config={**header.configs, **(config_overrides or {})})
    producer = Producer({"linger.ms": 20, **settings.producer_config(durable=True, ordered=True,
                                                                     what="loading of a topic dump")})
    writer = _InPlaceWriter(producer, topic=topic, partitions=header.partitions)
    resigned = 0
    for record in records:
        if renamed and signing_keys is not None and signed_version(record.value) == FORMAT_VERSION:
            record = replace(record, value=signing_keys.resign(record.value, record_key=record.key or b"",
                                                               from_topic=header.topic, to_topic=topic,
                                                               partition=record.partition))
            resigned += 1
        writer.write(record)
    for partition, high in header.high.items():
        writer.fill_to(partition, high)
    writer.finish(timeout_s=max(timeout_s, 60.0))
    admin.delete_records(topic, header.low, TOPIC, wait=True)  # the fillers below the low watermarks
    _check_watermarks(admin, topic=topic, header=header)
    return LoadResult(topic, header.topic_id, admin.topic_id(topic, TOPIC), writer.records, writer.fillers, resigned)


def _check_resignable(path: str | Path, *, header: DumpHeader, topic: str, signing_keys: SigningKeys | None) -> None:
    """Before anything is created: refuse a load under a new name of records signed for the old one that cannot
    be re-signed (no keys given, or a record that does not verify with them)."""
    _, records = read_dump(path)
    for record in records:
        if signed_version(record.value) != FORMAT_VERSION:
            continue
        if signing_keys is None:
            raise JournalError(
                f"the dump of topic {header.topic!r} holds records signed for that topic name (partition "
                f"{record.partition} offset {record.offset}, the first): load it under its own name, or give the "
                f"job's signing key (FLINK_AGENTS_REPLAY_SIGNING_KEY for the CLI) to re-sign them for {topic!r}")
        try:
            signing_keys.resign(record.value, record_key=record.key or b"", from_topic=header.topic, to_topic=topic,
                                partition=record.partition)
        except SignatureError as exc:
            raise JournalError(f"cannot load the dump of {header.topic!r} as {topic!r}: {exc}") from None


class _InPlaceWriter:
    """Produces to ``topic`` so that every record lands at the offset it is given, fillers before it.

    The producer must be idempotent with one request in flight (``producer_config(durable=True,
    ordered=True)``): then the n-th record produced to an empty partition lands at offset n, which each
    delivery report checks.
    """

    def __init__(self, producer: Producer, *, topic: str, partitions: int) -> None:
        self._producer = producer
        self._topic = topic
        self._next_offset = {p: 0 for p in range(partitions)}
        self._misplaced: list[str] = []
        self.records = 0
        self.fillers = 0

    def write(self, record: DumpedRecord) -> None:
        """Produce ``record`` at its offset, fillers first where the offsets before it hold none."""
        self.fill_to(record.partition, record.offset)
        self._send(record.partition, record.key, record.value, record.timestamp, record.headers)
        self.records += 1

    def fill_to(self, partition: int, offset: int) -> None:
        """Produce fillers until the partition's next record would land at ``offset``."""
        while self._next_offset[partition] < offset:
            self._send(partition, FILLER_KEY, b"", None, ())
            self.fillers += 1

    def finish(self, *, timeout_s: float) -> None:
        """Wait for every delivery; raise :class:`JournalError` if any is missing or landed elsewhere."""
        if self._producer.flush(timeout_s):
            raise JournalError(f"loading topic {self._topic!r}: records were not acknowledged in time")
        if self._misplaced:
            raise JournalError(f"loading topic {self._topic!r}: {len(self._misplaced)} records did not land at "
                               f"their offsets (was something else writing to it?): {'; '.join(self._misplaced[:3])}")

    def _send(self, partition: int, key: bytes | None, value: bytes | None, timestamp: int | None,
              headers: tuple[tuple[str, bytes | None], ...]) -> None:
        expected = self._next_offset[partition]

        def delivered(error: Any, message: Any) -> None:
            if error is not None or message.offset() != expected:
                self._misplaced.append(f"partition {partition} offset {expected}: "
                                       f"{error if error is not None else f'landed at {message.offset()}'}")

        while True:
            try:
                self._producer.produce(self._topic, value=value, key=key, partition=partition, on_delivery=delivered,
                                       timestamp=timestamp if timestamp and timestamp > 0 else 0,
                                       headers=list(headers) or None)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.1)
        self._next_offset[partition] = expected + 1


def _check_watermarks(admin: KafkaAdmin, *, topic: str, header: DumpHeader) -> None:
    """Raise :class:`JournalError` unless every partition of ``topic`` spans the dump's ``[low, high)``."""
    partitions = range(header.partitions)
    high = admin.end_offsets(topic, partitions, TOPIC)
    low = admin.start_offsets(topic, partitions, TOPIC)
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
