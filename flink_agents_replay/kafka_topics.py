"""Creating the input and output topics a job needs, when they do not exist yet.

Many brokers refuse to create topics on first use (``auto.create.topics.enable=false``), and a Flink
``KafkaSink`` writing to a missing topic fails only after a minute of retries. Jobs and tools call
:func:`ensure_topics` before they start. (The journal, capture and manifest topics are created and checked
by their stores.)

Both functions take the user's Kafka settings: the same confluent-kafka mapping the agent's config holds
(``AgentConfig.kafka``: ``bootstrap.servers`` plus ``security.protocol``, ``sasl.*``, ``ssl.*``...), or a
:class:`~flink_agents_replay.kafka.settings.KafkaSettings`. A bare bootstrap string is still accepted, for a
broker that needs no other setting. The work is :class:`~flink_agents_replay.kafka.admin.KafkaAdmin`'s.
"""

from __future__ import annotations

from collections.abc import Iterable

from flink_agents_replay.kafka.admin import KafkaAdmin
from flink_agents_replay.kafka.settings import KafkaSettingsLike

__all__ = ["ensure_topics", "partition_count"]


def ensure_topics(kafka: KafkaSettingsLike, topics: Iterable[str], partitions: int,
                  replication_factor: int = -1, timeout_s: float = 60.0) -> list[str]:
    """Create those of ``topics`` that do not exist; return the names created.

    ``kafka``: the user's Kafka settings (a mapping with ``bootstrap.servers`` and any security settings,
    passed to the admin client as given), or a bare bootstrap servers string. ``replication_factor=-1``
    takes the broker's default. Existing topics are left as they are.
    """
    return KafkaAdmin(kafka, timeout_s=timeout_s).create_missing(topics, partitions,
                                                                 replication_factor=replication_factor)


def partition_count(kafka: KafkaSettingsLike, topic: str, timeout_s: float = 30.0) -> int | None:
    """How many partitions ``topic`` has, or ``None`` if it does not exist (``kafka`` passed through as given)."""
    return KafkaAdmin(kafka, timeout_s=timeout_s).partition_count(topic)
