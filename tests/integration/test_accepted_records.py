"""Accepted records on a real job: one per input, before its run, with the key's seq, digest and event time."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Producer

from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import AcceptedRecord, key_digest, parse_journal_key
from flink_agents_replay.testing.agents import chain_agent
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs, run_agent_job

pytestmark = pytest.mark.integration

SIGNING_KEY = "accepted-records-signing-key"


def test_every_input_is_accepted_in_order_with_its_digest_and_event_time(kafka_bootstrap, new_topic, tmp_path):
    inputs = make_inputs(keys=4, per_key=3)
    topic = new_topic(1, "accepted-in")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    base_ms = 1_700_000_000_000
    event_times = {}
    for number, record in enumerate(inputs):  # Kafka record timestamps become Flink event times
        event_times[(record["key"], record["n"])] = base_ms + 1000 * number
        producer.produce(topic, json.dumps(record).encode(), key=record["key"].encode(),
                         timestamp=base_ms + 1000 * number)
    assert producer.flush(30) == 0
    journal_topic = f"journal-{uuid.uuid4().hex[:8]}"
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "journal_topic": journal_topic,
              "signing_key": SIGNING_KEY}
    # No checkpoints: nothing is pruned, the whole journal stays to be read.
    outputs = run_agent_job(kafka_bootstrap, topic, chain_agent(InvocationCounter(tmp_path / "c.db")), config,
                            checkpoint_interval_ms=None)
    assert len(outputs) == len(inputs)

    store = KafkaJournalStore({"bootstrap.servers": kafka_bootstrap}, journal_topic, 128)
    codec = RecordCodec(SIGNING_KEY.encode(), "flink-agents-replay/chain")
    partitions = range(128)
    accepted: dict[tuple[str, int], AcceptedRecord] = {}
    first_kind: dict[tuple[str, int], str] = {}
    for stored in store.read(store.start_offsets(partitions), store.end_offsets(partitions)):
        header, payload = codec.verify(stored.key, stored.value, topic=journal_topic, partition=stored.partition)
        if header["kind"] == "attempt":  # the job's start in each partition, before any run
            continue
        _, seq, _, _, digest = parse_journal_key(stored.key)
        first_kind.setdefault((digest, seq), header["kind"])
        if header["kind"] == "accepted":
            accepted[(digest, seq)] = codec.load(header, payload)
    store.close()

    expected = {}
    for key in {record["key"] for record in inputs}:
        own = [record for record in inputs if record["key"] == key]
        for seq, record in enumerate(own, start=1):
            expected[(key_digest(key), seq)] = (digest_value(record), event_times[(key, record["n"])])
    assert {slot: (r.input_digest, r.event_time) for slot, r in accepted.items()} == expected
    assert set(first_kind.values()) == {"accepted"}, "a run wrote a record before its accepted record"
