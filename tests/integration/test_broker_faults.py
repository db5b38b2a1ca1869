"""The broker fails underneath a running job (issue #13, part 1): paused, restarted, slow, or down at the start.

Each test starts its own broker (:class:`LocalKafkaBroker` in the test's directory), never the session's
shared one: the faults would hit every other test. The job reads its inputs from that broker, journals to
it and writes its outputs to it through Flink's exactly-once ``KafkaSink``, so the fault reaches every
Kafka client of the job. The client timeouts are shortened (``ack_timeout_s``, ``kafka_timeout_s``) so that
a pause of tens of seconds outlives them and the test stays short.

Checked afterwards, never "the job finished":

* every input answered exactly once: the committed outputs (``read_committed``) equal the failure-free
  reference's, as a multiset (no loss, no duplicate);
* memory equal to the failure-free run: each output carries its key's memory (``history``) at that point;
* each external call (``sender``) made once, or repeated only as a call in doubt the operator reported
  (its "started" record acknowledged, no outcome journaled);
* the fault hit: calls were under way at the pause or stop (a counter file outside the worker), and the
  outage outlasted the client timeouts.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.local.kafka_broker import LocalKafkaBroker
from flink_agents_replay.local.processes import free_port
from flink_agents_replay.testing.agents import chain_agent, logical_call_counts
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.delay_proxy import DelayProxy
from flink_agents_replay.testing.jobs import (
    canonical_output,
    exactly_once_string_sink,
    job_ended,
    make_inputs,
    produce_inputs,
    reference_outputs,
)

pytestmark = pytest.mark.integration

SIGNING_KEY = "broker-faults-signing-key-0123"
ACK_TIMEOUT_S = 3.0
KAFKA_TIMEOUT_S = 3.0
#: Longer than every client timeout the job has: the outage cannot be waited out by a retry.
OUTAGE_S = 3 * max(ACK_TIMEOUT_S, KAFKA_TIMEOUT_S)
_IN_DOUBT = re.compile(r"closing: .*in doubt (\d+)")


@pytest.fixture
def own_broker(tmp_path):
    """Factory of a broker for this test alone (stopped at the end, also when paused)."""
    brokers: list[LocalKafkaBroker] = []

    def start(**options) -> tuple[LocalKafkaBroker, str]:
        broker = LocalKafkaBroker(tmp_path / f"broker-{len(brokers)}", port=free_port(), **options)
        brokers.append(broker)
        return broker, broker.start().bootstrap_servers

    yield start
    for broker in brokers:
        broker.discard()


def _config(bootstrap: str, name: str, **overrides) -> dict:
    return {"kafka": {"bootstrap.servers": bootstrap}, "signing_key": SIGNING_KEY, "journal_topic": f"{name}.journal",
            "ack_timeout_s": ACK_TIMEOUT_S, "kafka_timeout_s": KAFKA_TIMEOUT_S, "close_timeout_s": 5.0, **overrides}


def _create_topic(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=30).values():
        future.result(timeout=60)
    return topic


#: Small network buffers, so that what sits between the source and the agent is a few dozen records, not thousands:
#: only then can an agent slowed down by its broker hold the source back.
SMALL_NETWORK_BUFFERS = {"taskmanager.memory.segment-size": "4kb",
                         "taskmanager.network.memory.buffers-per-channel": "1",
                         "taskmanager.network.memory.floating-buffers-per-gate": "1",
                         "taskmanager.network.memory.max-buffers-per-channel": "1"}


def _submit_job(bootstrap: str, input_topic: str, output_topic: str, agent, config: dict, *,
                counter: InvocationCounter | None = None, flink_config: dict | None = None):
    """Inputs from ``input_topic`` (bounded) -> agent -> ``output_topic`` (exactly once); submitted, returns the
    client. With ``counter``, each input leaving the source is counted (``source_read``)."""
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

    env = create_environment(checkpoint_interval_ms=1000, restart_attempts=100, restart_delay_ms=1000,
                             jars=[kafka_connector_jar()], config=flink_config)
    source = (KafkaSource.builder().set_bootstrap_servers(bootstrap).set_topics(input_topic)
              .set_group_id(f"inputs-{uuid.uuid4().hex[:8]}").set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_bounded(KafkaOffsetsInitializer.latest()).set_value_only_deserializer(SimpleStringSchema()).build())
    records = env.from_source(source, WatermarkStrategy.no_watermarks(), "inputs").uid("inputs").set_parallelism(1)

    def parse(text: str) -> dict:
        if counter is not None:
            counter.increment("source_read")
        return json.loads(text)

    parsed = records.map(parse, output_type=Types.PICKLED_BYTE_ARRAY()).uid("parse").set_parallelism(1)
    keyed = parsed.key_by(lambda record: record["key"], key_type=Types.STRING())
    outputs = connect_to_agent(keyed, agent, config)
    rows = outputs.map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
    rows.sink_to(exactly_once_string_sink(bootstrap, output_topic, f"broker-faults-{uuid.uuid4().hex[:8]}"))
    return env.execute_async(f"broker faults {agent.name}")


def _await_end(client, timeout_s: float, what) -> None:
    poll_until(lambda: job_ended(client), timeout_s, what, interval_s=0.5)
    client.get_job_execution_result().result()  # the job's failure, if it failed


def _committed_outputs(bootstrap: str, topic: str) -> Counter:
    with CommittedReader(bootstrap, topic, decode=lambda value: tuple(json.loads(value))) as reader:
        return Counter(reader.read_to_committed_end())


def _under_way(counter: InvocationCounter) -> int:
    """Calls begun and not returned yet (traced agents count both)."""
    counts = counter.counts()
    return counts.get("calls", 0) - sum(n for name, n in counts.items() if name.startswith("done:"))


def _check_effects_once(expected: Counter, committed: Counter, counter: InvocationCounter, log: list[str]) -> dict:
    """The invariants; returns the numbers a report quotes."""
    assert committed == expected, (f"lost {sum((expected - committed).values())}, duplicated or unexpected "
                                   f"{sum((committed - expected).values())}")
    calls = logical_call_counts(counter)
    sender_repeats = sum(n - 1 for name, n in calls.items() if name.startswith("call:sender:") and n > 1)
    in_doubt = sum(int(match.group(1)) for line in log if (match := _IN_DOUBT.search(line)))
    # An external call made twice must have been detected in doubt; never repeated silently.
    assert sender_repeats <= in_doubt, f"{sender_repeats} external calls repeated, {in_doubt} in doubt reported"
    return {"outputs": sum(committed.values()), "sender_repeats": sender_repeats, "in_doubt": in_doubt,
            "other_repeats": sum(n - 1 for name, n in calls.items() if n > 1) - sender_repeats,
            "restores": sum(" restored: " in line for line in log)}


@pytest.mark.parametrize("fault", ["pause", "restart"])
def test_broker_paused_or_restarted_mid_run_loses_and_duplicates_nothing(own_broker, tmp_path, operator_log, fault):
    broker, bootstrap = own_broker()
    name = f"broker-{fault}-{uuid.uuid4().hex[:6]}"
    inputs = make_inputs(keys=6, per_key=10)
    expected = reference_outputs(chain_agent(InvocationCounter(tmp_path / "ref.db"), name=name), inputs)
    counter = InvocationCounter(tmp_path / "calls.db")
    agent = chain_agent(counter, name=name, call_delay_s=0.1, traced=True)
    input_topic = produce_inputs(bootstrap, inputs)
    output_topic = _create_topic(bootstrap, f"{name}.out")
    client = _submit_job(bootstrap, input_topic, output_topic, agent, _config(bootstrap, name))
    total_calls = 6 * len(inputs)

    # The fault hits once a quarter of the calls ran, while calls are under way.
    poll_until(lambda: counter.count("calls") >= total_calls // 4 and _under_way(counter) > 0, 120,
               lambda: f"calls {counter.count('calls')} of {total_calls}", interval_s=0.02)
    began = time.monotonic()
    if fault == "pause":
        broker.pause()
        under_way_at_fault = _under_way(counter)  # after SIGSTOP: calls were under way when it froze
    else:
        under_way_at_fault = _under_way(counter)  # just before SIGTERM (a clean shutdown takes seconds)
        broker.stop()
    calls_at_fault = counter.count("calls")
    assert under_way_at_fault > 0 and calls_at_fault < total_calls
    if fault == "pause":
        time.sleep(OUTAGE_S)  # the outage itself (the injected fault), not a wait for a condition
        broker.resume()
    else:
        broker.restart(down_s=OUTAGE_S / 2)
    outage_s = time.monotonic() - began
    assert outage_s > max(ACK_TIMEOUT_S, KAFKA_TIMEOUT_S)

    _await_end(client, 240, lambda: f"calls {counter.count('calls')} of {total_calls}")
    numbers = _check_effects_once(expected, _committed_outputs(bootstrap, output_topic), counter, operator_log())
    # The fault hit: an outage longer than the clients' timeouts failed the job over (not waited out by a retry).
    assert numbers["restores"] >= 1, numbers
    print(f"\nbroker {fault} for {outage_s:.0f} s with {under_way_at_fault} calls under way "
          f"({calls_at_fault} of {total_calls} made): {numbers}")


@pytest.mark.parametrize("fault", ["stopped", "paused"])
def test_broker_down_when_the_job_starts_is_a_clear_error_within_kafka_timeout(own_broker, tmp_path, fault):
    from pyflink.common import Types

    broker, bootstrap = own_broker()
    env = create_environment()
    keyed = env.from_collection(["a", "b"], type_info=Types.STRING()).key_by(lambda x: x, key_type=Types.STRING())
    counter = InvocationCounter(tmp_path / "calls.db")
    # Built while the broker runs (connect_to_agent checks it); it goes down before the job starts.
    outputs = connect_to_agent(keyed, chain_agent(counter), _config(bootstrap, f"down-{uuid.uuid4().hex[:6]}"))
    outputs.map(lambda output: output.key, output_type=Types.STRING())
    broker.pause() if fault == "paused" else broker.stop()
    started = time.monotonic()
    with pytest.raises(Exception) as failure:  # noqa: B017 - the job's failure arrives as a Py4J error
        env.execute("broker down at start")
    took = time.monotonic() - started
    message = str(failure.value)
    assert f"could not reach Kafka at {bootstrap} within {KAFKA_TIMEOUT_S:.0f} s" in message, message[-2000:]
    assert "check bootstrap.servers, that the broker runs" in message
    assert counter.count("calls") == 0
    assert took < KAFKA_TIMEOUT_S + 60, f"took {took:.0f} s"  # the MiniCluster's own start-up included


@pytest.mark.slow
def test_slow_broker_backpressures_the_source_and_loses_nothing(own_broker, tmp_path, operator_log):
    proxy_port = free_port()
    broker, bootstrap = own_broker(advertised_port=proxy_port)
    name = f"broker-slow-{uuid.uuid4().hex[:6]}"
    # 1 KB per input: a 4 KB network buffer holds a few of them.
    inputs = [{**record, "pad": "x" * 1000} for record in make_inputs(keys=8, per_key=15)]
    expected = reference_outputs(chain_agent(InvocationCounter(tmp_path / "ref.db"), name=name), inputs)
    counter = InvocationCounter(tmp_path / "calls.db")
    with DelayProxy(upstream_port=broker.port, delay_s=0.0, port=proxy_port) as proxy:
        input_topic = produce_inputs(bootstrap, inputs)
        output_topic = _create_topic(bootstrap, f"{name}.out")
        proxy.delay_s = 0.2  # every reply, journal acknowledgements included, arrives 200 ms late
        delayed_before = proxy.bytes_delayed
        config = _config(bootstrap, name, max_concurrent_runs=2, ack_timeout_s=30, kafka_timeout_s=30)
        client = _submit_job(bootstrap, input_topic, output_topic, chain_agent(counter, name=name), config,
                             counter=counter, flink_config=SMALL_NETWORK_BUFFERS)
        # Backpressure: with all inputs in the topic, the source stays behind because the agent cannot keep up.
        poll_until(lambda: counter.count("calls") >= 6 * len(inputs) // 3, 180, "a third of the calls")
        read_at_third = counter.count("source_read")
        runs_started_at_third = counter.count("calls") // 6
        assert read_at_third < len(inputs), "the source read every input at once: no backpressure reached it"
        _await_end(client, 300, lambda: f"calls {counter.count('calls')}")
        assert proxy.bytes_delayed > delayed_before
        proxy.delay_s = 0.0  # the broker advertises the proxy: reading the outputs goes through it too
        numbers = _check_effects_once(expected, _committed_outputs(bootstrap, output_topic), counter, operator_log())
    print(f"\nslow broker: source had read {read_at_third} of {len(inputs)} inputs when ~{runs_started_at_third} runs "
          f"had started; {numbers}")


def test_a_journal_write_to_a_paused_broker_fails_within_ack_timeout(own_broker):
    from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore

    broker, bootstrap = own_broker()
    store = KafkaJournalStore({"bootstrap.servers": bootstrap}, f"journal-{uuid.uuid4().hex[:8]}", 2,
                              timeout_s=5, ack_timeout_s=3)
    try:
        assert store.append(0, b"k", b"before").wait(10) == 0
        broker.pause()
        started = time.monotonic()
        delivery = store.append(0, b"k", b"during")
        with pytest.raises(JournalError, match="message.timeout.ms"):
            delivery.wait(30)  # waits longer than ack_timeout_s: the producer itself must give up in time
        assert time.monotonic() - started < 3 + 2
        with pytest.raises(JournalError, match="writes no further records"):
            store.flush(1)
    finally:
        broker.resume()
        store.close()
