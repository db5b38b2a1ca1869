"""``flink-agents-replay waits list|decide`` on a real broker: wait events written in transactions, as the job's
exactly-once sink writes them (one aborted), to a waits topic created compacted; the pending waits listed; a
decision sent, read back and parsed by the operator's own parser into the right Signal."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from flink_agents_replay.cli import main
from flink_agents_replay.flink.signals import Signal, parse_signal
from flink_agents_replay.flink.waits import WaitEvent
from flink_agents_replay.integrations.kafka.admin import KafkaAdmin, ensure_topics
from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER
from flink_agents_replay.jobs.agent_job import WAITS_TOPIC_CONFIG
from flink_agents_replay.jobs.waits_topic import wait_event_json, wait_event_key
from flink_agents_replay.storage.records.waits import Decision

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _opened(wait_id: str, key: str, n: int) -> WaitEvent:
    return WaitEvent("opened", key, wait_id, "refunds", "refund", n, "refund-approval", {"reference": f"{key}/{n}"},
                     T0 + 3_600_000, T0 + n * 1000)


def _write_in_transactions(bootstrap: str, topic: str, committed: list[list[WaitEvent]], aborted: list[WaitEvent],
                           left_open: list[WaitEvent]) -> Producer:
    """Transactions as the job's exactly-once sink leaves them: committed, aborted, and one still open (the
    producer returned: abort it)."""
    producer = Producer({"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOGGER,
                         "transactional.id": f"waits-cli-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    for events, end in [*((batch, producer.commit_transaction) for batch in committed),
                        (aborted, producer.abort_transaction), (left_open, None)]:
        producer.begin_transaction()
        for event in events:
            producer.produce(topic, wait_event_json(event).encode(), key=wait_event_key(event).encode())
        producer.flush(30)
        if end is not None:
            end(30)
    return producer


def _read_all(bootstrap: str, topic: str) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOGGER, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages = []
    try:
        while True:
            message = consumer.poll(10)
            assert message is not None, "the signals topic's end did not come"
            if message.error() is not None:
                return messages
            messages.append(message)
    finally:
        consumer.close()


def test_waits_list_shows_the_pending_waits_and_decide_sends_what_the_operator_parses(kafka_bootstrap, new_topic,
                                                                                       kafka_admin, capsys):
    waits_topic, signals_topic = f"waits-{uuid.uuid4().hex[:10]}", new_topic(1, "signals")
    assert ensure_topics(kafka_bootstrap, [waits_topic], 2, topic_config=WAITS_TOPIC_CONFIG) == [waits_topic]
    assert KafkaAdmin(kafka_bootstrap).topic_settings(waits_topic)["cleanup.policy"] == "compact"
    approved = Decision(approved=True, by="bo", decided_at_ms=T0)
    writer = _write_in_transactions(kafka_bootstrap, waits_topic, committed=[
        [_opened("w-1", "c-1", 1), _opened("w-2", "c-2", 2), _opened("w-3", "c-1", 3)],
        [WaitEvent("resumed", "c-1", "w-3", "refunds", decision=approved),
         WaitEvent("closed", "c-1", "w-3", "refunds"), _opened("w-4", "c-3", 4)],
    ], aborted=[_opened("w-5", "c-5", 5), WaitEvent("resumed", "c-2", "w-2", "refunds", decision=approved)],
        left_open=[_opened("w-6", "c-6", 6), _opened("w-7", "c-7", 7)])  # past the committed end: not waited for
    try:
        bootstrap = ["--bootstrap-servers", kafka_bootstrap]

        assert main(["waits", "list", "--waits-topic", waits_topic, *bootstrap]) == 0
        listed = capsys.readouterr().out.splitlines()
        assert [line.split()[:3] for line in listed[1:-1]] == [["w-1", "c-1", "refund-approval"],
                                                               ["w-2", "c-2", "refund-approval"],
                                                               ["w-4", "c-3", "refund-approval"]]
        assert listed[-1] == f"3 pending waits (4 in all, from 6 events of {waits_topic})"  # none of the aborted
        assert main(["waits", "list", "--waits-topic", waits_topic, "--all", "--json", "--key", "c-1",
                     *bootstrap]) == 0
        assert [(w["wait_id"], w["last_kind"]) for w in json.loads(capsys.readouterr().out)] == [
            ("w-1", "opened"), ("w-3", "closed")]

        assert main(["waits", "decide", "w-2", "--approve", "--reason", "fine", "--value", '{"amount": 80}', "--by",
                     "ana", "--signals-topic", signals_topic, "--waits-topic", waits_topic, *bootstrap]) == 0
        assert main(["waits", "decide", "w-3", "--deny", "--signals-topic", signals_topic, "--waits-topic",
                     waits_topic, *bootstrap]) == 2  # closed already
        assert main(["waits", "decide", "w-4", "--deny", "--reason", "no", "--signals-topic", signals_topic, "--key",
                     "c-3", *bootstrap]) == 0
        output = capsys.readouterr()
        assert "wait w-3 is closed already" in output.err
        assert "approved wait w-2 (key 'c-2')" in output.out and "denied wait w-4 (key 'c-3')" in output.out

        sent = _read_all(kafka_bootstrap, signals_topic)
        assert [message.key() for message in sent] == [b"c-2", b"c-3"]
        first, second = (json.loads(message.value()) for message in sent)
        assert parse_signal("c-2", sent[0].value()) == Signal(
            "c-2", "w-2", Decision(approved=True, value={"amount": 80}, reason="fine", by="ana",
                                   decided_at_ms=first["sent_at_ms"]), first["signal_id"])
        assert parse_signal("c-3", sent[1].value()) == Signal(
            "c-3", "w-4", Decision(approved=False, reason="no", decided_at_ms=second["sent_at_ms"]),
            second["signal_id"])
        assert first["key"] == "c-2" and first["signal_id"] != second["signal_id"]
    finally:
        writer.abort_transaction(30)
        for future in kafka_admin.delete_topics([waits_topic], request_timeout=30).values():
            future.result(timeout=60)
