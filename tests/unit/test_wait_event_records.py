"""The waits topic's records (jobs/waits_topic.py): versioned JSON of every wait event, keyed by wait id; and the
topic created compacted (ensure_topics with topic settings)."""

from __future__ import annotations

import json

from flink_agents_replay.flink.waits import WaitEvent
from flink_agents_replay.jobs.waits_topic import (
    WAIT_EVENT_VERSION,
    wait_event_dict,
    wait_event_json,
    wait_event_key,
)
from flink_agents_replay.storage.records.waits import Decision

FIELDS = {"v", "kind", "key", "wait_id", "agent", "action", "seq", "name", "payload", "deadline_ms", "opened_at_ms",
          "decision", "reason"}


def test_an_opened_wait_is_its_json_with_the_version_and_no_decision():
    event = WaitEvent("opened", "c-7", "9f2c", "refunds", "refund", 3, "refund-approval", {"amount": 120},
                      1_733_400_000_000, 1_733_390_000_000)
    record = json.loads(wait_event_json(event))
    assert set(record) == FIELDS and WAIT_EVENT_VERSION == 1
    assert record == {"v": 1, "kind": "opened", "key": "c-7", "wait_id": "9f2c", "agent": "refunds",
                      "action": "refund", "seq": 3, "name": "refund-approval", "payload": {"amount": 120},
                      "deadline_ms": 1_733_400_000_000, "opened_at_ms": 1_733_390_000_000, "decision": None,
                      "reason": None}
    assert wait_event_key(event) == "9f2c"


def test_a_decision_is_carried_with_every_field():
    decision = Decision(approved=False, value=[1, "two"], reason="too much", by="ana", decided_at_ms=5, timed_out=False)
    record = wait_event_dict(WaitEvent("resumed", 42, "w1", "refunds", decision=decision))
    assert record["decision"] == {"approved": False, "value": [1, "two"], "reason": "too much", "by": "ana",
                                  "decided_at_ms": 5, "timed_out": False}
    assert record["key"] == 42  # a LONG or INT key stays a number
    timed_out = wait_event_dict(WaitEvent("resumed", "c", "w2", "a", decision=Decision(timed_out=True, by="timeout")))
    assert timed_out["decision"]["timed_out"] is True


def test_an_event_of_no_wait_is_keyed_by_its_run_key():
    """A compacted topic refuses records without a key: a decision that could not be read still gets one."""
    rejected = WaitEvent("decision_rejected", "c-7", None, "refunds", payload="not a decision", reason="no wait_id")
    assert wait_event_key(rejected) == 'rejected:"c-7"'
    assert wait_event_key(WaitEvent("decision_rejected", 7, None, "refunds")) == "rejected:7"
    assert json.loads(wait_event_json(rejected))["reason"] == "no wait_id"


def test_a_value_that_is_not_json_does_not_fail_the_job():
    record = json.loads(wait_event_json(WaitEvent("opened", "c", "w", "a", payload={"odd": {1, 2}})))
    assert record["payload"] == {"odd": "{1, 2}"}


def test_ensure_topics_creates_missing_topics_with_the_settings_given(monkeypatch):
    import confluent_kafka.admin

    from flink_agents_replay.integrations.kafka.admin import ensure_topics

    created = []

    class _Done:
        def result(self, timeout=None):
            return None

    class _Admin:
        def __init__(self, config):
            pass

        def list_topics(self, topic=None, timeout=-1):
            return type("Metadata", (), {"topics": {"exists": None}})()

        def poll(self, timeout=-1):
            return 0

        def create_topics(self, new_topics, request_timeout=-1):
            created.extend(new_topics)
            return {t.topic: _Done() for t in new_topics}

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _Admin)
    assert ensure_topics("127.0.0.1:9092", ["exists", "waits"], 2, topic_config={"cleanup.policy": "compact"}) == [
        "waits"]
    assert [(t.topic, t.num_partitions, t.config) for t in created] == [("waits", 2, {"cleanup.policy": "compact"})]
    created.clear()
    assert ensure_topics("127.0.0.1:9092", ["replies"], 1) == ["replies"]
    assert created[0].config == {}  # the broker's defaults, as before
