"""Durable execution on a real MiniCluster and a real broker: failures repeat no call and change no output."""

import uuid
from collections import Counter

import pytest

from flink_agents_replay.testing.agents import chain_agent, logical_call_counts
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs, produce_inputs, run_agent_job

pytestmark = pytest.mark.integration

KEYS, PER_KEY = 20, 10
SIGNING_KEY = "test-signing-key-0123456789"


def _config(bootstrap, **overrides):
    return {"kafka": {"bootstrap.servers": bootstrap}, "journal_topic": f"journal-{uuid.uuid4().hex[:8]}",
            "signing_key": SIGNING_KEY, "max_concurrent_runs": 8, **overrides}


@pytest.fixture(scope="module")
def input_topic(kafka_bootstrap):
    return produce_inputs(kafka_bootstrap, make_inputs(KEYS, PER_KEY))


@pytest.fixture(scope="module")
def baseline(kafka_bootstrap, input_topic, tmp_path_factory):
    """The failure-free run: its outputs and its logical calls."""
    counter = InvocationCounter(tmp_path_factory.mktemp("baseline") / "calls.db")
    outputs = run_agent_job(kafka_bootstrap, input_topic, chain_agent(counter, call_delay_s=0.005),
                            _config(kafka_bootstrap))
    return Counter(outputs), logical_call_counts(counter)


def test_failure_free_run_calls_each_tool_once_per_step(baseline):
    outputs, calls = baseline
    assert sum(outputs.values()) == KEYS * PER_KEY
    assert len(calls) == KEYS * PER_KEY * 6 and set(calls.values()) == {1}
    last = {key: seq for key, seq, _ in outputs}
    assert set(last.values()) == {PER_KEY}


def test_exception_failover_repeats_no_call(kafka_bootstrap, input_topic, baseline, tmp_path):
    counter = InvocationCounter(tmp_path / "calls.db")
    agent = chain_agent(counter, call_delay_s=0.005, fail_after_calls=KEYS * PER_KEY * 3)
    outputs = run_agent_job(kafka_bootstrap, input_topic, agent, _config(kafka_bootstrap), restart_attempts=2,
                            checkpoint_interval_ms=300)
    assert counter.count("fault_fired") == 1, "the failure was not injected"
    assert Counter(outputs) == baseline[0]
    calls = logical_call_counts(counter)
    repeated = {name: n for name, n in calls.items() if n > 1}
    assert repeated == {}
    assert calls.keys() == baseline[1].keys()


def test_runs_in_flight_at_a_checkpoint_finish_after_restore_without_repeats(
        kafka_bootstrap, input_topic, baseline, tmp_path, operator_log):
    """Slow calls, every key's run in flight at once: runs span barriers; the failure follows completed checkpoints.

    The input is unbounded here: at the end of a bounded input the remaining runs drain inside the final
    watermark, when no checkpoint is taken. With more keys than run slots, process_element would block for a
    slot and barriers would queue behind inputs (Flink backpressure): 32 slots for 20 keys avoids both.
    """
    counter = InvocationCounter(tmp_path / "calls.db")
    agent = chain_agent(counter, call_delay_s=0.05, fail_after_calls=KEYS * PER_KEY * 3)
    outputs = run_agent_job(kafka_bootstrap, input_topic, agent, _config(kafka_bootstrap, max_concurrent_runs=32),
                            restart_attempts=2, checkpoint_interval_ms=250, until_outputs=KEYS * PER_KEY)
    assert counter.count("fault_fired") == 1
    assert Counter(outputs) == baseline[0]
    assert {name: n for name, n in logical_call_counts(counter).items() if n > 1} == {}
    restored = [line for line in operator_log() if " restored: " in line]
    assert restored, "the job did not restore from a checkpoint"
    in_flight = int(restored[-1].split("; ")[-1].split()[0])
    assert in_flight > 0, f"no run was in flight at the restored checkpoint: {restored[-1]}"


def test_calls_under_way_at_a_failover_finish_and_are_not_repeated(kafka_bootstrap, tmp_path):
    """Slow calls (0.5 s) are under way in other runs when one run fails the task: the failing attempt stops its
    runs at their next call and waits for calls under way, which are journaled before the next attempt reads."""
    keys, per_key = 8, 2
    topic = produce_inputs(kafka_bootstrap, make_inputs(keys, per_key))
    counter = InvocationCounter(tmp_path / "calls.db")
    agent = chain_agent(counter, call_delay_s=0.5, fail_after_calls=20)
    outputs = run_agent_job(kafka_bootstrap, topic, agent, _config(kafka_bootstrap, max_concurrent_runs=16),
                            restart_attempts=2, checkpoint_interval_ms=300, until_outputs=keys * per_key)
    assert counter.count("fault_fired") == 1
    assert len(outputs) == keys * per_key
    calls = logical_call_counts(counter)
    assert {name: n for name, n in calls.items() if n > 1} == {}
    assert len(calls) == keys * per_key * 6


def test_outputs_drained_at_the_end_of_a_bounded_input_carry_no_timer_timestamp(kafka_bootstrap, tmp_path):
    """Runs finished by the drain timer (Long.MAX_VALUE - 1) must not stamp outputs with it: sinks reject it."""
    from pyflink.common import Types
    from pyflink.datastream import ProcessFunction

    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.flink.pipeline import connect_to_agent

    class Timestamps(ProcessFunction):
        def process_element(self, value, ctx):
            yield ctx.timestamp()

    env = create_environment(parallelism=1)
    keyed = env.from_collection([f"k{i % 4}" for i in range(12)], type_info=Types.STRING()).key_by(
        lambda k: k, key_type=Types.STRING())
    agent = chain_agent(InvocationCounter(tmp_path / "calls.db"), call_delay_s=0.05)
    outputs = connect_to_agent(keyed, agent, _config(kafka_bootstrap, max_concurrent_runs=4))
    with outputs.process(Timestamps(), output_type=Types.LONG()).execute_and_collect() as results:
        stamps = list(results)
    assert len(stamps) == 12
    assert 2**63 - 2 not in stamps
