"""The journal on Kafka: one topic, partitions = max parallelism, partition = key group.

The Kafka work (topic creation and checks, the durable producer, bounded reads, pruning) is the shared
:class:`~flink_agents_replay.integrations.kafka.store.KafkaTopicStore`, with the user's Kafka settings passed to every
client untouched. What is the journal's own: the :class:`~flink_agents_replay.storage.journal.store.JournalStore`
interface the writer and recovery use, the journal's topic role in errors ("journal topic ..."), and
compaction refused (it would drop earlier records of a key without an error), and records still unsent
after close's bounded delivery purged: behind an unreachable broker they could land up to ack_timeout_s later.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flink_agents_replay.integrations.kafka.settings import KafkaSettingsLike
from flink_agents_replay.integrations.kafka.store import KafkaTopicStore, TopicDelivery
from flink_agents_replay.integrations.kafka.topics import JOURNAL
from flink_agents_replay.storage.journal.store import Delivery, JournalStore, StoredRecord

__all__ = ["KafkaJournalStore"]

Delivery.register(TopicDelivery)


class KafkaJournalStore(KafkaTopicStore, JournalStore):
    """The journal topic ``topic`` with ``partitions`` partitions.

    Args:
        kafka_config: the user's Kafka settings (a confluent-kafka mapping with at least ``bootstrap.servers``,
            or :class:`~flink_agents_replay.integrations.kafka.settings.KafkaSettings`); passed through as given.
        topic: the journal topic.
        partitions: required partition count (the job's max parallelism).
        create_topic: create the topic if missing (else a missing topic is an error).
        replication_factor: for a created topic (default: the broker's default).
        topic_config: topic-level settings for a created topic (e.g. ``retention.ms``).
        timeout_s: bound on start-up requests (an unreachable broker fails within it).
        allow_compaction: accept a compacted topic (``cleanup.policy`` with ``compact``). Off for the journal:
            compaction keeps only the last record per Kafka key and would drop earlier ones silently.
        ack_timeout_s: how long the writer waits for a record's acknowledgement (bounds ``message.timeout.ms``).
    """

    record_type = StoredRecord
    purge_unsent_on_close = True

    def __init__(self, kafka_config: KafkaSettingsLike | Mapping[str, Any], topic: str, partitions: int, *,
                 create_topic: bool = True, replication_factor: int | None = None,
                 topic_config: Mapping[str, str] | None = None, timeout_s: float = 30.0,
                 allow_compaction: bool = False, ack_timeout_s: float = 60.0):
        super().__init__(settings=kafka_config, topic=topic, partitions=partitions, role=JOURNAL,
                         create_topic=create_topic, replication_factor=replication_factor,
                         topic_config=topic_config, timeout_s=timeout_s, allow_compaction=allow_compaction,
                         ack_timeout_s=ack_timeout_s)
