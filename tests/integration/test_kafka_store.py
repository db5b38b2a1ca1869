"""The journal store on the real broker: layout checks, acknowledged appends, bounded reads, pruning."""

import time
import uuid

import pytest

from flink_agents_replay.core.errors import ConfigError, JournalError, TopicMismatchError
from flink_agents_replay.local.processes import free_port
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore

pytestmark = pytest.mark.integration


@pytest.fixture
def journal(kafka_bootstrap, kafka_admin):
    stores = []

    def open_store(partitions=8, topic=None, **kwargs):
        store = KafkaJournalStore({"bootstrap.servers": kafka_bootstrap}, topic or f"journal-{uuid.uuid4().hex[:8]}",
                                  partitions, **kwargs)
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        store.close()
    topics = list({s.topic for s in stores})
    if topics:
        for future in kafka_admin.delete_topics(topics, request_timeout=30).values():
            future.result(timeout=60)


def test_creates_topic_and_appends_read_back_in_order(journal):
    store = journal(partitions=8)
    deliveries = [store.append(p, f"k{p}-{i}".encode(), f"v{i}".encode()) for p in (2, 5) for i in range(20)]
    offsets = [d.wait(30) for d in deliveries]
    assert offsets == list(range(20)) * 2
    assert store.end_offsets([2, 5, 7]) == {2: 20, 5: 20, 7: 0}
    records = list(store.read({2: 5, 5: 0, 7: 0}, {2: 20, 5: 10, 7: 0}))
    assert [(r.partition, r.offset) for r in records if r.partition == 2] == [(2, i) for i in range(5, 20)]
    assert [r.value for r in records if r.partition == 5] == [f"v{i}".encode() for i in range(10)]


def test_delete_before_moves_low_watermark(journal):
    store = journal(partitions=4)
    for i in range(10):
        store.append(1, b"k", str(i).encode())
    store.flush(30)
    store.delete_before({1: 7})
    deadline = time.monotonic() + 30
    while store.start_offsets([1])[1] != 7:
        assert time.monotonic() < deadline, "low watermark did not move"
        time.sleep(0.05)
    assert [r.offset for r in store.read({1: 7}, {1: 10})] == [7, 8, 9]
    with pytest.raises(JournalError):  # reading below the low watermark is a gap, never skipped silently
        list(store.read({1: 0}, {1: 10}))


def test_existing_topic_with_other_partition_count_names_both_numbers(journal):
    store = journal(partitions=4)
    with pytest.raises(TopicMismatchError, match=r"has 4 partitions but the job's max parallelism is 128.*Fix"):
        journal(partitions=128, topic=store.topic)


def test_existing_topic_keeps_its_id(journal):
    store = journal(partitions=4)
    again = journal(partitions=4, topic=store.topic)
    assert again.topic_id == store.topic_id and len(store.topic_id) > 10


def test_unreachable_broker_fails_within_the_timeout():
    started = time.monotonic()
    with pytest.raises(JournalError, match="could not reach Kafka"):
        KafkaJournalStore({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, "t", 4, timeout_s=3)
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("setting", [{"acks": "1"}, {"enable.idempotence": False}])
def test_settings_that_break_the_journal_are_refused(setting, kafka_bootstrap):
    with pytest.raises(ConfigError, match="remove"):
        KafkaJournalStore({"bootstrap.servers": kafka_bootstrap, **setting}, "t", 4)


def test_missing_bootstrap_servers_is_a_config_error():
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        KafkaJournalStore({}, "t", 4)


def test_errors_name_the_topic_by_its_role(journal, kafka_bootstrap):
    from flink_agents_replay.integrations.kafka import CAPTURE, MANIFEST, KafkaTopicStore

    existing = journal(partitions=4).topic
    with pytest.raises(TopicMismatchError, match=rf"^capture topic '{existing}' has 4 partitions but the job's max "
                                                 r"parallelism is 8.*Fix: use a new capture topic name"):
        KafkaTopicStore(settings={"bootstrap.servers": kafka_bootstrap}, topic=existing, partitions=8, role=CAPTURE)
    with pytest.raises(JournalError, match=r"^capture manifest topic 'no-such-manifest' does not exist"):
        KafkaTopicStore(settings={"bootstrap.servers": kafka_bootstrap}, topic="no-such-manifest", partitions=1,
                        role=MANIFEST, create_topic=False)


def test_closing_the_journal_delivers_what_was_appended(journal):
    """Records appended just before close are the outcomes of calls already made: dropping them (a purge)
    would turn a finished call into one in doubt, and the next attempt would make it again."""
    store = journal(partitions=2)
    deliveries = [store.append(1, f"k{i}".encode(), b"v" * 100) for i in range(200)]
    store.close()  # at once: most of the 200 are still in the producer's queue (linger.ms)
    assert all(d.wait(1) >= 0 for d in deliveries)
    assert store.end_offsets([1]) == {1: 200}
