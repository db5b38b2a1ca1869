"""Same-key inputs from two upstream instances, their interleaving reversed by a failure (design §8, issue 1302).

Every key's inputs alternate between two upstream instances (a 2-partition topic, a source and a pacing
map at parallelism 2, see :mod:`tests.harness.upstreams`): instance 0 leads in the first
attempt, and the failing run swaps the instances' delays, so the inputs a restore replays reach the agent
in the other interleaving. The agent is stateful (each output reports the key's history) and counts every
real tool call per logical input (``call:<tool>:<key>:<n>``). With order restoration the restored attempt
runs the replayed inputs in their recorded order: nothing runs twice and every (key, seq) output is the one
emitted before the failure. Without it the same harness repeats calls (the problem the feature solves).
"""

import json
import uuid
from collections import Counter, defaultdict

import pytest

from flink_agents_replay.testing.agents import logical_call_counts
from flink_agents_replay.testing.counter import InvocationCounter
from tests.harness.upstreams import (
    FailOnceAfterCheckpoint,
    FailOnceWhileWaiting,
    JobRecorder,
    UpstreamControl,
    history_agent,
    produce_lane_inputs,
    run_lane_job,
)

pytestmark = pytest.mark.integration

KEYS, ROUNDS = 4, 12  # 96 inputs: 24 per key, 12 from each upstream instance
PERIOD_MS = 40.0  # one lane position per 40 ms: a key gets an input every 80 ms
HALF_ROUND_MS = KEYS * PERIOD_MS / 2  # the follower's delay: half-way between two inputs of the leader
# test c: after the first failure the predecessors' instance sends at most one record per SLOW_GAP_MS. It falls
# further behind with every record, so keys wait for its inputs for seconds, while its checkpoint barriers still
# pass between its records (a lag made of one long pause would hold the barrier, and every checkpoint's alignment,
# until the awaited inputs had arrived: no checkpoint could complete while a key waits).
SLOW_GAP_MS = 600.0
SIGNING_KEY = "test-signing-key-0123456789"
TIMED_OUT = "order restore timed out"
WAIT_SCENARIO_TRIES = 4


def _config(bootstrap, **overrides):
    return {"kafka": {"bootstrap.servers": bootstrap}, "journal_topic": f"journal-{uuid.uuid4().hex[:8]}",
            "signing_key": SIGNING_KEY, "max_concurrent_runs": 8, **overrides}


def _run(bootstrap, new_topic, tmp_path, counter, *, drop_input=False, wait_then_fail=False, **settings):
    """Run the job once with an injected failure that reverses the interleaving; return what it did."""
    topic = new_topic(partitions=2, prefix="lanes")
    inputs = produce_lane_inputs(bootstrap, topic, KEYS, ROUNDS)
    recorder = JobRecorder(tmp_path / "job.sqlite")
    control = UpstreamControl(tmp_path / "control.json", period_ms=PERIOD_MS, delay_ms=(0.0, HALF_ROUND_MS))
    after_checkpoint = None
    if wait_then_fail:
        # Instance 1 leads after the failure and instance 0 (which led before it, so its input comes first in
        # each recorded round) is slow: replayed inputs of instance 1 wait while checkpoints complete.
        # Then the second failure, after which instance 0 is half a round behind again, at full speed.
        fault = FailOnceAfterCheckpoint(counter, recorder, control, KEYS, swap_delays=False,
                                        control_changes={"delay_ms": [HALF_ROUND_MS, 0.0],
                                                         "gap_ms": [SLOW_GAP_MS, 0.0]})
        after_checkpoint = FailOnceWhileWaiting(counter, recorder, control,
                                                control_changes={"delay_ms": [HALF_ROUND_MS, 0.0],
                                                                 "gap_ms": [0.0, 0.0]})
    else:
        fault = FailOnceAfterCheckpoint(counter, recorder, control, KEYS, drop_input=drop_input,
                                        last_n=2 * ROUNDS - 1 if drop_input else None)
    agent = history_agent(counter, fault=fault)
    expected = len(inputs) - (1 if drop_input else 0)
    outputs = run_lane_job(bootstrap, topic, agent, _config(bootstrap, **settings), recorder, control,
                           until_outputs=expected, after_checkpoint=after_checkpoint)
    return inputs, outputs, recorder.read(), logical_call_counts(counter)


def _run_until_fired(fired: str, missed: str, bootstrap, new_topic, tmp_path, *, first_fires: bool = False,
                     **options):
    """:func:`_run` from scratch until the fault counted as ``fired`` hit (a run it missed proves nothing), at most
    WAIT_SCENARIO_TRIES times; the counter and what the run that hit did. ``first_fires``: every run must inject
    the first failure."""
    for attempt in range(WAIT_SCENARIO_TRIES):
        work = tmp_path / f"try-{attempt}"
        work.mkdir()
        counter = InvocationCounter(work / "invocations.sqlite")
        result = _run(bootstrap, new_topic, work, counter, **options)
        assert not first_fires or counter.count("fault_fired") == 1, "the first failure was not injected"
        if counter.count(fired) == 1:
            return counter, result
    raise AssertionError(f"in {WAIT_SCENARIO_TRIES} runs {missed}")


def _restored_attempt(record, fault_name="first"):
    """The attempt that followed the named fault."""
    fault = next(f for f in record.faults if f.name == fault_name)
    return min(a for a in record.attempts() if a > fault.attempt)


def _check_setup(record):
    """Two distinct upstream instances, one per lane; the restored attempt saw a reversed interleaving."""
    instances = record.upstream_instances()
    assert sorted(instances) == [0, 1] and all(len(i) == 1 for i in instances.values()), instances
    assert instances[0] != instances[1], f"both lanes came from one upstream instance: {instances}"
    reordered = record.reordered(_restored_attempt(record))
    assert reordered, ("the replayed inputs reached the agent in their recorded order: the harness did not reverse "
                       f"the interleaving (recorded: {record.recorded_after_restore(_restored_attempt(record))})")
    return reordered


def _check_outputs(outputs, inputs, *, missing=()):
    """Every input's output exactly once (but ``missing``); each output's history is the key's inputs so far."""
    missing = set(missing)
    expected = Counter((r["key"], r["n"]) for r in inputs if (r["key"], r["n"]) not in missing)
    by_key = defaultdict(list)
    for key, seq, text in outputs:
        by_key[key].append((seq, json.loads(text)))
    assert Counter((key, o["n"]) for key, items in by_key.items() for _, o in items) == expected
    for key, items in by_key.items():
        items.sort(key=lambda item: item[0])
        assert len({seq for seq, _ in items}) == len(items), f"{key}: two outputs with one seq"
        history = []
        for seq, output in items:
            history = [*history, output["n"]]
            assert output["history"] == history, f"{key} seq {seq}: history {output['history']}, expected {history}"


def _check_same_output_per_seq(record, outputs, keys=None):
    """Every (key, seq) output the operator emitted, in any attempt, is the committed one."""
    committed = {(key, seq): text for key, seq, text in outputs}
    differing = {position: sorted(texts) for position, texts in record.outputs_by_position().items()
                 if (keys is None or position[0] in keys) and texts != {committed.get(position)}}
    assert differing == {}, f"(key, seq) outputs that changed across attempts: {differing}"


def _repeated(calls):
    return {name: n for name, n in calls.items() if n > 1}


def test_reversed_interleaving_after_a_failure_repeats_no_call_with_order_restoration(
        kafka_bootstrap, new_topic, tmp_path, invocation_counter, operator_log):
    inputs, outputs, record, calls = _run(kafka_bootstrap, new_topic, tmp_path, invocation_counter)
    assert invocation_counter.count("fault_fired") == 1, "the failure was not injected"
    _check_setup(record)
    assert _repeated(calls) == {}
    assert len(calls) == 2 * len(inputs), "every input calls lookup and writer"
    _check_outputs(outputs, inputs)
    _check_same_output_per_seq(record, outputs)
    assert any(" restored: " in line for line in operator_log()), "the job did not restore from a checkpoint"
    assert [line for line in operator_log() if TIMED_OUT in line] == []


def test_reversed_interleaving_repeats_calls_without_order_restoration(
        kafka_bootstrap, new_topic, tmp_path, invocation_counter):
    """The old behaviour (inputs run in arrival order): the same logical calls run again. Documents the problem."""
    inputs, outputs, record, calls = _run(kafka_bootstrap, new_topic, tmp_path, invocation_counter,
                                          restore_input_order=False)
    assert invocation_counter.count("fault_fired") == 1, "the failure was not injected"
    reordered = _check_setup(record)
    repeats = sum(n - 1 for n in _repeated(calls).values())
    assert repeats > 0, f"no call ran twice although {len(reordered)} keys' inputs came back in another order"
    _check_outputs(outputs, inputs)


def test_checkpoint_while_a_key_waits_for_its_predecessor_then_a_second_failure_repeats_no_call(
        kafka_bootstrap, new_topic, tmp_path, operator_log):
    # A checkpoint completes while a key waits as long as the slow instance's barriers pass between its records
    # (SLOW_GAP_MS). Should a run still miss that moment (a machine too busy to take a checkpoint for seconds), it
    # proves nothing, so it is run again from scratch (at most WAIT_SCENARIO_TRIES times); every invariant below
    # is checked on the run where it hit.
    _, (inputs, outputs, record, calls) = _run_until_fired(
        "second_fault_fired", "no checkpoint completed while a key waited", kafka_bootstrap, new_topic, tmp_path,
        first_fires=True, wait_then_fail=True)
    _check_setup(record)
    second = next(f for f in record.faults if f.name == "second")
    detail = json.loads(second.detail)
    assert detail["waiting"], detail
    # The attempt after the second failure restored the checkpoint that completed while keys waited.
    restored = record.restored_snapshot(_restored_attempt(record, "second"))
    assert restored is not None and restored.checkpoint_id == detail["checkpoint"]
    assert _repeated(calls) == {}
    assert len(calls) == 2 * len(inputs)
    _check_outputs(outputs, inputs)
    _check_same_output_per_seq(record, outputs)
    assert [line for line in operator_log() if TIMED_OUT in line] == []


def test_a_recorded_input_that_never_comes_back_times_out_and_other_keys_keep_full_reuse(
        kafka_bootstrap, new_topic, tmp_path, operator_log):
    """The failing run's input is skipped by its upstream from then on: its key waits, times out and goes on."""
    # The failure must hit an input its key has a later one after (the later one waits for it). Should a busy
    # machine complete the first checkpoint only when every key is past such inputs, the fault never fires and
    # the run proves nothing: it is run again from scratch (at most WAIT_SCENARIO_TRIES times).
    _, (inputs, outputs, record, calls) = _run_until_fired(
        "fault_fired", "the failure was not injected", kafka_bootstrap, new_topic, tmp_path, drop_input=True,
        order_restore_timeout_s=2.0)
    _check_setup(record)
    first = json.loads(next(f for f in record.faults if f.name == "first").detail)
    lost_key, lost_n = first["key"], first["n"]
    assert any(e.dropped and (e.key, e.n) == (lost_key, lost_n) for e in record.emissions), "the input was not dropped"
    _check_outputs(outputs, inputs, missing=[(lost_key, lost_n)])
    assert len([line for line in operator_log() if TIMED_OUT in line]) == 1, [
        line for line in operator_log() if TIMED_OUT in line]
    others = {r["key"] for r in inputs} - {lost_key}
    other_calls = {name: n for name, n in calls.items() if name.split(":")[2] in others}
    assert _repeated(other_calls) == {}, "keys whose inputs all came back ran calls again"
    assert len(other_calls) == 2 * sum(1 for r in inputs if r["key"] in others)
    _check_same_output_per_seq(record, outputs, keys=others)
    assert calls.get(f"call:lookup:{lost_key}:{lost_n}") == 1, "the lost input ran again"
    assert f"call:writer:{lost_key}:{lost_n}" not in calls
