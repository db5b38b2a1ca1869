"""Replay (docs/design.md §9): capture in production, replay from a savepoint, contained side effects, diff.

One production job (real Kafka, MiniCluster) runs with capture on; a savepoint is taken while it works
through the first batch of tickets (runs in flight); it then takes a second batch. Two replays are started
from that savepoint: the unchanged agent with every call ``recorded``, and a changed agent (the ``reply``
action asks the model differently for refund tickets) with the model ``live``. Real calls are counted
outside Flink's worker: the stub service counts model and lookup requests, a SQLite file counts
notifications.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pyflink.common import Types, WatermarkStrategy
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

from flink_agents_replay.core.errors import ReplayConfigError, ReplayIsolationError
from flink_agents_replay.examples.support_triage import make_tickets
from flink_agents_replay.flink.config import default_uid
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.operator import LOG_FILE_ENV
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.local.model_server import StubModelServer
from flink_agents_replay.replay.diff import DiffReport, compare
from flink_agents_replay.replay.job import captured_inputs, prepare_replay, replay_config
from flink_agents_replay.storage.capture.manifest import (
    CaptureDescription,
    ManifestEntry,
    ManifestWriter,
    manifest_topic,
)
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedRun
from flink_agents_replay.testing.committed import CommittedReader
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import exactly_once_string_sink, running_job, trigger_savepoint, wait_until
from tests.harness.replay_agents import replay_triage_agent

pytestmark = pytest.mark.integration

SIGNING_KEY = "replay-test-signing-key-0123456789"
MAX_PARALLELISM = 16
CUSTOMERS = 12
FIRST_BATCH, SECOND_BATCH = 48, 36
EVENT_TIME_BASE = 1_750_000_000_000
AGENT_NAME = "replay-triage"


def _output_json(output) -> str:
    return json.dumps({"seq": output.seq, **output.output}, sort_keys=True)


@dataclass
class Production:
    bootstrap: str
    server: StubModelServer
    counter: InvocationCounter
    config: dict
    input_topic: str
    output_topic: str
    journal_topic: str
    capture_topic: str
    savepoint: str
    tickets: list[dict]
    event_times: dict[str, int]
    outputs: list[dict]
    seconds: float
    work: Path
    replays: dict = field(default_factory=dict)

    @property
    def kafka(self) -> dict:
        return {"bootstrap.servers": self.bootstrap}

    @property
    def uid(self) -> str:
        return default_uid(AGENT_NAME)

    def captured(self, topic: str) -> list[CapturedInput | CapturedRun]:
        decoder = CaptureDecoder(SIGNING_KEY.encode(), self.uid)
        return list(read_capture(self.kafka, topic, MAX_PARALLELISM, decoder))


def _produce(bootstrap: str, topic: str, tickets: list[dict], event_times: dict[str, int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for ticket in tickets:
        producer.produce(topic, key=ticket["customer"].encode(), value=json.dumps(ticket).encode(),
                         timestamp=event_times[ticket["ticket_id"]])
    assert producer.flush(30) == 0


def _ticket_stream(env, bootstrap: str, topic: str):
    source = (KafkaSource.builder().set_bootstrap_servers(bootstrap).set_topics(topic)
              .set_group_id(f"replay-test-{uuid.uuid4().hex[:8]}")
              .set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_value_only_deserializer(SimpleStringSchema()).build())
    tickets = (env.from_source(source, WatermarkStrategy.no_watermarks(), "tickets").uid("tickets").set_parallelism(1)
               .map(json.loads, output_type=Types.PICKLED_BYTE_ARRAY()).uid("parse").set_parallelism(1))
    return tickets.key_by(lambda ticket: ticket["customer"], key_type=Types.STRING())


def _topic_contents(bootstrap: str, topic: str) -> tuple[dict[int, tuple[int, int]], list[tuple]]:
    """(low, high) offsets per partition and every record (partition, offset, key, value) in between."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"snapshot-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in partitions}
        records = []
        wanted = {p: hi for p, (lo, hi) in marks.items() if hi > lo}
        consumer.assign([TopicPartition(topic, p, marks[p][0]) for p in wanted])
        deadline = time.monotonic() + 60
        while wanted and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                assert not message.error(), message.error()
                records.append((message.partition(), message.offset(), message.key(), message.value()))
            # The position passes transaction markers too (an exactly-once sink's topic ends with one).
            for position in consumer.position([TopicPartition(topic, p) for p in wanted]):
                if position.offset >= wanted[position.partition]:
                    wanted.pop(position.partition)
        assert not wanted, f"could not read {topic} to its end: {wanted}"
        return marks, sorted(records)
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def production(kafka_bootstrap, tmp_path_factory):
    """The production job with capture on, a savepoint taken mid-stream, then more traffic; then cancelled."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    work = tmp_path_factory.mktemp("replay")
    server = StubModelServer(delay_ms=40).start()
    counter = InvocationCounter(work / "calls.sqlite")
    suffix = uuid.uuid4().hex[:8]
    input_topic, output_topic = f"replay-in-{suffix}", f"replay-out-{suffix}"
    ensure_topics(kafka_bootstrap, [input_topic, output_topic], 1)
    tickets = make_tickets(FIRST_BATCH + SECOND_BATCH, customers=CUSTOMERS)
    event_times = {t["ticket_id"]: EVENT_TIME_BASE + n * 1_000 + 7 for n, t in enumerate(tickets)}
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY,
              "journal_topic": f"replay-journal-{suffix}", "capture": True, "capture_topic": f"replay-capture-{suffix}",
              "output_topics": [output_topic], "max_parallelism": MAX_PARALLELISM, "max_concurrent_runs": 16}
    agent = replay_triage_agent(counter, server.url, name=AGENT_NAME)

    env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()])
    outputs = connect_to_agent(_ticket_stream(env, kafka_bootstrap, input_topic), agent, config)
    outputs.map(_output_json, output_type=Types.STRING()).sink_to(
        exactly_once_string_sink(kafka_bootstrap, output_topic, f"replay-prod-{suffix}")).uid("outputs")

    started = time.monotonic()
    _produce(kafka_bootstrap, input_topic, tickets[:FIRST_BATCH], event_times)
    with CommittedReader(kafka_bootstrap, output_topic, json.loads) as reader, \
            running_job(env, "production with capture") as client:
        # Mid-stream: some replies of the first batch are out, runs are in flight, most of it is still to come.
        wait_until(client, lambda: len(reader.poll(0.1)) >= 8, "the first replies")
        savepoint = trigger_savepoint(client, work / "savepoints")
        _produce(kafka_bootstrap, input_topic, tickets[FIRST_BATCH:], event_times)
        wait_until(client, lambda: len(reader.poll(0.2)) >= len(tickets), "every ticket's reply", 180)
        rows = list(reader.rows)
    seconds = time.monotonic() - started
    assert len(rows) == len(tickets) and len({r["ticket_id"] for r in rows}) == len(tickets)
    yield Production(kafka_bootstrap, server, counter, config, input_topic, output_topic, config["journal_topic"],
                     config["capture_topic"], savepoint, tickets, event_times, rows, seconds, work)
    server.stop()  # (the module's pickling by value ends with the test that used it: see conftest)


@dataclass
class Replay:
    report: DiffReport
    capture_topic: str
    journal_topic: str
    seconds: float
    calls: dict[str, int]  # real invocations during the replay
    runs: list[CapturedRun]
    log: list[str]  # the operator's log lines during the replay


def _log_size() -> int:
    path = Path(os.environ[LOG_FILE_ENV])
    return path.stat().st_size if path.exists() else 0


def _log_lines(start: int) -> list[str]:
    with open(os.environ[LOG_FILE_ENV], encoding="utf-8") as log_file:
        log_file.seek(start)
        return log_file.read().splitlines()


def _replay(production: Production, name: str, *, changed: bool, policies: dict) -> Replay:
    settings = prepare_replay(production.kafka, production.capture_topic, production.savepoint,
                              uid=production.uid, key_type="STRING", max_parallelism=MAX_PARALLELISM,
                              policies=policies)
    suffix = f"{name}-{uuid.uuid4().hex[:6]}"
    journal_topic, capture_topic = f"{production.journal_topic}.replay-{suffix}", \
        f"{production.capture_topic}.replay-{suffix}"
    output_topic = f"{production.output_topic}.replay-{suffix}"
    ensure_topics(production.bootstrap, [output_topic], 1)
    env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()], config={
        "execution.savepoint.path": production.savepoint,
        # The production job's source and sink state is not the replay's: its inputs come from the capture.
        "execution.savepoint.ignore-unclaimed-state": "true"})
    inputs = captured_inputs(env, production.kafka, settings, SIGNING_KEY.encode(), uid=production.uid,
                             key_type="STRING")
    agent = replay_triage_agent(production.counter, production.server.url, name=AGENT_NAME, changed=changed)
    config = replay_config(production.config, settings, journal_topic=journal_topic, capture_topic=capture_topic,
                           output_topics=[output_topic])
    outputs = connect_to_agent(inputs, agent, config)
    outputs.map(_output_json, output_type=Types.STRING()).sink_to(
        exactly_once_string_sink(production.bootstrap, output_topic, f"replay-{suffix}")).uid("replay-outputs")

    stats_before, notified_before = production.server.stats(), production.counter.count("notify")
    log_before = _log_size()
    started = time.monotonic()
    env.execute(f"replay {name}")
    seconds = time.monotonic() - started
    log = _log_lines(log_before)
    stats_after = production.server.stats()
    calls = {"chat": stats_after.chat - stats_before.chat, "orders": stats_after.orders - stats_before.orders,
             "notify": production.counter.count("notify") - notified_before}

    replayed = production.captured(capture_topic)
    production_runs = [r for r in production.captured(production.capture_topic) if isinstance(r, CapturedRun)]
    report = compare(production_runs, [r for r in replayed if isinstance(r, CapturedRun)],
                     [r for r in replayed if isinstance(r, CapturedInput)])
    return Replay(report, capture_topic, journal_topic, seconds, calls,
                  [r for r in replayed if isinstance(r, CapturedRun)], log)


@pytest.fixture(scope="module")
def replays(production):
    """Both replays, with the production topics' offsets and contents before and after them."""
    watched = (production.journal_topic, production.output_topic, production.capture_topic,
               manifest_topic(production.capture_topic))
    before = {topic: _topic_contents(production.bootstrap, topic) for topic in watched}
    unchanged = _replay(production, "unchanged", changed=False, policies={"*": "recorded"})
    changed = _replay(production, "changed", changed=True, policies={"llm": "live"})
    after = {topic: _topic_contents(production.bootstrap, topic) for topic in watched}
    print(f"\nproduction: {len(production.tickets)} tickets in {production.seconds:.1f} s; replays (from the "
          f"savepoint, {unchanged.report.summary['compared']} inputs each): unchanged {unchanged.seconds:.1f} s, "
          f"changed {changed.seconds:.1f} s")
    print(changed.report.render_text())
    return {"unchanged": unchanged, "changed": changed, "before": before, "after": after}


def _after_savepoint(production: Production, report: DiffReport) -> list[dict]:
    """Production's outputs for the inputs the replay compared."""
    compared = {(run.key, run.seq) for run in report.runs}
    return [row for row in production.outputs if (row["customer"], row["seq"]) in compared]


def test_unchanged_agent_on_recorded_reports_no_difference_and_calls_nothing(production, replays):
    replay = replays["unchanged"]
    summary = replay.report.summary
    # Everything production ran after the savepoint: the second batch, and of the first what the savepoint
    # did not hold as done (runs in flight, inputs waiting or not yet read).
    assert SECOND_BATCH < summary["compared"] < len(production.tickets), summary
    assert len(_after_savepoint(production, replay.report)) == summary["compared"]
    # Exactly the runs production applied after the savepoint's checkpoint (their capture records lie
    # after the manifest's offsets for it): no input lost, none the savepoint held run twice.
    settings = prepare_replay(production.kafka, production.capture_topic, production.savepoint, uid=production.uid,
                              key_type="STRING", max_parallelism=MAX_PARALLELISM)
    decoder = CaptureDecoder(SIGNING_KEY.encode(), production.uid)
    after = {(r.key, r.seq) for r in read_capture(production.kafka, production.capture_topic, MAX_PARALLELISM,
                                                   decoder, start=settings.start_offsets) if isinstance(r, CapturedRun)}
    assert {(run.key, run.seq) for run in replay.report.runs} == after
    # Runs in flight in the savepoint were finished from production's journal and capture.
    in_flight = [int(m[1]) for line in replay.log if (m := re.search(r"(\d+) runs were in flight", line))]
    assert sum(in_flight) > 0, replay.log
    assert any("replay from checkpoint" in line for line in replay.log)
    assert summary["same"] == summary["compared"], replay.report.render_text()
    assert (summary["changed"], summary["new"], summary["missing"], summary["errors"]) == (0, 0, 0, 0)
    assert summary["blocked_calls"] == 0
    assert replay.calls == {"chat": 0, "orders": 0, "notify": 0}, "a replay on 'recorded' reached a service"
    assert not replay.report.has_differences


def test_changed_agent_diff_lists_exactly_the_changed_subset_and_blocks_external_calls(production, replays):
    replay = replays["changed"]
    report = replay.report
    compared = _after_savepoint(production, report)
    refunds = {(row["customer"], row["seq"]) for row in compared if row["category"] == "refund"}
    assert refunds and len(refunds) < len(compared), "the test needs refund and other tickets after the savepoint"
    changed = {(run.key, run.seq) for run in report.runs if run.status == "changed"}
    assert changed == refunds, report.render_text()
    assert (report.summary["new"], report.summary["missing"], report.summary["errors"]) == (0, 0, 0)
    for run in report.runs:
        if run.status == "changed":  # only the reply differs: the rest came from the same state and inputs
            (before,), (after,) = run.production, run.replay
            assert {k: v for k, v in before.items() if k != "reply"} == {k: v for k, v in after.items() if k != "reply"}

    # The external notification: never made, and every blocked call listed with its arguments.
    assert replay.calls["notify"] == 0
    blocked = report.blocked_calls
    assert {(b.key, b.seq) for b in blocked} == {(row["customer"], row["seq"]) for row in compared}
    assert all(b.resource == "notify" and b.action == "reply" for b in blocked)
    tickets_of = {(row["customer"], row["seq"]): row["ticket_id"] for row in compared}
    assert all(tickets_of[(b.key, b.seq)] in b.arguments for b in blocked)
    # The model (live) and the idempotent lookup (live by default) were called for real.
    with_order = sum(1 for row in compared if row["order_status"] != "none")
    assert replay.calls["orders"] == with_order > 0
    assert replay.calls["chat"] == 2 * len(compared)
    assert "changed" in report.render_text() and "notify" in report.render_text()


def test_replay_leaves_production_topics_untouched(replays):
    assert replays["after"] == replays["before"]


def test_actions_see_production_event_times_in_replay(production, replays):
    for name in ("unchanged", "changed"):
        runs = replays[name].runs
        assert runs
        for run in runs:
            (output,) = [o.output for o in run.outputs]
            assert output["event_time"] == production.event_times[output["ticket_id"]], (name, output)
    by_ticket = {row["ticket_id"]: row["event_time"] for row in production.outputs}
    assert by_ticket == production.event_times


def test_bad_savepoint_capture_manifest_or_targets_fail_before_any_input(production, kafka_bootstrap):
    kafka = production.kafka

    def prepare(**overrides):
        settings = {"uid": production.uid, "key_type": "STRING", "max_parallelism": MAX_PARALLELISM, **overrides}
        capture = settings.pop("capture_topic", production.capture_topic)
        return prepare_replay(kafka, capture, production.savepoint, **settings)

    with pytest.raises(ReplayConfigError, match="holds no state of operator 'flink-agents-replay/other-agent'"):
        prepare(uid=default_uid("other-agent"))
    with pytest.raises(ReplayConfigError, match="its keys are STRING, the replay keys by LONG"):
        prepare(key_type="LONG")
    with pytest.raises(ReplayConfigError, match="its max parallelism is 16, the replay's 32"):
        prepare(max_parallelism=32)
    with pytest.raises(ReplayConfigError, match="does not exist"):
        prepare(capture_topic=f"no-such-capture-{uuid.uuid4().hex[:6]}")
    # A manifest that knows other checkpoints only.
    other_capture = f"other-capture-{uuid.uuid4().hex[:6]}"
    writer = ManifestWriter(kafka, manifest_topic(other_capture))
    writer.write(ManifestEntry(999_999, {p: 0 for p in range(MAX_PARALLELISM)}, CaptureDescription(
        production.uid, other_capture, "STRING", MAX_PARALLELISM, 1)))
    writer.close()
    with pytest.raises(ReplayConfigError, match="has no entry for checkpoint"):
        prepare(capture_topic=other_capture)
    with pytest.raises(ReplayConfigError, match="cannot read the savepoint"):
        prepare_replay(kafka, production.capture_topic, production.work / "nowhere", uid=production.uid,
                       key_type="STRING", max_parallelism=MAX_PARALLELISM)

    # Targets: each production topic refused as the replay's journal, capture or output topic.
    settings = prepare()
    env = create_environment(parallelism=1, jars=[kafka_connector_jar()])
    inputs = captured_inputs(env, kafka, settings, SIGNING_KEY.encode(), uid=production.uid, key_type="STRING")
    agent = replay_triage_agent(production.counter, production.server.url, name=AGENT_NAME)
    own = uuid.uuid4().hex[:6]
    mine = {"journal_topic": f"own-journal-{own}", "capture_topic": f"own-capture-{own}"}
    for target, topic in [("journal_topic", production.journal_topic), ("capture_topic", production.capture_topic),
                          ("capture_topic", manifest_topic(production.capture_topic))]:
        with pytest.raises(ReplayIsolationError, match="a production topic"):
            connect_to_agent(inputs, agent, replay_config(production.config, settings, **{**mine, target: topic}))
    with pytest.raises(ReplayIsolationError, match=f"output topic '{production.output_topic}'"):
        connect_to_agent(inputs, agent, replay_config(production.config, settings, **mine,
                                                      output_topics=[production.output_topic]))
