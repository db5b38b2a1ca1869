"""``flink-agents-replay inspect``: what a journal topic holds, for operators debugging a job.

Reads only record keys and the unsigned part of record headers (kind, producer, time): no signing key
is needed and no payload is ever unpickled. A malformed record (truncated value, bad magic, a header that
is not JSON) is listed with kind ``malformed``; a record whose key is not a journal key at all is reported
as an error that names its partition and offset, never as a traceback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.integrations.kafka.admin import KafkaAdmin
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, KafkaSettingsLike
from flink_agents_replay.integrations.kafka.topics import JOURNAL
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest, parse_journal_key

__all__ = ["KeyRecord", "PartitionSummary", "key_records", "summarize_topic"]


@dataclass(frozen=True)
class PartitionSummary:
    """One journal partition (= key group): its watermarks and how many records it holds."""

    partition: int
    low: int
    high: int

    @property
    def records(self) -> int:
        """Records still stored."""
        return self.high - self.low


@dataclass(frozen=True)
class KeyRecord:
    """One journal record of a key."""

    offset: int
    seq: int
    action: str
    kind: str
    age_s: float | None


def summarize_topic(kafka_config: KafkaSettingsLike, topic: str, timeout_s: float = 30.0) -> list[PartitionSummary]:
    """Low/high watermark of every partition of ``topic`` (``kafka_config``: the user's Kafka settings)."""
    admin = KafkaAdmin(kafka_config, timeout_s=timeout_s)
    count = admin.partition_count(topic)
    if count is None:
        raise JournalError(f"journal topic {topic!r} not found on {admin.settings.bootstrap_servers}")
    partitions = range(count)
    low = admin.start_offsets(topic, partitions, JOURNAL)
    high = admin.end_offsets(topic, partitions, JOURNAL)
    return [PartitionSummary(p, low[p], high[p]) for p in partitions]


def key_records(kafka_config: KafkaSettingsLike, topic: str, key: Any, key_type: str,
                timeout_s: float = 30.0) -> list[KeyRecord]:
    """The records of one business key, read from its key group's partition."""
    kafka_config = KafkaSettings.of(kafka_config)
    summaries = summarize_topic(kafka_config, topic, timeout_s)
    max_parallelism = len(summaries)
    partition = key_group(key, key_type, max_parallelism)
    digest = key_digest(key)
    store = KafkaJournalStore(kafka_config, topic, max_parallelism, create_topic=False, timeout_s=timeout_s)
    try:
        summary = summaries[partition]
        now = time.time()
        found = []
        for stored in store.read({partition: summary.low}, {partition: summary.high}):
            try:
                _, seq, _, action, record_digest = parse_journal_key(stored.key)
            except (AttributeError, ValueError, UnicodeDecodeError):
                raise JournalError(f"the record at partition {partition} offset {stored.offset} of {topic!r} has key "
                                   f"{stored.key!r:.80}, not a flink-agents-replay journal key: is {topic!r} a "
                                   "journal topic, or does something else write to it?") from None
            if record_digest != digest:
                continue
            header = RecordCodec.peek_header(stored.value)
            if not isinstance(header, dict):
                header = {"kind": "malformed"}
            created = header.get("ts")
            found.append(KeyRecord(stored.offset, seq, action, header.get("kind", "?"),
                                   None if created is None else max(0.0, now - created)))
        return found
    finally:
        store.close()
