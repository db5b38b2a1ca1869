"""Dump and load of a topic (flink_agents_replay.storage.journal.transfer) on a real broker: every record keeps its
offset, key, value, headers and timestamp across gaps (a deleted prefix, transaction markers, an aborted
transaction), the journal's reader passes over the fillers, and a non-empty target is refused."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from flink_agents_replay.cli import main as cli_main
from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.transfer import FILLER_KEY, dump_topic, load_topic, read_dump

pytestmark = pytest.mark.integration


def _offsets(admin: AdminClient, topic: str, partitions: int, spec) -> dict[int, int]:
    futures = admin.list_offsets({TopicPartition(topic, p): spec for p in range(partitions)}, request_timeout=30)
    return {tp.partition: f.result(timeout=30).offset for tp, f in futures.items()}


def _committed_records(bootstrap: str, topic: str, partitions: int) -> list[tuple]:
    """(partition, offset, key, value, headers, timestamp) of every record a read_committed consumer sees."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    low = _offsets(admin, topic, partitions, OffsetSpec.earliest())
    high = _offsets(admin, topic, partitions, OffsetSpec.latest())
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, low[p]) for p in range(partitions) if low[p] < high[p]])
    found = []
    try:
        while True:
            positions = consumer.position([TopicPartition(topic, p) for p in range(partitions) if low[p] < high[p]])
            if all(tp.offset >= high[tp.partition] for tp in positions):
                return sorted(found)
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                found.append((message.partition(), message.offset(), message.key(), message.value(),
                              tuple(message.headers() or ()), message.timestamp()[1]))
    finally:
        consumer.close()


def _topic_with_gaps(bootstrap: str) -> str:
    """Two partitions: p0 with plain records, a committed and an aborted transaction, a deleted prefix;
    p1 with a few plain records carrying headers."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"transfer-src-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "-1"})])[topic].result(timeout=60)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for n in range(5):
        plain.produce(topic, key=f"k{n}".encode(), value=f"v{n}".encode(), partition=0, timestamp=1_700_000_000_000 + n)
        plain.produce(topic, key=f"h{n}".encode(), value=bytes([n, 0, 255]), partition=1,
                      headers=[("trace", f"t{n}".encode())])
    assert plain.flush(30) == 0
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    transactional.init_transactions(30)
    for commit, label in ((True, "committed"), (False, "aborted")):
        transactional.begin_transaction()
        for n in range(3):
            transactional.produce(topic, key=f"{label}{n}".encode(), value=label.encode(), partition=0)
        transactional.flush(30)
        (transactional.commit_transaction if commit else transactional.abort_transaction)(30)
    for n in range(2):
        plain.produce(topic, key=f"after{n}".encode(), value=None, partition=0)  # a tombstone-like null value
    assert plain.flush(30) == 0
    deleted = admin.delete_records([TopicPartition(topic, 0, 2)], request_timeout=30)
    for future in deleted.values():
        future.result(timeout=30)
    return topic


def test_load_puts_every_record_at_its_offset_across_gaps(kafka_bootstrap, tmp_path):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    source = _topic_with_gaps(kafka_bootstrap)
    original = _committed_records(kafka_bootstrap, source, 2)
    admin = AdminClient(kafka)
    low, high = _offsets(admin, source, 2, OffsetSpec.earliest()), _offsets(admin, source, 2, OffsetSpec.latest())
    assert low[0] == 2 and high[0] > 5 + 3 + 3 + 2, (low, high)  # markers take offsets: there are gaps

    header = dump_topic(kafka, topic=source, path=tmp_path / "dump.jsonl.gz")
    assert (header.low, header.high, header.configs) == (low, high, {"retention.ms": "-1"})
    _, dumped = read_dump(tmp_path / "dump.jsonl.gz")
    assert len(list(dumped)) == len(original)

    target = f"transfer-dst-{uuid.uuid4().hex[:8]}"
    result = load_topic(kafka, path=tmp_path / "dump.jsonl.gz", topic=target)
    assert result.old_topic_id == header.topic_id and result.new_topic_id != header.topic_id
    assert result.records == len(original) and result.fillers > 0
    assert (_offsets(admin, target, 2, OffsetSpec.earliest()), _offsets(admin, target, 2, OffsetSpec.latest())) \
        == (low, high)
    loaded = _committed_records(kafka_bootstrap, target, 2)
    assert [r for r in loaded if r[2] != FILLER_KEY] == original

    # The journal's reader (journal, capture and manifest readers all go through it) never sees a filler.
    store = KafkaJournalStore(kafka, target, 2, create_topic=False)
    try:
        read = sorted((r.partition, r.offset, r.key, r.value) for r in store.read(low, high))
    finally:
        store.close()
    assert read == [r[:4] for r in original]

    with pytest.raises(JournalError, match="already exists and is not empty"):
        load_topic(kafka, path=tmp_path / "dump.jsonl.gz", topic=target)


def test_load_accepts_an_existing_empty_topic_only_with_the_dumps_partition_count(kafka_bootstrap, new_topic,
                                                                                   tmp_path):
    from flink_agents_replay.core.errors import TopicMismatchError

    source = _topic_with_gaps(kafka_bootstrap)
    dump = tmp_path / "dump.jsonl.gz"
    header = dump_topic(kafka_bootstrap, topic=source, path=dump)  # a bare bootstrap string is settings too
    three = new_topic(partitions=3, prefix="transfer-three")
    with pytest.raises(TopicMismatchError, match=f"topic '{three}' already exists with 3 partitions, not 2"):
        load_topic(kafka_bootstrap, path=dump, topic=three)
    empty = new_topic(partitions=2, prefix="transfer-empty")
    result = load_topic(kafka_bootstrap, path=dump, topic=empty)
    assert result.topic == empty and result.records + result.fillers == sum(header.high.values())


def test_cli_dump_and_load_print_the_setting_to_accept_the_moved_journal(kafka_bootstrap, tmp_path, capsys):
    source = _topic_with_gaps(kafka_bootstrap)
    dump = str(tmp_path / "cli.jsonl.gz")
    assert cli_main(["journal", "dump", "--bootstrap-servers", kafka_bootstrap, "--topic", source, "--out", dump]) == 0
    target = f"transfer-cli-{uuid.uuid4().hex[:8]}"
    assert cli_main(["journal", "load", "--bootstrap-servers", kafka_bootstrap, "--topic", target, "--in", dump]) == 0
    header, _ = read_dump(dump)
    printed = capsys.readouterr().out
    assert f"accept_moved_journal_from={header.topic_id!r}" in printed, printed
    # Loading again into the now non-empty topic: one clear line, exit code 2, no traceback.
    assert cli_main(["journal", "load", "--bootstrap-servers", kafka_bootstrap, "--topic", target, "--in", dump]) == 2
    error = capsys.readouterr().err
    assert "already exists and is not empty" in error and "Traceback" not in error
    assert cli_main(["journal", "load", "--bootstrap-servers", kafka_bootstrap,
                     "--in", str(tmp_path / "missing.gz")]) == 2
    assert "missing.gz" in capsys.readouterr().err
    assert cli_main(["journal", "dump", "--bootstrap-servers", kafka_bootstrap, "--topic", "no-such-topic-here",
                     "--out", str(tmp_path / "none.gz")]) == 2
    error = capsys.readouterr().err
    assert "no-such-topic-here" in error and "Traceback" not in error
