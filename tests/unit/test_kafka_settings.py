"""The user's Kafka settings reach every client the package builds (issue #12: SASL/SSL were lost)."""

from __future__ import annotations

import pytest

from flink_agents_replay.kafka_topics import ensure_topics

SECURE = {
    "bootstrap.servers": "kafka.example:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "alice",
    "sasl.password": "alice-secret",
}


class _Topics:
    def __init__(self, names):
        self.topics = dict.fromkeys(names)


class _Done:
    def result(self, timeout=None):
        return None


class _RecordingAdminClient:
    """Stands in for confluent-kafka's AdminClient: records the settings it was built with."""

    built: list[dict] = []

    def __init__(self, config):
        self.built.append(dict(config))
        self.created: list[str] = []

    def list_topics(self, topic=None, timeout=-1):
        return _Topics(["exists"])

    def create_topics(self, new_topics, request_timeout=-1, **_):
        return {t.topic: _Done() for t in new_topics}


@pytest.fixture
def admin_clients(monkeypatch):
    import confluent_kafka.admin

    built: list[dict] = []
    monkeypatch.setattr(_RecordingAdminClient, "built", built)
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _RecordingAdminClient)
    return built


def test_ensure_topics_builds_its_admin_client_with_the_users_security_settings(admin_clients):
    created = ensure_topics(SECURE, ["exists", "replies"], 2)
    assert created == ["replies"]
    assert admin_clients and all(config == SECURE for config in admin_clients)


def test_ensure_topics_still_takes_a_bare_bootstrap_string(admin_clients):
    assert ensure_topics("127.0.0.1:9092", ["exists"], 1) == []
    assert admin_clients == [{"bootstrap.servers": "127.0.0.1:9092"}]
