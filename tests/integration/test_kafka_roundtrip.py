"""The real broker: partition-addressed produce/consume and delete_records (the journal's needs)."""

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

pytestmark = pytest.mark.integration


def _produce(bootstrap, topic, records):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    errors = []
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(30) == 0
    assert errors == []


def _read_partition(bootstrap, topic, partition, start_offset):
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
        "enable.partition.eof": True,
        # An offset below the low watermark (deleted records) restarts at the earliest remaining one.
        "auto.offset.reset": "earliest",
    })
    consumer.assign([TopicPartition(topic, partition, start_offset)])
    records = []
    try:
        while True:
            msg = consumer.poll(10)
            assert msg is not None, "no end-of-partition within 10 s"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                return records
            records.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()


def _watermarks(bootstrap, topic, partition):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        consumer.close()


def test_partition_addressed_writes_land_where_addressed(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=8)
    records = [(p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode()) for p in range(8) for i in range(5)]
    _produce(kafka_bootstrap, topic, records)
    for p in range(8):
        got = _read_partition(kafka_bootstrap, topic, p, 0)
        assert [(k, v) for _, k, v in got] == [(k, v) for q, k, v in records if q == p]


def test_delete_records_moves_low_watermark_and_removes_records(kafka_bootstrap, kafka_admin, new_topic):
    topic = new_topic(partitions=2)
    _produce(kafka_bootstrap, topic, [(p, b"k", f"{p}-{i}".encode()) for p in range(2) for i in range(10)])
    assert _watermarks(kafka_bootstrap, topic, 0) == (0, 10)

    futures = kafka_admin.delete_records([TopicPartition(topic, 0, 6)], request_timeout=30)
    deleted = futures[TopicPartition(topic, 0, 6)].result(timeout=30)
    assert deleted.low_watermark == 6

    assert _watermarks(kafka_bootstrap, topic, 0) == (6, 10)
    remaining = _read_partition(kafka_bootstrap, topic, 0, 0)  # asks from 0: served from the low watermark
    assert [offset for offset, _, _ in remaining] == [6, 7, 8, 9]
    assert [value for _, _, value in remaining] == [f"0-{i}".encode() for i in range(6, 10)]
    # The other partition is untouched.
    assert _watermarks(kafka_bootstrap, topic, 1) == (0, 10)
