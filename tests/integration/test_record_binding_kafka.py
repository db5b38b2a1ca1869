"""Records in their place, on a real broker: a capture record the broker refuses fails the checkpoint (no manifest
entry names it), a capture record copied into another partition or capture topic is refused by the reader, and a
journal loaded under another name is re-signed for it and restores its records."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from flink_agents_replay.core.errors import JournalError, SignatureError
from flink_agents_replay.storage.capture.manifest import CaptureDescription, manifest_topic, read_entries
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import CapturedInput
from flink_agents_replay.storage.capture.schemas import capture_codec
from flink_agents_replay.storage.capture.writer import CaptureWriter
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.transfer import dump_topic, load_topic
from flink_agents_replay.storage.journal.writer import JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec, SigningKeys
from flink_agents_replay.storage.records.journal import AcceptedRecord, RecordKind, journal_key, key_digest

pytestmark = pytest.mark.integration

KEY = b"k" * 32


def _capture_writer(kafka: dict, topic: str, *, max_message_bytes: str | None = None) -> CaptureWriter:
    description = CaptureDescription("op", topic, "STRING", 2, 3)
    topic_config = {"max.message.bytes": max_message_bytes} if max_message_bytes else {}
    return CaptureWriter.to_kafka(kafka, description=description, codec=capture_codec(KEY, "op"), with_manifest=True,
                                  create_topic=True, replication_factor=1, topic_config=topic_config,
                                  kafka_timeout_s=30, ack_timeout_s=30)


def test_a_capture_record_the_broker_refuses_fails_the_checkpoint_and_gets_no_manifest_entry(kafka_bootstrap):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    topic = f"capture-refused-{uuid.uuid4().hex[:8]}"
    writer = _capture_writer(kafka, topic, max_message_bytes="4096")  # the broker refuses larger records
    try:
        writer.write_input(1, CapturedInput("alice", 1, None, {"text": "hi"}, "d1"))
        writer.checkpoint(1, 0, [0, 1])
        writer.write_input(1, CapturedInput("alice", 2, None, {"text": "x" * 20_000}, "d2"))  # too large
        writer.write_input(0, CapturedInput("bob", 1, None, {"text": "fine"}, "d3"))
        # The store stops at the first refused delivery (kafka/store.py), before the capture writer counts them.
        with pytest.raises(JournalError, match=r"capture topic.*(?i:too large)"):
            writer.checkpoint(2, 0, [0, 1])
    finally:
        writer.close()
    # The fault hit the record it was meant for: only it is missing, and no manifest entry stands past it.
    records = list(read_capture(kafka, topic, None, CaptureDecoder(KEY, "op")))
    assert sorted((r.key, r.seq) for r in records) == [("alice", 1), ("bob", 1)]
    assert [entry.checkpoint_id for entry in read_entries(kafka, manifest_topic(topic))] == [1]


def test_a_capture_record_copied_to_another_partition_or_capture_topic_is_refused(kafka_bootstrap):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    production, replay = f"capture-prod-{uuid.uuid4().hex[:8]}", f"capture-replay-{uuid.uuid4().hex[:8]}"
    for topic in (production, replay):
        writer = _capture_writer(kafka, topic)
        try:
            writer.write_input(1, CapturedInput("alice", 1, None, {"text": topic}, "d"))
            writer.checkpoint(1, 0, [0, 1])
        finally:
            writer.close()
    replayed = next(iter(KafkaJournalStore(kafka, replay, 2, create_topic=False, allow_compaction=False)
                         .read({1: 0}, {1: 1})))
    producer = Producer(kafka)
    producer.produce(production, key=replayed.key, value=replayed.value, partition=1)  # another capture topic's
    producer.flush(30)
    with pytest.raises(SignatureError, match=f"read from topic '{production}'"):
        list(read_capture(kafka, production, None, CaptureDecoder(KEY, "op")))

    own = next(iter(KafkaJournalStore(kafka, production, 2, create_topic=False).read({1: 0}, {1: 1})))
    other = f"capture-moved-{uuid.uuid4().hex[:8]}"
    _capture_writer(kafka, other).close()  # an empty capture topic of two partitions
    producer.produce(other, key=own.key, value=own.value, partition=0)  # a record of partition 1 into partition 0
    producer.flush(30)
    with pytest.raises(SignatureError, match="signature|copied to partition 0"):
        list(read_capture(kafka, other, None, CaptureDecoder(KEY, "op")))


def _journal_of_two_records(kafka: dict, topic: str) -> KafkaJournalStore:
    store = KafkaJournalStore(kafka, topic, 2)
    writer = JournalWriter(store, RecordCodec(KEY, "op"), "per_call")
    for group in (0, 1):
        record_key = journal_key(group, 1, "ev-1", "_accepted", key_digest(f"key-{group}"))
        writer.run_journal(group).write(record_key, RecordKind.ACCEPTED, AcceptedRecord(1, f"in-{group}", 5))
    return store


def _read_back(kafka: dict, topic: str) -> list[AcceptedRecord]:
    store = KafkaJournalStore(kafka, topic, 2, create_topic=False)
    try:
        index = read_recovery_index(store, RecordCodec(KEY, "op"), {0: 0, 1: 0}, store.end_offsets([0, 1]))
        return [index.history(key_digest(f"key-{group}")).input_digests[1] for group in (0, 1)]
    finally:
        store.close()


def test_a_journal_loaded_under_another_name_is_re_signed_for_it_and_reads_back(kafka_bootstrap, tmp_path):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    source = f"journal-src-{uuid.uuid4().hex[:8]}"
    _journal_of_two_records(kafka, source).close()
    dump = tmp_path / "journal.jsonl.gz"
    dump_topic(kafka, topic=source, path=dump)

    renamed = f"journal-renamed-{uuid.uuid4().hex[:8]}"
    with pytest.raises(JournalError, match="load it under its own name, or give the job's signing key"):
        load_topic(kafka, path=dump, topic=renamed)
    result = load_topic(kafka, path=dump, topic=renamed, signing_keys=SigningKeys(KEY))
    assert (result.records, result.resigned) == (2, 2)
    assert _read_back(kafka, renamed) == ["in-0", "in-1"]

    # Copied verbatim under another name (what a load without re-signing would give): refused at read.
    verbatim = f"journal-verbatim-{uuid.uuid4().hex[:8]}"
    store = KafkaJournalStore(kafka, verbatim, 2)
    producer = Producer(kafka)
    for stored in KafkaJournalStore(kafka, source, 2, create_topic=False).read({0: 0, 1: 0}, {0: 1, 1: 1}):
        producer.produce(verbatim, key=stored.key, value=stored.value, partition=stored.partition)
    producer.flush(30)
    store.close()
    with pytest.raises(SignatureError, match=f"read from topic '{verbatim}'"):
        _read_back(kafka, verbatim)


def test_a_replay_journals_record_copied_into_productions_journal_is_refused_at_restore(kafka_bootstrap):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    production = f"journal-prod-{uuid.uuid4().hex[:8]}"
    _journal_of_two_records(kafka, production).close()
    replay = f"journal-replay-{uuid.uuid4().hex[:8]}"  # the same operator uid and signing key
    _journal_of_two_records(kafka, replay).close()
    assert _read_back(kafka, production) == ["in-0", "in-1"]
    replayed = next(iter(KafkaJournalStore(kafka, replay, 2, create_topic=False).read({1: 0}, {1: 1})))
    producer = Producer(kafka)
    producer.produce(production, key=replayed.key, value=replayed.value, partition=1)
    producer.flush(30)
    with pytest.raises(SignatureError, match=f"partition 1 offset 1.*read from topic '{production}'"):
        _read_back(kafka, production)
