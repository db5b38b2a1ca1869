"""Runs that wait for people, in a Flink job with real Kafka (issue 35): parked without holding a run slot or the
journal's pruning, resumed by decisions read from a topic, every call before the wait made once; early, duplicate
and malformed decisions reported as events while the job keeps running.

The test plays the people: it reads the job's wait events as they come (``wait_events`` united with the
outputs, collected) and answers each opened wait on the signals topic.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent, wait_events
from flink_agents_replay.testing.committed import poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import (
    canonical_output,
    connector_jars,
    keyed_json_inputs,
    make_inputs,
    produce_inputs,
    produce_json,
)

pytestmark = pytest.mark.integration

SIGNING_KEY = "waits-signing-key-0123456789"


def approval_agent(counter: InvocationCounter, name: str) -> Agent:
    """Looks the input up (counted), waits for approval with the input's number, then pays (external,
    counted) or answers that it was denied."""

    def lookup(key: str, n: int) -> str:
        counter.increment(f"lookup:{key}:{n}")
        return f"{key}/{n}"

    def pay(reference: str) -> str:
        counter.increment(f"pay:{reference}")
        return f"paid {reference}"

    class Approvals(Agent):
        @action(InputEvent)
        def refund(event, ctx):
            reference = ctx.call("lookup", event.input["key"], event.input["n"])
            decision = ctx.wait_for("refund-approval", {"reference": reference, "n": event.input["n"]},
                                    timeout_s=600)
            if decision.approved:
                ctx.send_event(OutputEvent(output=["paid", ctx.call("pay", reference)]))
            else:
                ctx.send_event(OutputEvent(output=["denied", reference, decision.reason]))

    return Approvals(name=name, resources={"lookup": Tool(lookup, side_effects="none"),
                                           "pay": Tool(pay, side_effects="external")})


def _row(item):
    if hasattr(item, "kind"):  # a WaitEvent
        return ("event", item.kind, item.key, item.wait_id, json.dumps(item.payload, sort_keys=True))
    return ("output", *canonical_output(item))


def journal_records(admin, topic: str) -> tuple[int, int]:
    """Records ever written to the journal topic, and records in it now (its partitions' watermarks)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    partitions = [TopicPartition(topic, p) for p in range(128)]
    lows = admin.list_offsets({tp: OffsetSpec.earliest() for tp in partitions}, request_timeout=10)
    highs = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, request_timeout=10)
    written = sum(highs[tp].result().offset for tp in partitions)
    return written, written - sum(lows[tp].result().offset for tp in partitions)


def test_waiting_runs_free_their_slot_and_the_journal_and_resume_with_decisions_from_a_topic(
        kafka_bootstrap, kafka_admin, tmp_path):
    from pyflink.common import Types

    keys, per_key = 4, 2
    inputs = make_inputs(keys=keys, per_key=per_key)
    topic = produce_inputs(kafka_bootstrap, inputs)
    signals_topic = produce_inputs(kafka_bootstrap, [])
    counter = InvocationCounter(tmp_path / "calls.db")
    agent = approval_agent(counter, "approvals")

    env = create_environment(parallelism=1, checkpoint_interval_ms=500, jars=connector_jars())
    keyed = keyed_json_inputs(env, kafka_bootstrap, topic)
    signals = keyed_json_inputs(env, kafka_bootstrap, signals_topic, source_uid="signals", parse_uid="parse-signals")
    # One run slot: four keys wait at once only if a waiting run holds none.
    journal_topic = f"waits-journal-{tmp_path.name}"
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY, "max_concurrent_runs": 1,
              "journal_topic": journal_topic}
    outputs = connect_to_agent(keyed, agent, config, signals=signals)
    rows = outputs.map(_row, output_type=Types.PICKLED_BYTE_ARRAY()).union(
        wait_events(outputs).map(_row, output_type=Types.PICKLED_BYTE_ARRAY()))

    seen: list[tuple] = []
    opened: dict[str, tuple[str, dict]] = {}  # wait id -> key, payload
    answered = False
    timer = threading.Timer(240, lambda: results.close())
    with rows.execute_and_collect("waits") as results:
        timer.start()
        try:
            for row in results:
                seen.append(row)
                if row[:2] == ("event", "opened"):
                    opened[row[3]] = (row[2], json.loads(row[4]))
                if not answered and len(opened) == keys:  # every key's first input waits at once
                    answered = True
                    # The parked runs' records are in keyed state: checkpoints prune the journal meanwhile.
                    poll_until(lambda: journal_records(kafka_admin, journal_topic)[1] == 0, 60,
                               lambda: f"journal (written, left): {journal_records(kafka_admin, journal_topic)}")
                    written, _ = journal_records(kafka_admin, journal_topic)
                    _decide(kafka_bootstrap, signals_topic, opened)
                elif answered and row[:2] == ("event", "opened"):
                    _decide(kafka_bootstrap, signals_topic, {row[3]: opened[row[3]]})
                if sum(r[0] == "output" for r in seen) == len(inputs) and _reported(seen, len(inputs)):
                    break
        finally:
            timer.cancel()

    outputs_seen = Counter(r[1:] for r in seen if r[0] == "output")
    expected = Counter()
    for record in inputs:
        reference = f"{record['key']}/{record['n']}"
        seq = record["n"] + 1
        output = ["paid", f"paid {reference}"] if record["n"] % 2 == 0 else ["denied", reference, "odd"]
        expected[(record["key"], seq, json.dumps(output, sort_keys=True))] += 1
    assert outputs_seen == expected
    counts = counter.counts()
    assert {name: n for name, n in counts.items() if name.startswith("lookup:")} == {
        f"lookup:{r['key']}:{r['n']}": 1 for r in inputs}  # made once, before the wait; reused on resume
    assert {name: n for name, n in counts.items() if name.startswith("pay:")} == {
        f"pay:{r['key']}/{r['n']}": 1 for r in inputs if r["n"] % 2 == 0}
    kinds = Counter(r[1] for r in seen if r[0] == "event")
    assert kinds["opened"] == kinds["resumed"] == kinds["closed"] == len(inputs), kinds
    assert (kinds["decision_ignored"], kinds["decision_early"], kinds["decision_rejected"]) == (1, 1, 1), kinds
    assert written > 0  # the runs had journaled their calls and waits before they were pruned


def _decide(bootstrap: str, topic: str, waits: dict[str, tuple[str, dict]]) -> None:
    """Approve even inputs, deny odd ones; the first time, also a duplicate, an early and a malformed one."""
    decisions = []
    for wait_id, (key, payload) in waits.items():
        approved = payload["n"] % 2 == 0
        decisions.append({"key": key, "wait_id": wait_id, "approved": approved, "reason": None if approved else "odd",
                          "by": "test", "signal_id": f"s-{wait_id}"})
    if len(waits) > 1:
        first = decisions[0]
        decisions += [dict(first),  # the same decision again: ignored
                      {"key": first["key"], "wait_id": "no-such-wait", "approved": True},  # kept as early
                      {"key": first["key"], "approved": "yes"}]  # no wait id: rejected
    produce_json(bootstrap, topic, decisions)


def _reported(seen: list[tuple], runs: int) -> bool:
    """Whether every run's wait was closed and the odd decisions were reported (events and outputs arrive apart)."""
    kinds = Counter(r[1] for r in seen if r[0] == "event")
    return kinds["closed"] == runs and all(kinds[kind] for kind in
                                          ("decision_ignored", "decision_early", "decision_rejected"))


def test_a_wait_times_out_through_a_timer_and_its_events_stay_off_the_main_output(kafka_bootstrap, tmp_path):
    """No signals and nobody reading the wait events: each run waits, times out after 1 s and answers with its
    ``on_timeout``; the outputs hold only the agent's outputs."""
    from flink_agents_replay.testing.jobs import run_agent_job

    class Impatient(Agent):
        @action(InputEvent)
        def ask(event, ctx):
            decision = ctx.wait_for("ok?", {"n": event.input["n"]}, timeout_s=1, on_timeout="nobody answered")
            ctx.send_event(OutputEvent(output=[event.input["n"], decision]))

    inputs = make_inputs(keys=3, per_key=2)
    topic = produce_inputs(kafka_bootstrap, inputs)
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY}
    outputs = run_agent_job(kafka_bootstrap, topic, Impatient(name="impatient"), config, until_outputs=len(inputs),
                            timeout_s=120)
    assert Counter(outputs) == Counter((r["key"], r["n"] + 1, json.dumps([r["n"], "nobody answered"]))
                                       for r in inputs)


def test_a_deadline_fires_after_the_job_failed_over_while_its_run_was_parked(kafka_bootstrap, tmp_path):
    """One key's run waits (4 s, no decision will come); the job fails over at the other keys' second output,
    while it is parked. After the restore the run times out once, at the deadline journaled when the wait first
    opened (not one reset by the restart), and its on_timeout answers; the other keys' outputs come once."""
    import time

    from pyflink.common import Types

    from flink_agents_replay.testing._environment import _FailOnce

    counter = InvocationCounter(tmp_path / "calls.db")

    def opened_at() -> float:
        counter.increment(f"opened-at:{time.time():.3f}")  # outside the worker; reused, so only once
        return 0.0

    class Patient(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            if event.input["key"] == "waits":
                ctx.call("opened_at")
                decision = ctx.wait_for("ok?", {"n": event.input["n"]}, timeout_s=4, on_timeout="timed out")
                ctx.send_event(OutputEvent(output=[event.input["n"], decision]))
            else:
                ctx.send_event(OutputEvent(output=[event.input["n"], "done"]))

    inputs = [{"key": "waits", "n": 0}, *make_inputs(keys=3, per_key=3)]
    topic = produce_inputs(kafka_bootstrap, inputs)
    env = create_environment(parallelism=1, checkpoint_interval_ms=500, restart_attempts=2, jars=connector_jars())
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY}
    agent = Patient(name="patient", resources={"opened_at": Tool(opened_at, side_effects="none")})
    claims = InvocationCounter(tmp_path / "claims.db")
    outputs = connect_to_agent(keyed_json_inputs(env, kafka_bootstrap, topic), agent, config)
    rows = outputs.map(_FailOnce(claims, 2), output_type=Types.PICKLED_BYTE_ARRAY()).map(
        lambda output: (canonical_output(output), time.time()), output_type=Types.PICKLED_BYTE_ARRAY())
    with rows.execute_and_collect("deadline after a restore") as results:
        collected = list(itertools.islice(results, len(inputs)))

    assert claims.count("fired") == 1  # the fault hit
    assert Counter(row for row, _ in collected) == Counter(
        [("waits", 1, json.dumps([0, "timed out"]))] + [(r["key"], r["n"] + 1, json.dumps([r["n"], "done"]))
                                                          for r in inputs[1:]])
    [opened] = [float(name.split(":", 1)[1]) for name in counter.counts() if name.startswith("opened-at:")]
    [timed_out] = [at for row, at in collected if row[0] == "waits"]
    assert 4 <= timed_out - opened < 12, timed_out - opened  # the journaled deadline, not one reset by the restart
