"""The journal stays bounded when recorded inputs never come back (issue #13 part 3, docs/design.md §7).

A restore reads the journal written after its checkpoint into a recovered history per key, and the marker of
every later checkpoint keeps those records until the key's inputs come back and replay them. A key none of
whose recorded inputs comes back (a changed filter, here) used to hold its partition's pruning back forever.
With ``recovered_history_expiry_s`` such a history expires: counted, logged, and pruning moves on.

The scenario, on a MiniCluster and a real broker: job A takes a savepoint, then runs a second batch for every
key (journaled after the savepoint's barrier) and is cancelled. Job B restores the savepoint with an upstream
filter that now drops two keys ("gone-*"): their recorded inputs never come back, while the other keys' do
(and reuse their records). B then gets steady new input for the other keys over many 400 ms checkpoints.
Journal watermarks are sampled from the test's thread; invocations are counted outside the Flink worker;
outputs are read committed.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec
from pyflink.common import Types, WatermarkStrategy
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.local.processes import free_port
from flink_agents_replay.testing.agents import chain_agent, logical_call_counts
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import (
    exactly_once_string_sink,
    failure_free_outputs,
    running_job,
    trigger_savepoint,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SIGNING_KEY = "bounded-journal-signing-key"
MAX_PARALLELISM = 4  # few partitions, so the keys that never come back share theirs with live keys
CHECKPOINT_MS = 400
EXPIRY_S = 6.0
CALLS_PER_RUN = 6  # chain_agent: 3 actions, 2 calls each
LIVE = [f"live-{k}" for k in range(6)]
TRAFFIC_S = 24.0  # steady input to the restored job: several expiry periods' worth of checkpoints

_RESTORED = re.compile(r"subtask \d+ restored: read (\d+) journal records for (\d+) keys")
_EXPIRED = re.compile(r"subtask \d+: the recovered history of (\d+) keys? expired \((\d+) records\)")


def _gone_keys(count: int) -> list[str]:
    """Keys whose partitions live keys also write to (else pruning could never be seen held back there)."""
    live_groups = {key_group(k, "STRING", MAX_PARALLELISM) for k in LIVE}
    candidates = (f"gone-{n}" for n in range(100))
    return [k for k in candidates if key_group(k, "STRING", MAX_PARALLELISM) in live_groups][:count]


GONE = _gone_keys(2)
KEYS = LIVE + GONE


# --- job plumbing --------------------------------------------------------------------------------------------


def _job(bootstrap: str, input_topic: str, agent, journal_topic: str, *, rest_port: int, checkpoint_ms: int,
         dropped: frozenset[str] = frozenset(), savepoint: str | None = None, output_topic: str | None = None):
    """Kafka input (one partition) -> parse -> filter (drops ``dropped`` keys) -> agent -> sink or nowhere."""
    flink_config = {"rest.port": str(rest_port), "metrics.fetcher.update-interval": "200 ms",
                    "rest.cache.checkpoint-statistics.timeout": "100 ms", "web.checkpoints.history": "1000"}
    if savepoint is not None:
        flink_config["execution.savepoint.path"] = savepoint
    env = create_environment(parallelism=1, checkpoint_interval_ms=checkpoint_ms, jars=[kafka_connector_jar()],
                             config=flink_config)
    source = (KafkaSource.builder().set_bootstrap_servers(bootstrap).set_topics(input_topic)
              .set_group_id(f"bounded-{uuid.uuid4().hex[:8]}")
              .set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_value_only_deserializer(SimpleStringSchema()).build())
    records = env.from_source(source, WatermarkStrategy.no_watermarks(), "inputs").uid("inputs")
    parsed = records.map(json.loads, output_type=Types.PICKLED_BYTE_ARRAY()).uid("parse")
    kept = parsed.filter(lambda record: record["key"] not in dropped).uid("filter")  # the filter B changes
    keyed = kept.key_by(lambda record: record["key"], key_type=Types.STRING())
    config = {"kafka": {"bootstrap.servers": bootstrap}, "journal_topic": journal_topic, "signing_key": SIGNING_KEY,
              "max_parallelism": MAX_PARALLELISM, "max_concurrent_runs": len(KEYS) + 4,
              "recovered_history_expiry_s": EXPIRY_S}
    rows = connect_to_agent(keyed, agent, config).map(_output_json, output_type=Types.STRING())
    if output_topic is None:
        rows.filter(lambda row: False).print()
    else:
        sink = exactly_once_string_sink(bootstrap, output_topic, f"bounded-{uuid.uuid4().hex[:8]}")
        rows.sink_to(sink).uid("outputs")
    return env


def _output_json(output) -> str:
    return json.dumps({"key": output.key, "seq": output.seq, "event_id": output.event_id, "output": output.output},
                      sort_keys=True)


def _row_tuple(row: dict) -> tuple:
    return row["key"], row["seq"], row["event_id"], json.dumps(row["output"], sort_keys=True)


def _produce(bootstrap: str, topic: str, records: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for record in records:
        producer.produce(topic, json.dumps(record).encode(), key=record["key"].encode())
    assert producer.flush(30) == 0, "input records were not acknowledged"


def _rest(port: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.loads(response.read())


def _agent_metric(port: int, job_id: str, name: str) -> int | None:
    """The agent operator's metric ``name`` summed over its subtasks (None until reported)."""
    for vertex in _rest(port, f"/jobs/{job_id}")["vertices"]:
        if vertex["name"].startswith("agent "):
            metric = f"agent_bounded.flink_agents_replay.{name}"
            values = _rest(port, f"/jobs/{job_id}/vertices/{vertex['id']}/subtasks/metrics?get={metric}&agg=sum")
            return int(values[0]["sum"]) if values else None
    raise AssertionError("no agent operator in the job")


def _completed_checkpoint_triggers(port: int, job_id: str) -> list[float]:
    history = _rest(port, f"/jobs/{job_id}/checkpoints")["history"]
    return sorted(c["trigger_timestamp"] / 1000 for c in history if c["status"] == "COMPLETED")


@dataclass
class Sample:
    at: float  # time.time()
    low: dict[int, int]
    high: dict[int, int]

    @property
    def remaining(self) -> int:
        return sum(self.high[p] - self.low[p] for p in self.high)


def _watermarks(admin, topic: str) -> Sample:
    partitions = [TopicPartition(topic, p) for p in range(MAX_PARALLELISM)]
    lows = admin.list_offsets({tp: OffsetSpec.earliest() for tp in partitions}, request_timeout=10)
    highs = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, request_timeout=10)
    return Sample(time.time(), {tp.partition: f.result().offset for tp, f in lows.items()},
                  {tp.partition: f.result().offset for tp, f in highs.items()})


def _written_until(samples: list[Sample], at: float) -> float:
    """Records written to the journal until ``at`` (high watermarks summed, interpolated between samples)."""
    times = [s.at for s in samples]
    i = bisect_left(times, at)
    if i in (0, len(samples)):
        return sum(samples[min(i, len(samples) - 1)].high.values())
    before, after = samples[i - 1], samples[i]
    h0, h1 = sum(before.high.values()), sum(after.high.values())
    return h0 + (h1 - h0) * (at - before.at) / (after.at - before.at)


class CommittedRows:
    """The output topic as a read_committed consumer sees it."""

    def __init__(self, bootstrap: str, topic: str):
        self.rows: list[dict] = []
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                                   "enable.auto.commit": False, "isolation.level": "read_committed"})
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

    def at_least(self, count: int):
        def condition() -> bool:
            for message in self._consumer.consume(500, timeout=0.1):
                assert not message.error(), message.error()
                self.rows.append(json.loads(message.value()))
            return len(self.rows) >= count
        return condition

    def close(self) -> None:
        self._consumer.close()


def _logged_at(line: str) -> float:
    """When an operator log line was written (its ``%(asctime)s``, local time), as ``time.time()``."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _batch(keys: list[str], start: int, per_key: int) -> list[dict]:
    return [{"key": key, "n": n} for n in range(start, start + per_key) for key in keys]


# --- the test ---------------------------------------------------------------------------------------------------


def test_histories_whose_inputs_never_come_back_expire_and_pruning_moves_on(
        kafka_bootstrap, kafka_admin, new_topic, invocation_counter, operator_log, tmp_path):
    """Job A: batch 1, savepoint, batch 2 (journaled after the barrier), cancel. Job B restores the savepoint
    with the gone keys filtered out, then gets steady input for the live keys for 24 s (400 ms checkpoints).

    Asserts:
    * the fault hit: B's restore read the histories of every key (gone ones included), and until the expiry
      the gone keys' partitions stay pinned below the records A wrote after the savepoint;
    * the expiry: exactly the gone keys expire (log line, ``histories_expired`` metric), not before
      ``EXPIRY_S`` after the restore; then those partitions' low watermarks pass A's records;
    * bounded: every sample from 2 s after the expiry holds at most the records written in the last three
      completed checkpoint intervals plus one run per key; once input stops the journal is pruned to its end;
    * effects once: no logical call ran twice over both jobs and none is missing against a failure-free run;
      B's committed outputs are the failure-free outputs of the live keys' batches 2 and 3, each once
      (batch 2 reused from A's journal, not repeated).
    """
    assert len(GONE) == 2
    input_topic, output_topic = new_topic(1, "bounded-in"), new_topic(1, "bounded-out")
    journal_topic = f"journal-bounded-{uuid.uuid4().hex[:8]}"
    agent = chain_agent(invocation_counter, name="bounded", call_delay_s=0.02)
    produced: list[dict] = []

    def produce(records: list[dict]) -> None:
        _produce(kafka_bootstrap, input_topic, records)
        produced.extend(records)

    # Job A: a savepoint after batch 1, batch 2 journaled after it; no checkpoint of its own prunes batch 2.
    port_a = free_port()
    env_a = _job(kafka_bootstrap, input_topic, agent, journal_topic, rest_port=port_a, checkpoint_ms=600_000)
    with running_job(env_a, "bounded A") as client:
        job_a = str(client.get_job_id())
        produce(_batch(KEYS, 0, 2))
        wait_until(client, lambda: _agent_metric(port_a, job_a, "actions_executed") == 3 * len(produced),
                   "batch 1 to be done")
        savepoint = trigger_savepoint(client, tmp_path / "savepoints")
        produce(_batch(KEYS, 2, 2))
        wait_until(client, lambda: _agent_metric(port_a, job_a, "actions_executed") == 3 * len(produced),
                   "batch 2 to be done")
    after_a = _watermarks(kafka_admin, journal_topic)
    gone_partitions = {key_group(k, "STRING", MAX_PARALLELISM) for k in GONE}

    # Job B: the savepoint, with a filter that now drops the gone keys; steady input for the live keys.
    lines_before = len(operator_log())
    port_b = free_port()
    env_b = _job(kafka_bootstrap, input_topic, agent, journal_topic, rest_port=port_b, checkpoint_ms=CHECKPOINT_MS,
                 dropped=frozenset(GONE), savepoint=savepoint, output_topic=output_topic)
    outputs = CommittedRows(kafka_bootstrap, output_topic)
    samples: list[Sample] = []
    restored_at = time.time()
    live_inputs = len([r for r in produced if r["key"] in LIVE and r["n"] >= 2])
    try:
        with running_job(env_b, "bounded B") as client:
            job_b = str(client.get_job_id())

            def sample() -> None:
                samples.append(_watermarks(kafka_admin, journal_topic))
                time.sleep(0.05)

            # Sampled from the start: on a cold machine B's restore and first outputs can take longer than the
            # expiry, and the samples before it are the ones that show the gone keys holding pruning back.
            wait_until(client, outputs.at_least(live_inputs), "the live keys' batch 2 outputs", between=sample)
            n = 4
            while time.time() < restored_at + TRAFFIC_S:
                produce(_batch(LIVE, n, 1))
                n += 1
                for _ in range(5):
                    sample()
            live_inputs = len([r for r in produced if r["key"] in LIVE and r["n"] >= 2])
            wait_until(client, outputs.at_least(live_inputs), "every live input's output")
            finished_at = time.time()

            def pruned_to_end() -> bool:
                samples.append(_watermarks(kafka_admin, journal_topic))
                return samples[-1].remaining == 0

            wait_until(client, pruned_to_end, "the journal to be pruned to its end", 30,
                       between=lambda: time.sleep(0.1))
            # The REST metric fetcher reports a counter some time after it changed: poll it.
            wait_until(client, lambda: _agent_metric(port_b, job_b, "histories_expired") is not None,
                       "the histories_expired metric", 10)
            expired_metric = _agent_metric(port_b, job_b, "histories_expired")
            triggers = _completed_checkpoint_triggers(port_b, job_b)
    finally:
        outputs.close()
    log_b = operator_log()[lines_before:]

    assert not [line for line in log_b if SIGNING_KEY in line], "the operator log shows the signing key"
    # The fault hit: B restored every key's history, the gone keys' included.
    restored = [(m, line) for line in log_b if (m := _RESTORED.search(line))]
    assert [int(m[2]) for m, _ in restored] == [len(KEYS)], log_b
    restore_done = _logged_at(restored[0][1])  # the expiry clocks start just before this line
    # Exactly the gone keys expired, once.
    expired = [m for m in map(_EXPIRED.search, log_b) if m]
    assert [int(m[1]) for m in expired] == [len(GONE)], log_b
    assert expired_metric == len(GONE)
    # Not before the expiry time: until then the gone keys' partitions hold A's post-savepoint records, also
    # after B's checkpoints completed (each one prunes what nothing holds back).
    early = [s for s in samples if restore_done <= s.at < restore_done + EXPIRY_S]
    assert any(s.at > triggers[1] for s in early), \
        f"no sample between B's second checkpoint and the expiry: {len(early)} samples, checkpoints {triggers[:3]}"
    assert all(s.low[p] < after_a.high[p] for s in early for p in gone_partitions), \
        [(round(s.at - restored_at, 1), s.low) for s in early]
    moved = [s for s in samples if all(s.low[p] >= after_a.high[p] for p in gone_partitions)]
    assert moved, "the gone keys' partitions were never pruned past their records"
    expired_by = moved[0].at
    assert expired_by >= restored_at + EXPIRY_S

    # Bounded: from 2 s after the expiry, at most the last three checkpoint intervals' records, plus one run per
    # key (a run in flight at a barrier holds its partition back to its first record).
    records_per_run = sum(after_a.high.values()) / (2 * 2 * len(KEYS))
    checked = []
    for s in samples:
        i = bisect_right(triggers, s.at) - 1
        if s.at < expired_by + 2 or s.at > finished_at or i < 3:
            continue
        bound = sum(s.high.values()) - _written_until(samples, triggers[i - 2]) + len(KEYS) * records_per_run
        checked.append((round(s.at - restored_at, 1), s.remaining, round(bound)))
    assert len(checked) >= 20, f"only {len(checked)} samples after the expiry"
    over = [c for c in checked if c[1] > c[2]]
    assert not over, f"samples (s after restore, remaining, bound) over the bound: {over[:10]}"

    # Effects once, outputs equal to a failure-free run.
    calls = logical_call_counts(invocation_counter)
    assert {name: count for name, count in calls.items() if count > 1} == {}
    reference_counter = InvocationCounter(tmp_path / "reference.sqlite")
    reference_agent = chain_agent(reference_counter, name="bounded")
    reference = failure_free_outputs(reference_agent, produced, max_parallelism=MAX_PARALLELISM)
    assert calls.keys() == logical_call_counts(reference_counter).keys()
    expected = Counter(_row_tuple({"key": o.key, "seq": o.seq, "event_id": o.event_id, "output": o.output})
                       for o in reference if o.key in LIVE and o.seq > 2)
    got = Counter(_row_tuple(row) for row in outputs.rows)
    assert got == expected
    print(f"\nbounded journal: {len(produced)} inputs, {len(triggers)} checkpoints in B; expired "
          f"{expired[0][1]} keys ({expired[0][2]} records), pruned past them {expired_by - restored_at:.1f} s after "
          f"the restore; remaining after that max {max(c[1] for c in checked)} (bound min "
          f"{min(c[2] for c in checked)}); pruned to the end {time.time() - finished_at:.1f} s after the last output")
