"""Against a broker that requires authentication (SASL_PLAINTEXT, PLAIN): every client the package builds
carries the user's Kafka settings (issue #12: ``ensure_topics`` used to drop them)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from flink_agents_replay.kafka_topics import ensure_topics, partition_count
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
        broker.stop()


def test_the_listener_refuses_clients_without_credentials(sasl_settings):
    anonymous = AdminClient({"bootstrap.servers": sasl_settings["bootstrap.servers"], "log_level": 0})
    with pytest.raises(KafkaException):
        anonymous.list_topics(timeout=5)


def test_ensure_topics_creates_topics_with_the_users_security_settings(sasl_settings):
    topic = f"replies-{uuid.uuid4().hex[:8]}"
    assert ensure_topics(sasl_settings, [topic], 3, replication_factor=1, timeout_s=30) == [topic]
    assert partition_count(sasl_settings, topic) == 3
    assert ensure_topics(sasl_settings, [topic], 3, timeout_s=30) == []  # exists now: left as it is
