"""A compacted journal or capture topic is refused at start-up; the (compacted) capture manifest is not.

Compaction keeps only the last record per Kafka key, so a journal or capture topic with
``cleanup.policy=compact`` (or ``compact,delete``) loses earlier records of a key without an error, and a
restore or replay would silently miss what they recorded. The check runs against the real broker, like the
partition count check: for a topic that exists, and for the topic settings a created topic would get.
"""

import uuid

import pytest
from confluent_kafka.admin import ConfigResource, NewTopic
from pyflink.common import Types

from flink_agents_replay.core.errors import ConfigError, TopicMismatchError
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.storage.capture.manifest import (
    CaptureDescription,
    ManifestEntry,
    ManifestWriter,
    manifest_topic,
    read_entries,
)
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.testing.agents import chain_agent
from flink_agents_replay.testing.committed import poll_until
from flink_agents_replay.testing.counter import InvocationCounter

pytestmark = pytest.mark.integration

SIGNING_KEY = "cleanup-policy-signing-key-0123"
PARTITIONS = 4


@pytest.fixture
def compacted_topic(kafka_admin):
    """Factory: a topic with ``cleanup.policy`` set as given and PARTITIONS partitions; deleted afterwards."""
    created = []

    def create(policy: str = "compact", partitions: int = PARTITIONS) -> str:
        name = f"compacted-{uuid.uuid4().hex[:10]}"
        topic = NewTopic(name, partitions, 1, config={"cleanup.policy": policy})
        for future in kafka_admin.create_topics([topic], request_timeout=30).values():
            future.result(timeout=60)
        created.append(name)
        # A new topic's metadata reaches the broker's cache asynchronously: wait until it is listed.
        poll_until(lambda: name in kafka_admin.list_topics(timeout=30).topics, 30, f"topic {name} to be listed")
        return name

    yield create
    if created:
        for future in kafka_admin.delete_topics(created, request_timeout=30).values():
            future.result(timeout=60)


def _cleanup_policy(kafka_admin, topic: str) -> str:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = kafka_admin.describe_configs([resource], request_timeout=30)[resource].result(timeout=30)
    return entries["cleanup.policy"].value


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_an_existing_compacted_journal_topic_is_refused_naming_topic_policy_and_fix(kafka_bootstrap, compacted_topic,
                                                                                      policy):
    topic = compacted_topic(policy)
    with pytest.raises(TopicMismatchError) as refused:
        KafkaJournalStore({"bootstrap.servers": kafka_bootstrap}, topic, PARTITIONS, create_topic=False)
    message = str(refused.value)
    assert f"{topic!r}" in message and f"cleanup.policy={policy}" in message, message
    assert "--add-config cleanup.policy=delete" in message and "new topic name" in message, message


def test_connect_to_agent_and_the_operator_s_start_up_refuse_a_compacted_journal(kafka_bootstrap, compacted_topic,
                                                                                tmp_path):
    topic = compacted_topic("compact", partitions=128)  # the partition count fits: only the policy is wrong
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY, "journal_topic": topic}
    agent = chain_agent(InvocationCounter(tmp_path / "calls.db"))

    def keyed():
        env = create_environment(parallelism=1)
        return env.from_collection(["key-000"], type_info=Types.STRING()).key_by(
            lambda key: key, key_type=Types.STRING())

    with pytest.raises(TopicMismatchError, match=rf"'{topic}' has cleanup.policy=compact"):
        connect_to_agent(keyed(), agent, config)
    # Past connect_to_agent's check, the operator's own start-up (open, on the TaskManager) refuses it.
    outputs = connect_to_agent(keyed(), agent, config, check_journal=False)
    with pytest.raises(Exception) as failure:  # noqa: B017 - the job's failure arrives as a Py4J error
        with outputs.execute_and_collect("compacted journal") as results:
            list(results)
    assert "TopicMismatchError" in str(failure.value), str(failure.value)[-3000:]
    assert f"'{topic}' has cleanup.policy=compact" in str(failure.value), str(failure.value)[-3000:]


def test_a_compacted_capture_topic_is_refused_too(kafka_bootstrap, compacted_topic):
    topic = compacted_topic("compact,delete")
    kafka = {"bootstrap.servers": kafka_bootstrap}
    with pytest.raises(TopicMismatchError, match="cleanup.policy=compact,delete"):
        list(read_capture(kafka, topic, PARTITIONS, CaptureDecoder(SIGNING_KEY.encode(), "uid")))
    # As the operator opens its capture topic (topic settings from capture_topic_config).
    with pytest.raises(TopicMismatchError, match="cleanup.policy=compact,delete"):
        KafkaJournalStore(kafka, topic, PARTITIONS, topic_config={"retention.ms": "60000"})


@pytest.mark.parametrize("policy", ["compact", "delete,compact"])
def test_topic_config_that_would_create_a_compacted_journal_is_refused(kafka_bootstrap, kafka_admin, tmp_path,
                                                                       policy):
    topic = f"journal-{uuid.uuid4().hex[:10]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    with pytest.raises(ConfigError, match=rf"topic_config.*cleanup.policy={policy}.*remove"):
        KafkaJournalStore(kafka, topic, PARTITIONS, topic_config={"cleanup.policy": policy})
    env = create_environment(parallelism=1)
    keyed = env.from_collection(["key-000"], type_info=Types.STRING()).key_by(lambda key: key,
                                                                            key_type=Types.STRING())
    with pytest.raises(ConfigError, match=rf"cleanup.policy={policy}"):
        connect_to_agent(keyed, chain_agent(InvocationCounter(tmp_path / "calls.db")), {
            "kafka": kafka, "signing_key": SIGNING_KEY, "journal_topic": topic,
            "topic_config": {"cleanup.policy": policy}})
    assert topic not in kafka_admin.list_topics(timeout=30).topics, "the compacted topic was created anyway"


def test_the_capture_manifest_is_compacted_on_purpose_and_keeps_working(kafka_bootstrap, kafka_admin):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    capture = f"capture-{uuid.uuid4().hex[:10]}"
    topic = manifest_topic(capture)
    description = CaptureDescription("flink-agents-replay/agent", capture, "STRING", PARTITIONS, 1)
    try:
        for checkpoint_id in (1, 2):  # the second writer finds the compacted topic and accepts it
            writer = ManifestWriter(kafka, topic)
            writer.write(ManifestEntry(checkpoint_id, {p: checkpoint_id for p in range(PARTITIONS)}, description))
            writer.close()
        assert _cleanup_policy(kafka_admin, topic) == "compact"
        assert [entry.checkpoint_id for entry in read_entries(kafka, topic)] == [1, 2]
        # A journal store that allows compaction (the manifest's) opens it; the default one refuses it.
        KafkaJournalStore(kafka, topic, 1, create_topic=False, allow_compaction=True).close()
        with pytest.raises(TopicMismatchError, match="cleanup.policy=compact"):
            KafkaJournalStore(kafka, topic, 1, create_topic=False)
    finally:
        for future in kafka_admin.delete_topics([topic], request_timeout=30).values():
            future.result(timeout=60)
