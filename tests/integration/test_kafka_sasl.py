"""Against a broker that requires authentication (SASL_PLAINTEXT, PLAIN): every client the package builds
carries the user's Kafka settings (issue #12: ``ensure_topics`` used to drop them)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from flink_agents_replay.integrations.kafka.admin import ensure_topics, partition_count
from flink_agents_replay.local.kafka_broker import LocalKafkaBroker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sasl_settings(tmp_path_factory) -> dict:
    """Client settings for a broker of its own whose SASL listener knows the user alice."""
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("sasl-kafka"), sasl_users={"alice": "alice-secret"})
    status = broker.start()
    try:
        yield {"bootstrap.servers": status.sasl_bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
               "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"}
    finally:
        broker.discard()


def test_the_listener_refuses_clients_without_credentials(sasl_settings):
    anonymous = AdminClient({"bootstrap.servers": sasl_settings["bootstrap.servers"], "log_level": 0})
    with pytest.raises(KafkaException):
        anonymous.list_topics(timeout=5)


def test_ensure_topics_creates_topics_with_the_users_security_settings(sasl_settings):
    topic = f"replies-{uuid.uuid4().hex[:8]}"
    assert ensure_topics(sasl_settings, [topic], 3, replication_factor=1, timeout_s=30) == [topic]
    assert partition_count(sasl_settings, topic) == 3
    assert ensure_topics(sasl_settings, [topic], 3, timeout_s=30) == []  # exists now: left as it is


def test_the_journal_store_writes_reads_and_prunes_with_the_users_security_settings(sasl_settings):
    from flink_agents_replay.flink.config import AgentConfig
    from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore

    settings = AgentConfig(kafka=sasl_settings).kafka_settings()
    store = KafkaJournalStore(settings, f"journal-{uuid.uuid4().hex[:8]}", 4)
    try:
        assert [store.append(2, b"k", f"v{i}".encode()).wait(30) for i in range(3)] == [0, 1, 2]
        assert [r.value for r in store.read({2: 1}, store.end_offsets([2]))] == [b"v1", b"v2"]
        store.delete_before({2: 1})
        assert _eventually(lambda: store.start_offsets([2]) == {2: 1})
    finally:
        store.close()


def test_capture_and_manifest_write_and_read_with_the_users_security_settings(sasl_settings):
    from flink_agents_replay.storage.capture.manifest import CaptureDescription, read_capture_start
    from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
    from flink_agents_replay.storage.capture.records import CapturedInput
    from flink_agents_replay.storage.capture.schemas import capture_codec
    from flink_agents_replay.storage.capture.writer import CaptureWriter

    capture_topic = f"capture-{uuid.uuid4().hex[:8]}"
    description = CaptureDescription("op", capture_topic, "STRING", 2, 1)
    writer = CaptureWriter.to_kafka(sasl_settings, description=description, codec=capture_codec(b"k" * 32, "op"),
                                    with_manifest=True, create_topic=True, replication_factor=1, topic_config={},
                                    kafka_timeout_s=30, ack_timeout_s=30)
    try:
        writer.write_input(1, CapturedInput("alice", 1, None, {"text": "hi"}, "digest"))
        writer.checkpoint(7, 0, [0, 1], checkpoint_time_ms=1_780_000_000_000)
    finally:
        writer.close()
    start = read_capture_start(sasl_settings, capture_topic, 7)
    assert start.offsets == {0: 0, 1: 1} and start.description.uid == "op"
    assert start.checkpoint_time_ms == 1_780_000_000_000
    records = list(read_capture(sasl_settings, capture_topic, None, CaptureDecoder(b"k" * 32, "op")))
    assert [(r.key, r.seq) for r in records] == [("alice", 1)]


def test_inspect_and_its_command_line_read_with_the_users_security_settings(sasl_settings):
    import subprocess
    import sys

    from flink_agents_replay.storage.journal.inspect import summarize_topic

    topic = f"journal-{uuid.uuid4().hex[:8]}"
    ensure_topics(sasl_settings, [topic], 3, replication_factor=1)
    assert [(p.partition, p.records) for p in summarize_topic(sasl_settings, topic)] == [(0, 0), (1, 0), (2, 0)]
    options = [option for name, value in sasl_settings.items() if name != "bootstrap.servers"
               for option in ("-X", f"{name}={value}")]
    shown = subprocess.run([sys.executable, "-m", "flink_agents_replay.cli", "inspect", "--bootstrap-servers",
                            sasl_settings["bootstrap.servers"], "--topic", topic, *options],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert f"journal topic {topic}: 3 partitions, 0 records stored" in shown.stdout


def test_journal_dump_and_load_keep_offsets_with_the_users_security_settings(sasl_settings, tmp_path):
    """Dump and load build an admin client, a consumer and a producer: each must carry the login, or the
    listener refuses it (see the first test)."""
    from flink_agents_replay.integrations.kafka import KafkaSettings
    from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
    from flink_agents_replay.storage.journal.transfer import dump_topic, load_topic

    source, target = f"journal-{uuid.uuid4().hex[:8]}", f"moved-{uuid.uuid4().hex[:8]}"
    store = KafkaJournalStore(sasl_settings, source, 2)
    try:
        assert [store.append(1, f"k{i}".encode(), f"v{i}".encode()).wait(30) for i in range(4)] == [0, 1, 2, 3]
        store.delete_before({1: 1})
        assert _eventually(lambda: store.start_offsets([0, 1]) == {0: 0, 1: 1})
    finally:
        store.close()

    header = dump_topic(sasl_settings, topic=source, path=tmp_path / "journal.jsonl.gz")
    assert (header.partitions, header.low, header.high) == (2, {0: 0, 1: 1}, {0: 0, 1: 4})
    result = load_topic(KafkaSettings.of(sasl_settings), path=tmp_path / "journal.jsonl.gz", topic=target)
    assert (result.records, result.fillers, result.old_topic_id) == (3, 1, header.topic_id)

    moved = KafkaJournalStore(sasl_settings, target, 2, create_topic=False)
    try:
        assert moved.start_offsets([0, 1]) == {0: 0, 1: 1} and moved.end_offsets([0, 1]) == {0: 0, 1: 4}
        assert [(r.offset, r.key, r.value) for r in moved.read({1: 1}, {1: 4})] == \
            [(1, b"k1", b"v1"), (2, b"k2", b"v2"), (3, b"k3", b"v3")]
    finally:
        moved.close()


def _eventually(condition, timeout_s: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
