"""The packaged main job with ``--signals-topic`` and ``--waits-topic`` (bounded, on a MiniCluster): decisions read
through the Kafka input path (one that is not a JSON object with a string ``key`` dead-lettered with its reason), the
others to the agent's operator; its wait events to a waits topic the job creates compacted, as versioned JSON keyed
by wait id, exactly once, which ``waits list`` reads.

The example agent never waits, so a decision is for no wait of its key: the operator keeps it as early
(``decision_early``), and one without a wait id is refused (``decision_rejected``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from flink_agents_replay.cli import main as cli
from flink_agents_replay.integrations.kafka.admin import KafkaAdmin, ensure_topics
from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.committed import CommittedReader

pytestmark = pytest.mark.integration


def _committed_records(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    """Every committed (key, value) of ``topic`` (written by a finished job: no transaction is open)."""
    partitions = KafkaAdmin(bootstrap).partition_count(topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOGGER, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, ended = [], set()
    try:
        while len(ended) < partitions:
            message = consumer.poll(10)
            assert message is not None, f"not at the end of {topic} within 10 s"
            if message.error() is not None:
                ended.add(message.partition())
            else:
                records.append((message.key(), message.value()))
    finally:
        consumer.close()
    return records


def test_decisions_are_read_checked_and_wait_events_written_keyed_by_wait_id(kafka_bootstrap, kafka_admin, capsys):
    run = uuid.uuid4().hex[:8]
    tickets, replies, signals, waits = (f"{name}-{run}" for name in ("tickets", "replies", "signals", "waits"))
    ensure_topics(kafka_bootstrap, [tickets, signals], 1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "logger": LIBRDKAFKA_LOGGER})
    for value in [b"not json", json.dumps({"key": "c1", "wait_id": "w1", "approved": True, "signal_id": "s1"}),
                  json.dumps({"key": "c2", "approved": True}), json.dumps({"key": 5, "wait_id": "w5"})]:
        producer.produce(signals, value)
    assert producer.flush(30) == 0

    job = subprocess.run(
        [sys.executable, "-m", "flink_agents_replay.jobs.agent_job", "--bootstrap-servers", kafka_bootstrap,
         "--input-topic", tickets, "--output-topic", replies, "--signals-topic", signals, "--waits-topic", waits,
         "--agent-id", f"signals-{run}", "--parallelism", "1", "--bounded", "--checkpoint-interval-ms", "500",
         "--restart-attempts", "0", "--connector-jar", str(kafka_connector_jar()),
         "--signing-key", "agent-job-signals-signing-key"], capture_output=True, text=True, timeout=300)
    created = [waits, replies, f"{tickets}.dead-letters", signals, tickets]
    try:
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert KafkaAdmin(kafka_bootstrap).topic_settings(waits)["cleanup.policy"] == "compact"

        with CommittedReader(kafka_bootstrap, f"{tickets}.dead-letters", decode=json.loads) as reader:
            letters = reader.read_to_committed_end(timeout_s=30)
        assert sorted((letter["offset"], letter["topic"], letter["reason"]) for letter in letters) == [
            (0, signals, "not JSON: Expecting value: line 1 column 1 (char 0)"),
            (3, signals, "key field 'key' is not a string: 5")]

        records = _committed_records(kafka_bootstrap, waits)
        events = {json.loads(value)["kind"]: (key, json.loads(value)) for key, value in records}
        assert set(events) == {"decision_early", "decision_rejected"} and len(records) == 2
        (early_key, early), (rejected_key, rejected) = events["decision_early"], events["decision_rejected"]
        assert (early_key, rejected_key) == (b"w1", b'rejected:"c2"')
        assert (early["v"], early["key"], early["wait_id"], early["decision"]["approved"]) == (1, "c1", "w1", True)
        assert (rejected["key"], rejected["wait_id"]) == ("c2", None) and "wait_id" in rejected["reason"]

        assert cli(["waits", "list", "--waits-topic", waits, "--all", "--json", "--bootstrap-servers",
                    kafka_bootstrap]) == 0
        [shown] = json.loads(capsys.readouterr().out)
        assert (shown["wait_id"], shown["key"], shown["last_kind"], shown["pending"]) == (
            "w1", "c1", "decision_early", False)
    finally:
        for future in kafka_admin.delete_topics(created, request_timeout=30).values():
            future.result(timeout=60)
