"""Replaying a savepoint that holds runs waiting for approval (issue 35).

Production (real Kafka, MiniCluster, capture on) runs an agent whose every input waits for an approval. The
first input of each key is decided at once; the savepoint is taken once those are answered and the second ones
are parked, undecided; then the rest are decided (even inputs approved, odd ones denied), all but two: the last
key's third input is still waiting when production ends (its capture holds it parked, and no finished run), and so
is key-002's second, parked in the savepoint (its third input waits behind it, never run).

Two replays start from that savepoint, and are compared with ``diff_captures`` (what ``flink-agents-replay diff``
prints). ``recorded`` (the default wait policy): the parked runs resume when the capture shows production
finished them, every wait gets production's recorded decision, and the diff shows no change, each run's wait and
decision the same on both sides; the runs production never finished wait in the replay too, at the same wait (the
one parked in the savepoint is reported at the end of the replay's input), and the diff reports them still waiting.
Nothing is paid again (payments, ``recorded`` in the replays, are counted
outside the worker). ``deny``: every wait is denied, the savepoint's parked one at the end of the input, and the
diff shows every output changed and every decision the replay changed, those production never decided included.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter

import cloudpickle
import pytest
from pyflink.common import Types

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.flink.config import default_uid
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.replay.diff import NOTE_PRODUCTION_WAITING
from flink_agents_replay.replay.job import captured_inputs, prepare_replay, replay_config
from flink_agents_replay.replay.report import diff_captures
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import CapturedParked, CapturedRun
from flink_agents_replay.testing.committed import CommittedReader
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import (
    canonical_output,
    exactly_once_string_sink,
    keyed_json_inputs,
    make_inputs,
    produce_inputs,
    produce_json,
    running_job,
    trigger_savepoint,
    wait_until,
)

pytestmark = pytest.mark.integration

SIGNING_KEY = "replay-waits-signing-key-0123456789"
MAX_PARALLELISM = 16
KEYS, PER_KEY = 4, 3
NAME = "approvals-replayed"
UNDECIDED = ("key-003", 2)  # (key, n): production never decides it; it is the key's input seq 3
PARKED_UNDECIDED = ("key-002", 1)  # parked in the savepoint, never decided: the key's input seq 2 (3 waits behind)


def approvals_agent(counter: InvocationCounter) -> Agent:
    def pay(key: str, n: int) -> str:
        counter.increment(f"pay:{key}/{n}")
        return f"paid {key}/{n}"

    class Approvals(Agent):
        @action(InputEvent)
        def refund(event, ctx):
            record = event.input
            decision = ctx.wait_for("refund-approval", {"n": record["n"]}, timeout_s=3600)
            if decision.approved:
                ctx.send_event(OutputEvent(output=["paid", ctx.call("pay", record["key"], record["n"])]))
            else:
                ctx.send_event(OutputEvent(output=["denied", decision.reason]))

    return Approvals(name=NAME, resources={"pay": Tool(pay, side_effects="external")})


def wait_ids(agent: Agent, inputs: list[dict]) -> dict[tuple[str, int], str]:
    """Each input's wait id, as the job derives it (the same in every process): by (key, n)."""
    from flink_agents_replay.core.keygroups import key_group

    ids, seqs = {}, Counter()
    for record in inputs:
        seqs[record["key"]] += 1
        run = RunInput(record["key"], key_group(record["key"], "STRING", MAX_PARALLELISM), seqs[record["key"]], record)
        ids[(record["key"], record["n"])] = execute_run(agent, run, {}).waiting.wait.wait_id
    return ids


def decisions(ids: dict[tuple[str, int], str], which) -> list[dict]:
    return [{"key": key, "wait_id": wait_id, "approved": n % 2 == 0, "reason": None if n % 2 == 0 else "odd",
             "by": "ops"} for (key, n), wait_id in ids.items()
            if which(n) and (key, n) not in (UNDECIDED, PARKED_UNDECIDED)]


def captured(bootstrap: str, topic: str) -> list:
    return list(read_capture({"bootstrap.servers": bootstrap}, topic, MAX_PARALLELISM,
                             CaptureDecoder(SIGNING_KEY.encode(), default_uid(NAME))))


def parked_at_the_end(records: list) -> set[tuple[str, int]]:
    """The runs whose capture holds a parked record and no finished run: still waiting when it ended."""
    finished = {(r.key, r.seq) for r in records if isinstance(r, CapturedRun)}
    return {(r.key, r.seq) for r in records if isinstance(r, CapturedParked)} - finished


@pytest.fixture(scope="module")
def production(kafka_bootstrap, tmp_path_factory):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    work = tmp_path_factory.mktemp("replay-waits")
    counter = InvocationCounter(work / "calls.sqlite")
    suffix = uuid.uuid4().hex[:8]
    inputs = make_inputs(keys=KEYS, per_key=PER_KEY)
    input_topic, signals_topic = produce_inputs(kafka_bootstrap, inputs), produce_inputs(kafka_bootstrap, [])
    output_topic = f"replay-waits-out-{suffix}"
    ensure_topics(kafka_bootstrap, [output_topic], 1)
    agent = approvals_agent(counter)
    ids = wait_ids(agent, inputs)
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY,
              "journal_topic": f"replay-waits-journal-{suffix}", "capture": True,
              "capture_topic": f"replay-waits-capture-{suffix}", "output_topics": [output_topic],
              "max_parallelism": MAX_PARALLELISM}
    env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()])
    signals = keyed_json_inputs(env, kafka_bootstrap, signals_topic, source_uid="signals", parse_uid="parse-signals")
    outputs = connect_to_agent(keyed_json_inputs(env, kafka_bootstrap, input_topic), agent, config, signals=signals)
    outputs.map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING()).sink_to(
        exactly_once_string_sink(kafka_bootstrap, output_topic, f"replay-waits-{suffix}")).uid("outputs")

    produce_json(kafka_bootstrap, signals_topic, decisions(ids, lambda n: n == 0))
    with CommittedReader(kafka_bootstrap, output_topic, json.loads) as reader, \
            running_job(env, "production with waits") as client:
        wait_until(client, lambda: len(reader.poll(0.1)) >= KEYS, "the first inputs' outputs")
        savepoint = trigger_savepoint(client, work / "savepoints")  # the second inputs parked, undecided
        produce_json(kafka_bootstrap, signals_topic, decisions(ids, lambda n: n > 0))
        wait_until(client, lambda: len(reader.poll(0.2)) >= len(inputs) - 3, "every output but the undecided's", 120)
        # The undecided inputs' runs parked: their capture records are there (flushed at checkpoints).
        wait_until(client, lambda: len(parked_at_the_end(captured(kafka_bootstrap, config["capture_topic"]))) == 2,
                   "the undecided runs' parked records in the capture", 60)
    capture = captured(kafka_bootstrap, config["capture_topic"])
    # Every run was captured parked at its wait (key-002's third never started), and the undecided ones are still
    # waiting at the capture's end.
    assert {(r.key, r.seq) for r in capture if isinstance(r, CapturedParked)} == {
        (f"key-{k:03d}", seq) for k in range(KEYS) for seq in range(1, PER_KEY + 1)} - {("key-002", 3)}
    assert parked_at_the_end(capture) == {(UNDECIDED[0], UNDECIDED[1] + 1), (PARKED_UNDECIDED[0], 2)}
    return {"bootstrap": kafka_bootstrap, "config": config, "savepoint": savepoint, "counter": counter, "ids": ids,
            "paid": counter.counts()}


def replay(production, wait_policy: str):
    kafka = {"bootstrap.servers": production["bootstrap"]}
    config = production["config"]
    settings = prepare_replay(kafka, config["capture_topic"], production["savepoint"], uid=default_uid(NAME),
                              key_type="STRING", max_parallelism=MAX_PARALLELISM, policies={"*": "recorded"},
                              wait_policy=wait_policy)
    suffix = f"{wait_policy}-{uuid.uuid4().hex[:6]}"
    capture_topic = f"{config['capture_topic']}.replay-{suffix}"
    env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()], config={
        "execution.savepoint.path": production["savepoint"], "execution.savepoint.ignore-unclaimed-state": "true"})
    inputs = captured_inputs(env, kafka, settings, SIGNING_KEY.encode(), uid=default_uid(NAME), key_type="STRING")
    replay_settings = replay_config(config, settings, journal_topic=f"{config['journal_topic']}.replay-{suffix}",
                                    capture_topic=capture_topic)
    connect_to_agent(inputs, approvals_agent(production["counter"]), replay_settings).map(
        str, output_type=Types.STRING()).uid("discard").print()
    env.execute(f"replay {suffix}")
    return diff_captures(kafka, config["capture_topic"], capture_topic, signing_key=SIGNING_KEY.encode(),
                         uid=default_uid(NAME))


def by_run(report) -> dict:
    return {(run.key, run.seq): run for run in report.runs}


def test_a_replay_gives_the_parked_and_later_runs_productions_decisions_and_leaves_the_undecided_waiting(production):
    paid_before = production["counter"].counts()
    report = replay(production, "recorded")
    text = report.render_text(max_width=200)
    # The savepoint's parked runs (each key's second input) and the later ones: every run after it compared, but
    # key-002's third, which waits behind its second in the replay as in production.
    compared = KEYS * (PER_KEY - 1) - 1
    assert report.summary["compared"] == compared, report.summary
    assert (report.summary["same"], report.summary["waiting"]) == (compared - 2, 2), text
    assert (report.summary["waits"], report.summary["decisions_changed"]) == (compared, 0), text
    # Each run's wait and decision, production's and the replay's: the same question, the same decision.
    undecided, parked_undecided = (UNDECIDED[0], UNDECIDED[1] + 1), (PARKED_UNDECIDED[0], PARKED_UNDECIDED[1] + 1)
    for (key, seq), run in by_run(report).items():
        [row] = run.waits
        assert (row.production.name, row.production.payload, row.replay.payload) == (
            "refund-approval", {"n": seq - 1}, {"n": seq - 1})
        if (key, seq) in (undecided, parked_undecided):
            continue
        expected = ("approved by ops", "same") if (seq - 1) % 2 == 0 else ("denied by ops: odd", "same")
        assert (row.replay.describe(), row.change) == expected and row.production.decision == row.replay.decision
    # The wait production never decided, in the run it never finished, is still open at the end of the replay:
    # the replay's run waits at the same wait (production's wait id), and the diff says so.
    # So is the one parked in the savepoint, which the replay reports at the end of its input.
    for identity, name in ((undecided, UNDECIDED), (parked_undecided, PARKED_UNDECIDED)):
        waiting = by_run(report)[identity]
        assert (waiting.status, waiting.replay, waiting.note) == ("waiting", [], NOTE_PRODUCTION_WAITING), name
        assert waiting.open_wait.wait_id == production["ids"][name]
        assert [row.change for row in waiting.waits] == ["still waiting"]
    assert len(report.waiting) == 2 and not report.has_differences
    still = text.split("Still waiting (2)")[1].split("Waits and decisions")[0]
    assert all(production["ids"][name] in still for name in (UNDECIDED, PARKED_UNDECIDED)), still
    assert f"Waits and decisions ({compared})" in text and "denied by ops: odd" in text
    assert production["counter"].counts() == paid_before  # the payments are production's recorded ones


def test_a_replay_that_denies_every_wait_shows_the_changed_outputs_and_decisions(production):
    paid_before = production["counter"].counts()
    report = replay(production, "deny")
    text = report.render_text(max_width=200)
    compared = KEYS * (PER_KEY - 1)
    # Production approved the even inputs (paid) and denied the odd ones ("odd"); the replay denies all, in its
    # own words: every run's output changed, and nothing was paid. The runs production never finished are new: the
    # savepoint's parked one denied at the end of the replay's input, and then key-002's third, which production
    # held behind it and never ran.
    assert (report.summary["changed"], report.summary["new"]) == (compared - 3, 3), text
    assert report.summary["compared"] == compared and report.summary["waiting"] == 0
    assert {tuple(run.replay[0]) for run in report.runs} == {("denied", "the replay's wait policy denies every wait")}
    assert {run.production[0][0] for run in report.runs if run.production} == {"paid", "denied"}
    # Every decision the replay changed is visible per run (a denial by the policy where production denied too is
    # the same decision), those production never made included.
    changes = {identity: [row.change for row in run.waits] for identity, run in by_run(report).items()}
    assert changes.pop((UNDECIDED[0], UNDECIDED[1] + 1)) == ["production waiting"]
    assert changes.pop((PARKED_UNDECIDED[0], PARKED_UNDECIDED[1] + 1)) == ["production waiting"]
    assert changes.pop((PARKED_UNDECIDED[0], PARKED_UNDECIDED[1] + 2)) == ["replay only"]
    assert {identity: rows for identity, rows in changes.items() if rows != ["same"]} == {
        (key, seq): ["changed"] for (key, seq) in changes if (seq - 1) % 2 == 0}  # production approved those
    assert report.summary["decisions_changed"] == 2 + sum(rows == ["changed"] for rows in changes.values()), text
    assert "denied by replay: the replay's wait policy denies every wait" in text and "production waiting" in text
    assert production["counter"].counts() == paid_before
