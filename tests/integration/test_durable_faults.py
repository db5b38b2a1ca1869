"""Bad input and faults: each a clear error naming the problem and the fix; nothing silently skipped."""

import threading
import time
import uuid

import pytest
from pyflink.common import Types

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.core.errors import ConfigError, JournalError, TopicMismatchError
from flink_agents_replay.core.keygroups import UnsupportedKeyTypeError, key_group
from flink_agents_replay.flink.config import SIGNING_KEY_ENV
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.processes import free_port
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord, RecordKind, journal_key, key_digest
from flink_agents_replay.testing.agents import chain_agent
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs, produce_inputs, run_agent_job

pytestmark = pytest.mark.integration

SIGNING_KEY = "fault-tests-signing-key-0123"


class Echo(Agent):
    @action(InputEvent)
    def echo(event, ctx):
        ctx.send_event(OutputEvent(output=event.input))


def _keyed(key_type="STRING"):
    key_type = Types.STRING() if key_type == "STRING" else key_type
    env = create_environment()
    stream = env.from_collection(["a", "b"], type_info=Types.STRING())
    return stream.key_by(lambda x: x, key_type=key_type) if key_type is not None else stream.key_by(lambda x: x)


def _config(bootstrap, **overrides):
    return {"kafka": {"bootstrap.servers": bootstrap}, "journal_topic": f"journal-{uuid.uuid4().hex[:8]}",
            "signing_key": SIGNING_KEY, **overrides}


def test_topic_with_wrong_partition_count_is_a_startup_error(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=12)
    with pytest.raises(TopicMismatchError, match=r"has 12 partitions but the job's max parallelism is 128.*Fix"):
        connect_to_agent(_keyed(), Echo(), _config(kafka_bootstrap, journal_topic=topic))


def test_unreachable_broker_fails_fast_with_a_clear_error():
    started = time.monotonic()
    with pytest.raises(JournalError, match="could not reach Kafka at 127.0.0.1"):
        connect_to_agent(_keyed(), Echo(), _config(f"127.0.0.1:{free_port()}", kafka_timeout_s=3))
    assert time.monotonic() - started < 20


def test_keys_without_a_supported_key_type_are_refused(kafka_bootstrap):
    with pytest.raises(UnsupportedKeyTypeError, match="no key_type"):
        connect_to_agent(_keyed(None), Echo(), _config(kafka_bootstrap))
    with pytest.raises(UnsupportedKeyTypeError, match="Double"):
        env = create_environment()
        keyed = env.from_collection([1.5], type_info=Types.DOUBLE()).key_by(lambda x: x, key_type=Types.DOUBLE())
        connect_to_agent(keyed, Echo(), _config(kafka_bootstrap))


def test_missing_signing_key_names_the_setting(kafka_bootstrap, monkeypatch):
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=SIGNING_KEY_ENV):
        connect_to_agent(_keyed(), Echo(), {"kafka": {"bootstrap.servers": kafka_bootstrap}})


def test_unknown_setting_is_named(kafka_bootstrap):
    with pytest.raises(ConfigError, match=r"unknown agent config setting\(s\) \['max_concurency'\]"):
        connect_to_agent(_keyed(), Echo(), {"kafka": {}, "max_concurency": 3})


def _foreign_record_writer(bootstrap, topic, signing_key, producer_id):
    """Called inside the worker just before the injected failure: writes a record recovery must reject."""

    def write():
        from confluent_kafka import Producer  # imported here: a captured C type does not travel well

        key = "key-000"
        record_key = journal_key(key_group(key, "STRING", 128), 999, "e", "classify", key_digest(key))
        forged = CallRecord(999, 0, "e", "classify", 0, "llm", "forged", CallOutcome.RETURNED, "forged")
        value = RecordCodec(signing_key.encode(), producer_id).encode(
            record_key, RecordKind.CALL, forged, topic=topic, partition=key_group(key, "STRING", 128))
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, value=value, key=record_key, partition=key_group(key, "STRING", 128))
        producer.flush(30)

    return write


@pytest.mark.parametrize("forger", ["other-signing-key", "other-producer"])
def test_forged_journal_record_is_rejected_at_restore(kafka_bootstrap, tmp_path, forger):
    topic = f"journal-{uuid.uuid4().hex[:8]}"
    input_topic = produce_inputs(kafka_bootstrap, make_inputs(4, 4))
    signing_key = "a-different-signing-key-0123" if forger == "other-signing-key" else SIGNING_KEY
    producer_id = "someone-else" if forger == "other-producer" else "flink-agents-replay/chain"
    counter = InvocationCounter(tmp_path / "calls.db")
    agent = chain_agent(counter, fail_after_calls=30,
                        before_failure=_foreign_record_writer(kafka_bootstrap, topic, signing_key, producer_id))
    with pytest.raises(Exception) as failure:  # noqa: B017 - the job's failure arrives as a Py4J error
        run_agent_job(kafka_bootstrap, input_topic, agent, _config(kafka_bootstrap, journal_topic=topic),
                      restart_attempts=1, checkpoint_interval_ms=200)
    expected = "failed signature verification" if forger == "other-signing-key" else "was written by 'someone-else'"
    assert expected in str(failure.value)
    assert counter.count("fault_fired") == 1


def test_non_picklable_memory_value_fails_naming_action_and_path(kafka_bootstrap, tmp_path):
    input_topic = produce_inputs(kafka_bootstrap, make_inputs(2, 1))
    agent = chain_agent(InvocationCounter(tmp_path / "calls.db"), memory_value=threading.Lock)
    with pytest.raises(Exception) as failure:  # noqa: B017
        run_agent_job(kafka_bootstrap, input_topic, agent, _config(kafka_bootstrap))
    assert "action classify set memory path 'extra.value'" in str(failure.value)
