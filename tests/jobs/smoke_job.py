"""Smoke job: a thread-mode PyFlink job that writes to and reads back from a real Kafka broker.

It checks the ground the agent operator stands on, end to end:
1. a keyed thread-mode ``KeyedProcessFunction`` computes each key's Flink key group in Python and checks
   it against the key groups its subtask owns (docs/design.md §2);
2. Flink's exactly-once ``KafkaSink`` writes the records (committed at checkpoints);
3. a bounded ``KafkaSource`` reads the topic back with ``read_committed`` and every record must come
   back exactly once.

Run it on a MiniCluster (``python tests/jobs/smoke_job.py --bootstrap-servers HOST:PORT``) or submit it with
``flink run -py tests/jobs/smoke_job.py ...``. It prints a short table and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass

from pyflink.common import Types, WatermarkStrategy
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream import KeyedProcessFunction
from pyflink.datastream.connectors.base import DeliveryGuarantee
from pyflink.datastream.connectors.kafka import (
    KafkaOffsetsInitializer,
    KafkaRecordSerializationSchema,
    KafkaSink,
    KafkaSource,
)

from flink_agents_replay.core.keygroups import key_group, key_group_range
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.runtime_info import subtask_info
from flink_agents_replay.local.jars import kafka_connector_jar


@dataclass
class SmokeResult:
    """What the smoke job saw."""

    records_written: int
    records_read: int
    missing: int
    duplicates: int
    key_group_mismatches: int
    write_seconds: float
    read_seconds: float

    @property
    def ok(self) -> bool:
        """Every record came back exactly once and every key landed in its subtask's key groups."""
        return (self.records_read == self.records_written and self.missing == 0
                and self.duplicates == 0 and self.key_group_mismatches == 0)


class TagWithKeyGroup(KeyedProcessFunction):
    """Adds the Python-computed key group and whether the receiving subtask owns it."""

    def open(self, runtime_context):
        info = subtask_info(runtime_context)
        self.max_parallelism = info.max_parallelism
        self.owned = key_group_range(info.index, info.parallelism, info.max_parallelism)

    def process_element(self, value, ctx):
        group = key_group(ctx.get_current_key(), "STRING", self.max_parallelism)
        yield json.dumps({"key": value[0], "n": value[1], "key_group": group, "owned": group in self.owned})


def write_records(bootstrap_servers: str, topic: str, records: int, parallelism: int) -> None:
    """Job 1: key, tag and write ``records`` records to ``topic`` with the exactly-once sink."""
    env = create_environment(
        parallelism=parallelism, max_parallelism=128, checkpoint_interval_ms=500, jars=[kafka_connector_jar()]
    )
    rows = [(f"customer-{i % 97}-ключ-🦀", i) for i in range(records)]
    sink = (
        KafkaSink.builder()
        .set_bootstrap_servers(bootstrap_servers)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder().set_topic(topic)
            .set_value_serialization_schema(SimpleStringSchema()).build()
        )
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(f"smoke-{uuid.uuid4().hex[:8]}")
        .set_property("transaction.timeout.ms", "60000")
        .build()
    )
    (
        env.from_collection(rows, type_info=Types.TUPLE([Types.STRING(), Types.INT()]))
        .key_by(lambda row: row[0], key_type=Types.STRING())
        .process(TagWithKeyGroup(), output_type=Types.STRING())
        .sink_to(sink)
    )
    env.execute("flink-agents-replay smoke: write")


def read_records(bootstrap_servers: str, topic: str) -> list[dict]:
    """Job 2: read ``topic`` back, committed records only, from earliest to the current end."""
    env = create_environment(parallelism=1, jars=[kafka_connector_jar()])
    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(bootstrap_servers)
        .set_topics(topic)
        .set_group_id(f"smoke-reader-{uuid.uuid4().hex[:8]}")
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_bounded(KafkaOffsetsInitializer.latest())
        .set_value_only_deserializer(SimpleStringSchema())
        .set_property("isolation.level", "read_committed")
        .build()
    )
    stream = env.from_source(source, WatermarkStrategy.no_watermarks(), "smoke topic")
    with stream.execute_and_collect("flink-agents-replay smoke: read") as results:
        return [json.loads(text) for text in results]


def create_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    """Create ``topic`` on the broker (one replica: a local single-node broker)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=30).values():
        future.result(timeout=60)


def run(bootstrap_servers: str, *, topic: str | None = None, records: int = 500, parallelism: int = 2) -> SmokeResult:
    """Run both jobs against a fresh topic and compare what came back with what went out."""
    topic = topic or f"smoke-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap_servers, topic, partitions=4)
    started = time.monotonic()
    write_records(bootstrap_servers, topic, records, parallelism)
    written_at = time.monotonic()
    rows = read_records(bootstrap_servers, topic)
    read_at = time.monotonic()
    seen = Counter(row["n"] for row in rows)
    return SmokeResult(
        records_written=records,
        records_read=len(rows),
        missing=sum(1 for n in range(records) if n not in seen),
        duplicates=sum(c - 1 for c in seen.values() if c > 1),
        key_group_mismatches=sum(1 for row in rows if not row["owned"]),
        write_seconds=round(written_at - started, 1),
        read_seconds=round(read_at - written_at, 1),
    )


def format_table(result: SmokeResult) -> str:
    """The result as a two-column table for people."""
    rows = list(asdict(result).items()) + [("verdict", "OK" if result.ok else "FAILED")]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.replace('_', ' '):<{width}}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka bootstrap servers, e.g. 127.0.0.1:9092")
    parser.add_argument("--topic", default=None, help="topic to create and use (default: a fresh random name)")
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)
    result = run(args.bootstrap_servers, topic=args.topic, records=args.records, parallelism=args.parallelism)
    print(format_table(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
