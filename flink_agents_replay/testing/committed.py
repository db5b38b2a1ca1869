"""Read a topic the way a downstream consumer of an exactly-once sink does: committed records only.

Flink's exactly-once ``KafkaSink`` writes inside transactions committed when a checkpoint completes; a
consumer with ``isolation.level=read_committed`` sees each record once, and never one of an aborted
transaction (the attempt a failure cut short). :class:`CommittedReader` is such a consumer, for the demo
and the tests that check "exactly once" on the output topic.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER

__all__ = ["CommittedReader", "poll_until"]


def poll_until(condition: Callable[[], object], timeout_s: float, what: Callable[[], str] | str,
               interval_s: float = 0.2):
    """Call ``condition`` until it returns something truthy, and return that; ``TimeoutError`` naming
    ``what`` (a string, or a callable giving one) at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s:.0f} s: {what() if callable(what) else what}")
        time.sleep(interval_s)


class CommittedReader:
    """A ``read_committed`` consumer of every partition of ``topic``, from the beginning.

    Args:
        bootstrap_servers: the broker.
        topic: the topic to read (it must exist).
        decode: turns a record's value (bytes) into a row (default: the bytes).
    """

    def __init__(self, bootstrap_servers: str, topic: str, decode: Callable[[bytes], object] = bytes):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
        from confluent_kafka.admin import AdminClient

        self.decode = decode
        self.admin = AdminClient({"bootstrap.servers": bootstrap_servers, "logger": LIBRDKAFKA_LOGGER})
        metadata = self.admin.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise LookupError(f"topic {topic!r} does not exist on {bootstrap_servers}")
        partitions = metadata.partitions
        self.partitions = [TopicPartition(topic, p) for p in sorted(partitions)]
        self.consumer = Consumer({"bootstrap.servers": bootstrap_servers, "logger": LIBRDKAFKA_LOGGER,
                                  "group.id": f"committed-reader-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, "isolation.level": "read_committed"})
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])
        self.rows: list = []

    def poll(self, seconds: float = 0.5) -> list:
        """Read what arrives within ``seconds``; return every row read so far."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = self.consumer.poll(0.1)
            if message is not None and message.error() is None:
                self.rows.append(self.decode(message.value()))
        return self.rows

    def read_to_committed_end(self, timeout_s: float = 60) -> list:
        """Read on until every partition reaches its last stable offset as it is now; return all rows."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import OffsetSpec

        futures = self.admin.list_offsets({tp: OffsetSpec.latest() for tp in self.partitions},
                                          isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30)
        ends = {tp.partition: future.result().offset for tp, future in futures.items()}

        def reached() -> bool:
            self.poll(0.2)
            positions = self.consumer.position(self.partitions)
            return all(ends[tp.partition] == 0 or tp.offset >= ends[tp.partition] for tp in positions)

        poll_until(reached, timeout_s, lambda: f"positions {self.consumer.position(self.partitions)}, ends {ends}",
                   interval_s=0)
        return self.rows

    def close(self) -> None:
        """Leave without committing anything."""
        self.consumer.close()

    def __enter__(self) -> CommittedReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
