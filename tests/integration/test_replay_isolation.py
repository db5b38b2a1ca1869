"""Replay isolation (docs/design.md §9): a replay never reuses what production journaled after the savepoint.

The race, with the package's own jobs and Flink's own client on a local standalone cluster: production
(``flink_agents_replay.jobs.agent_job --capture``)
runs with a checkpoint interval of a day, ``flink savepoint`` is taken
while customers' runs are in flight (the job keeps running), a second batch of tickets is answered, and
production is cancelled before any further checkpoint could prune its journal. So production's journal
still holds every record written after the savepoint's barrier when the replay starts. The replay
(``flink_agents_replay.jobs.replay_job``)
runs the *unchanged* agent with only a model setting changed (``--model``) and the
model ``live``.

Every run that started after the savepoint must call the model for real (two chat calls per ticket,
counted by the model service in this process, outside Flink's workers); runs in flight in the savepoint
must finish from production's journal without calling anything again.
"""

from __future__ import annotations

import re

import pytest

from flink_agents_replay.examples.support_triage import make_tickets, produce_tickets
from flink_agents_replay.flink.config import default_capture_topic, default_journal_topic, default_uid
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.replay.diff import compare
from flink_agents_replay.replay.job import prepare_replay
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedRun
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.records.journal import key_digest, parse_journal_key
from flink_agents_replay.testing.committed import poll_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SIGNING_KEY = "replay-isolation-signing-key"
MAX_PARALLELISM = 128  # the main job's default
CUSTOMERS = 6
_JOB_ID = re.compile(r"JobID\s+([0-9a-f]{32})")


def _produce(bootstrap: str, topic: str, tickets: list[dict]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    produce_tickets(producer, topic, tickets)
    assert producer.flush(30) == 0


def _journal_runs(bootstrap: str, topic: str) -> set[tuple[str, int]]:
    """(key digest, seq) of every record production's journal holds now."""
    store = KafkaJournalStore({"bootstrap.servers": bootstrap}, topic, MAX_PARALLELISM, create_topic=False)
    try:
        partitions = range(MAX_PARALLELISM)
        runs = set()
        for stored in store.read(store.start_offsets(partitions), store.end_offsets(partitions)):
            _, seq, _, _, digest = parse_journal_key(stored.key)
            runs.add((digest, seq))
        return runs
    finally:
        store.close()


def test_replay_with_a_changed_model_setting_calls_the_model_for_every_run_after_the_savepoint(
        kafka_bootstrap, new_topic, flink_cluster, model_server, tmp_path, operator_log):
    # Ten tickets per customer, a customer's tickets one after another (3 calls x 0.4 s each): the first
    # batch takes about 12 s, so the savepoint taken early in it holds runs in flight (the client needs seconds).
    first, second = make_tickets(60, customers=CUSTOMERS), make_tickets(24, customers=CUSTOMERS, start=60)
    server = model_server(delay_ms=400)
    input_topic, output_topic = new_topic(2, "tickets"), new_topic(2, "replies")
    agent_id = f"isolation-{input_topic[-6:]}"
    uid = default_uid(agent_id)
    capture_topic, journal_topic = default_capture_topic(uid), default_journal_topic(uid)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()

    # Production: capture on, a checkpoint interval of a day (the first periodic checkpoint comes at a
    # random point of it), so nothing prunes the journal after the savepoint.
    _produce(kafka_bootstrap, input_topic, first)
    submitted = cluster.flink_command(
        "run", "-d", "--jarfile", str(kafka_connector_jar()), "-pym", "flink_agents_replay.jobs.agent_job",
        "--bootstrap-servers", kafka_bootstrap,
        "--input-topic", input_topic, "--output-topic", output_topic, "--agent-id", agent_id, "--parallelism", "2",
        "--model-base-url", server.base_url, "--signing-key", SIGNING_KEY, "--checkpoint-interval-ms", "86400000",
        "--restart-attempts", "0", "--capture", check=True)
    job_id = _JOB_ID.search(submitted.stdout + submitted.stderr).group(1)
    poll_until(lambda: server.stats().chat >= CUSTOMERS, 120, lambda: cluster.job_diagnostics(job_id))
    savepoint = cluster.trigger_savepoint(job_id, tmp_path / "savepoints")

    # The job keeps running: the second batch is answered after the savepoint.
    _produce(kafka_bootstrap, input_topic, second)
    decoder = CaptureDecoder(SIGNING_KEY.encode(), uid)
    tickets = {t["ticket_id"] for t in first + second}

    def answered() -> set[str]:
        return {output.output["ticket_id"] for record in read_capture(kafka, capture_topic, MAX_PARALLELISM, decoder)
                if isinstance(record, CapturedRun) for output in record.outputs}

    poll_until(lambda: answered() >= tickets, 180, lambda: f"{len(answered())} of {len(tickets)} tickets answered; "
               f"{cluster.job_diagnostics(job_id)}", interval_s=1.0)
    checkpoints = cluster.rest_get(f"/jobs/{job_id}/checkpoints")["history"]
    cluster.cancel_job(job_id)

    # What happened after the savepoint, from the capture (the manifest's offsets for its checkpoint): runs
    # whose input was accepted after the barrier, and runs accepted before it and applied after (in flight).
    settings = prepare_replay(kafka, capture_topic, savepoint, uid=uid, key_type="STRING",
                              max_parallelism=MAX_PARALLELISM)
    after = list(read_capture(kafka, capture_topic, MAX_PARALLELISM, decoder, start=settings.start_offsets))
    started_after = {(r.key, r.seq): r for r in after if isinstance(r, CapturedInput)}
    applied_after = {(r.key, r.seq): r for r in after if isinstance(r, CapturedRun)}
    in_flight = applied_after.keys() - started_after.keys()
    assert started_after.keys() <= applied_after.keys()
    assert in_flight, "no run was in flight in the savepoint: the setup did not reproduce the race"
    assert len(started_after) >= len(second), (len(started_after), len(second))
    # The fault really hit: no checkpoint after the savepoint pruned production's journal, which still holds
    # the records of every run started after the savepoint's barrier when the replay starts.
    assert not [c for c in checkpoints if c["id"] > settings.checkpoint_id], checkpoints
    journaled = _journal_runs(kafka_bootstrap, journal_topic)
    unpruned = [run for run in started_after if (key_digest(run[0]), run[1]) in journaled]
    assert len(unpruned) == len(started_after), f"only {len(unpruned)} of {len(started_after)} runs after the " \
                                                "savepoint still have journal records: the race was not reproduced"

    # The replay: the unchanged agent, only the model name changed, the model live.
    log_from = len(operator_log())
    before = server.stats()
    replayed = cluster.flink_command(
        "run", "-s", savepoint, "--jarfile", str(kafka_connector_jar()), "-pym", "flink_agents_replay.jobs.replay_job",
        "--replay-name", "other-model",
        "--agent-id", agent_id, "--bootstrap-servers", kafka_bootstrap, "--output-topic", output_topic,
        "--side-effects", "llm=live", "--model", "stub-model-2", "--model-base-url", server.base_url,
        "--signing-key", SIGNING_KEY, timeout_s=300)
    assert replayed.returncode == 0, (replayed.stdout + replayed.stderr)[-3000:]
    calls = server.stats()
    live_chat, live_orders = calls.chat - before.chat, calls.orders - before.orders

    # Every run after the savepoint asked the model to classify and to reply (the reply's tool loop takes one
    # more turn when the model looks the order up, live by default); runs in flight in the savepoint reused
    # production's journal: no call at all.
    expected_orders = sum(1 for run in started_after.values() if run.payload["order_id"])
    expected_chat = 2 * len(started_after) + expected_orders
    print(f"\nreplay isolation: {len(first) + len(second)} tickets, {len(in_flight)} runs in flight in the savepoint, "
          f"{len(started_after)} runs after it; live model calls {live_chat} (expected {expected_chat}), live order "
          f"lookups {live_orders} (expected {expected_orders})")
    assert (live_chat, live_orders) == (expected_chat, expected_orders)

    # The replay restored exactly those runs in flight, and finished them (with production's outputs).
    # (A line may be in the log twice, as in test_savepoint_workflow: one per subtask is kept.)
    replay_log = operator_log()[log_from:]
    restores = {line.split(" INFO ", 1)[-1] for line in replay_log if " restored: " in line}
    assert len(restores) == 2, restores  # the replay job's parallelism
    assert sum(int(re.search(r"(\d+) runs were in flight", line).group(1)) for line in restores) == len(in_flight)
    # Their two actions (classify, the reply's tool loop) were reused from production's journal; every later run
    # executed its two.
    closing = {line.split(" INFO ", 1)[-1] for line in replay_log if " closing: " in line}
    actions = [tuple(map(int, re.search(r"actions executed (\d+), reused (\d+)", line).groups())) for line in closing]
    assert len(actions) == 2, closing
    executed, reused = (sum(column) for column in zip(*actions, strict=True))
    assert (executed, reused) == (2 * len(started_after), 2 * len(in_flight)), closing
    replay_capture = f"{capture_topic}.replay-other-model"
    replay_records = list(read_capture(kafka, replay_capture, MAX_PARALLELISM, decoder))
    report = compare([r for r in read_capture(kafka, capture_topic, MAX_PARALLELISM, decoder)
                      if isinstance(r, CapturedRun)],
                     [r for r in replay_records if isinstance(r, CapturedRun)],
                     [r for r in replay_records if isinstance(r, CapturedInput)])
    assert {(run.key, run.seq) for run in report.runs} == applied_after.keys()
    # The stub model answers from the messages only, so another model name changes no reply.
    assert report.summary["same"] == report.summary["compared"], report.render_text()
