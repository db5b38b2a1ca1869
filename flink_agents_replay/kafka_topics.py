"""Creating the input and output topics a job needs, when they do not exist yet.

Many brokers refuse to create topics on first use (``auto.create.topics.enable=false``), and a Flink
``KafkaSink`` writing to a missing topic fails only after a minute of retries. Jobs and tools call
:func:`ensure_topics` before they start. (The journal topic is created and checked by the journal store.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ensure_topics", "partition_count"]


def ensure_topics(bootstrap_servers: str, topics: Iterable[str], partitions: int,
                  replication_factor: int = -1, timeout_s: float = 60.0) -> list[str]:
    """Create those of ``topics`` that do not exist; return the names created.

    ``replication_factor=-1`` takes the broker's default. Existing topics are left as they are.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = [topic for topic in dict.fromkeys(topics) if topic not in existing]
    if missing:
        futures = admin.create_topics([NewTopic(topic, partitions, replication_factor) for topic in missing],
                                      request_timeout=timeout_s)
        for future in futures.values():
            future.result(timeout=timeout_s)
    return missing


def partition_count(kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 30.0) -> int | None:
    """How many partitions ``topic`` has, or ``None`` if it does not exist (``kafka_config`` passed through)."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient(dict(kafka_config)).list_topics(topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        return None
    return len(metadata.partitions)
