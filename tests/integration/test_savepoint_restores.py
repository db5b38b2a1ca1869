"""Restores from savepoints on a real job: divergence after a changed input, and restoring a savepoint older
than the journal's pruning point."""

import json
import time
import uuid

import pytest
from pyflink.common import Types

from flink_agents_replay.api.resources import Tool
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.agents import chain_agent, logical_call_counts
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import keyed_json_inputs, produce_inputs, trigger_savepoint

pytestmark = pytest.mark.integration

KEYS = [f"key-{k:03d}" for k in range(5)]
FIRST = [{"key": k, "n": i} for i in range(3) for k in KEYS]   # seqs 1-3, before the savepoint
SECOND = [{"key": k, "n": i} for i in range(3, 5) for k in KEYS]  # seqs 4-5, journaled after it
CHANGED_KEY = KEYS[0]


def _wait_for(predicate, what, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _start_job(bootstrap, topic, counter, journal_topic, source_uid, savepoint=None, checkpoint_interval_ms=None,
               label=None, tools=None, **agent_config):
    label = label or source_uid
    config = {"execution.savepoint.ignore-unclaimed-state": "true"}
    if savepoint:
        config["execution.savepoint.path"] = savepoint
    env = create_environment(parallelism=1, jars=[kafka_connector_jar()], config=config,
                             checkpoint_interval_ms=checkpoint_interval_ms)
    keyed = keyed_json_inputs(env, bootstrap, topic, source_uid=source_uid)
    agent = chain_agent(counter)
    for name, tool in (tools or {}).items():
        agent.add_resource(name, tool)
    outputs = connect_to_agent(keyed, agent, {
        "kafka": {"bootstrap.servers": bootstrap}, "journal_topic": journal_topic,
        "signing_key": "divergence-signing-key-0123", "max_concurrent_runs": 8, **agent_config})

    def count(output):
        counter.increment(f"outputs:{label}")
        return output.seq

    outputs.map(count, output_type=Types.LONG()).filter(lambda _: False).print()
    return env.execute_async("divergence")


def test_changed_input_after_restore_re_executes_only_that_keys_later_history(kafka_bootstrap, tmp_path,
                                                                             operator_log):
    """A restored key that receives a different input at a journaled seq re-executes its later history;
    every other key keeps full reuse; multi-action runs never count as divergence."""
    counter = InvocationCounter(tmp_path / "calls.db")
    journal_topic = f"journal-{uuid.uuid4().hex[:8]}"
    topic_a = produce_inputs(kafka_bootstrap, FIRST)

    # Phase 1 (no periodic checkpoints): seqs 1-3, savepoint, then seqs 4-5 journaled after the savepoint.
    client = _start_job(kafka_bootstrap, topic_a, counter, journal_topic, "inputs-a")
    try:
        _wait_for(lambda: counter.count("outputs:inputs-a") == len(FIRST), "the first batch")
        savepoint = trigger_savepoint(client, tmp_path / "savepoints")
    finally:
        client.cancel().result()
    # Seqs 4-5 from the savepoint, journaled (no periodic checkpoint prunes them).
    topic_more = produce_inputs(kafka_bootstrap, SECOND)
    client = _start_job(kafka_bootstrap, topic_more, counter, journal_topic, "inputs-a-more", savepoint=savepoint)
    try:
        _wait_for(lambda: counter.count("outputs:inputs-a-more") == len(SECOND), "the second batch")
    finally:
        client.cancel().result()
    first_calls = logical_call_counts(counter)
    assert set(first_calls.values()) == {1} and len(first_calls) == 6 * (len(FIRST) + len(SECOND))

    # Phase 2: restore the savepoint again; the same second batch, except one key's seq 4 input differs.
    replay = [dict(r, n=r["n"] + 100) if (r["key"], r["n"]) == (CHANGED_KEY, 3) else r for r in SECOND]
    topic_b = produce_inputs(kafka_bootstrap, replay)
    lines = operator_log()
    # In arrival order: with order restoration the changed key would instead wait for its recorded seq-4
    # input until order_restore_timeout_s (tests/integration/test_multi_upstream_order.py covers that path).
    # This build also has a tool more than the savepoint's: the restore names it (the policy, reuse, goes on).
    client = _start_job(kafka_bootstrap, topic_b, counter, journal_topic, "inputs-b", savepoint=savepoint,
                        restore_input_order=False, tools={"refund_order": Tool(_refund_order)})
    try:
        _wait_for(lambda: counter.count("outputs:inputs-b") == len(replay), "the replayed batch")
        _wait_for(lambda: any("fully replayed" in line for line in operator_log()[len(lines):]),
                  "the end of recovered history")
    finally:
        client.cancel().result()

    calls = logical_call_counts(counter)
    changed = {n: c for n, c in calls.items() if f"{CHANGED_KEY}|" in n or n not in first_calls}
    others = {n: c for n, c in calls.items() if n not in changed}
    assert set(others.values()) == {1}, "another key's journaled calls ran again"
    # The changed key: its new seq-4 input runs for the first time; its seq 5 re-executes (history dropped).
    assert calls[f"call:classifier:{CHANGED_KEY}|4|{ {'key': CHANGED_KEY, 'n': 103} }"] == 1
    assert calls[f"call:classifier:{CHANGED_KEY}|5|{ {'key': CHANGED_KEY, 'n': 4} }"] == 2
    replayed = [line for line in operator_log()[len(lines):] if "fully replayed" in line]
    assert "divergences 1" in replayed[-1], replayed[-1]
    [changed_tools] = [line for line in operator_log()[len(lines):] if "the agent's tools changed" in line]
    assert "since checkpoint" in changed_tools and ": refund_order: added;" in changed_tools, changed_tools


def _refund_order(order_id: str) -> str:
    """Refund an order (never called: the tool only changes the agent's tool list)."""
    return order_id


def test_restoring_a_savepoint_older_than_the_pruning_point_is_refused_unless_accepted(kafka_bootstrap, tmp_path):
    counter = InvocationCounter(tmp_path / "calls.db")
    journal_topic = f"journal-{uuid.uuid4().hex[:8]}"
    topic = produce_inputs(kafka_bootstrap, FIRST)
    client = _start_job(kafka_bootstrap, topic, counter, journal_topic, "inputs", checkpoint_interval_ms=200)
    try:
        _wait_for(lambda: counter.count("outputs:inputs") == len(FIRST), "the first batch")
        old = trigger_savepoint(client, tmp_path / "savepoints")
        # The savepoint's marker is at most each partition's end now: a low watermark past that end is a gap.
        ends_at_savepoint = _offsets(kafka_bootstrap, journal_topic, latest=True)
        more = [{"key": k, "n": i} for i in range(3, 6) for k in KEYS]
        _produce_to(kafka_bootstrap, topic, more)
        _wait_for(lambda: counter.count("outputs:inputs") == len(FIRST) + len(more), "the later inputs")
        _wait_for(lambda: any(low > ends_at_savepoint[p]
                              for p, low in _offsets(kafka_bootstrap, journal_topic).items()),
                  "pruning past the savepoint")
    finally:
        client.cancel().result()

    # The same source uid: the source resumes from the savepoint's offsets, as a real restore does.
    refused = _start_job(kafka_bootstrap, topic, counter, journal_topic, "inputs", savepoint=old, label="refused")
    with pytest.raises(Exception) as failure:  # noqa: B017 - the job failure arrives through the client
        refused.get_job_execution_result().result()
    assert "already deleted" in str(failure.value) and "accept_reexecution_after_gap=True" in str(failure.value)

    before = logical_call_counts(counter)
    accepted = _start_job(kafka_bootstrap, topic, counter, journal_topic, "inputs", savepoint=old,
                          label="accepted", accept_reexecution_after_gap=True)
    try:
        _wait_for(lambda: counter.count("outputs:accepted") == len(more), "the inputs after the old savepoint")
    finally:
        accepted.cancel().result()
    repeated = {n for n, c in logical_call_counts(counter).items() if c > before.get(n, 0) and n in before}
    assert repeated, "accepting the gap should have re-executed the pruned actions"


def _produce_to(bootstrap, topic, records):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for record in records:
        producer.produce(topic, json.dumps(record).encode(), key=record["key"].encode())
    assert producer.flush(30) == 0


def _offsets(bootstrap, topic, latest=False):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
    futures = admin.list_offsets({TopicPartition(topic, p): spec for p in range(128)})
    return {tp.partition: f.result(timeout=30).offset for tp, f in futures.items()}
