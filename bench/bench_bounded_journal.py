"""The journal's size and a restore's read time over a long run whose upstream does not replay some keys.

A recovered history waits for its key's inputs and holds its journal partition's pruning back meanwhile.
When inputs never come back (a non-replayable source, a changed filter, a processing-time window), the
history expires after ``recovered_history_expiry_s`` (docs/design.md §7) and pruning moves on. This runs that
case for a long time and prints the journal over time:

1. job A (MiniCluster, p=1) runs a first batch for every key, takes a savepoint, runs a second batch (journaled
   after the savepoint's barrier) and is cancelled;
2. job B restores the savepoint with an upstream filter that now drops ``--gone`` of the keys: their recorded
   inputs never come back. B gets steady input for the other keys (``--rate`` inputs/s) for ``--minutes``.

Every ``--sample-s`` it prints: journal records written so far, records retained (high - low watermark over
all partitions) now and at most since the previous row (read after every input batch), what a restore would
read (every retained record, read into a recovery index as a restore does, timed) and the
``histories_expired`` counter. With ``--expiry-s`` very large (the behaviour before expiry existed) the
retained records grow for the whole run.

    .venv/bin/python bench/bench_bounded_journal.py                          # 20 minutes, expiry 120 s
    .venv/bin/python bench/bench_bounded_journal.py --minutes 3 --expiry-s 30
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
import uuid

import _harness as h
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from pyflink.common import Types, WatermarkStrategy
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.local.processes import free_port
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.testing.jobs import running_job, trigger_savepoint, wait_until

MAX_PARALLELISM = 8
AGENT = "bounded-bench"


def build_job(bootstrap: str, input_topic: str, agent, config: dict, *, rest_port: int, checkpoint_ms: int,
              dropped: frozenset[str] = frozenset(), savepoint: str | None = None):
    """Kafka input -> parse -> filter (drops ``dropped`` keys) -> agent -> nowhere."""
    flink_config = {"rest.port": str(rest_port), "metrics.fetcher.update-interval": "500 ms"}
    if savepoint is not None:
        flink_config["execution.savepoint.path"] = savepoint
    env = create_environment(parallelism=1, checkpoint_interval_ms=checkpoint_ms, jars=[kafka_connector_jar()],
                             config=flink_config)
    source = (KafkaSource.builder().set_bootstrap_servers(bootstrap).set_topics(input_topic)
              .set_group_id(f"bench-{uuid.uuid4().hex[:8]}").set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_value_only_deserializer(SimpleStringSchema()).build())
    parsed = (env.from_source(source, WatermarkStrategy.no_watermarks(), "inputs").uid("inputs")
              .map(json.loads, output_type=Types.PICKLED_BYTE_ARRAY()).uid("parse"))
    kept = parsed.filter(lambda record: record["key"] not in dropped).uid("filter")
    keyed = kept.key_by(lambda record: record["key"], key_type=Types.STRING())
    connect_to_agent(keyed, agent, config).filter(lambda output: False).print()
    return env


def agent_metric(port: int, job_id: str, name: str) -> int | None:
    """The agent operator's counter ``name`` from Flink's REST API (None until reported)."""
    def get(path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return json.loads(response.read())

    for vertex in get(f"/jobs/{job_id}")["vertices"]:
        if vertex["name"].startswith("agent "):
            base = f"/jobs/{job_id}/vertices/{vertex['id']}/subtasks/metrics"
            # Flink rewrites characters of the operator name in metric ids: find the id by its ending.
            ids = [m["id"] for m in get(base) if m["id"].endswith(f".flink_agents_replay.{name}")]
            values = get(f"{base}?get={ids[0]}&agg=sum") if ids else []
            return int(values[0]["sum"]) if values else None
    return None


class Journal:
    """The journal topic's watermarks, and a restore's read of everything it retains."""

    def __init__(self, bootstrap: str, topic: str):
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.topic = topic
        self.store = KafkaJournalStore({"bootstrap.servers": bootstrap}, topic, MAX_PARALLELISM, create_topic=False)
        self.codec = RecordCodec(h.SIGNING_KEY.encode(), f"flink-agents-replay/{AGENT}")

    def watermarks(self) -> tuple[dict[int, int], dict[int, int]]:
        partitions = [TopicPartition(self.topic, p) for p in range(MAX_PARALLELISM)]
        lows = self.admin.list_offsets({tp: OffsetSpec.earliest() for tp in partitions}, request_timeout=10)
        highs = self.admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, request_timeout=10)
        return ({tp.partition: f.result().offset for tp, f in lows.items()},
                {tp.partition: f.result().offset for tp, f in highs.items()})

    def restore_read(self, low: dict[int, int], high: dict[int, int]) -> tuple[int, float]:
        """Read every retained record into a recovery index, as a restore from the oldest retained offset would."""
        began = time.perf_counter()
        index = read_recovery_index(self.store, self.codec, low, high)
        return index.records_read, time.perf_counter() - began


def produce(producer: Producer, topic: str, records: list[dict]) -> None:
    for record in records:
        producer.produce(topic, json.dumps(record).encode(), key=record["key"].encode())
    if producer.flush(30):
        raise RuntimeError("input records were not acknowledged")


def main() -> None:  # noqa: PLR0915 - one scenario, read top to bottom
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="how long job B gets steady input (default 20)")
    parser.add_argument("--expiry-s", type=float, default=120.0, help="recovered_history_expiry_s (default 120)")
    parser.add_argument("--checkpoint-ms", type=int, default=2000, help="job B's checkpoint interval (default 2000)")
    parser.add_argument("--keys", type=int, default=16, help="keys whose inputs keep coming (default 16)")
    parser.add_argument("--gone", type=int, default=4, help="keys the changed filter drops (default 4)")
    parser.add_argument("--rate", type=float, default=20.0, help="inputs per second to job B (default 20)")
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between table rows (default 60)")
    args = parser.parse_args()
    live = [f"live-{k:02d}" for k in range(args.keys)]
    gone = [f"gone-{k:02d}" for k in range(args.gone)]
    agent = h.bench_agent(AGENT, call_delay_s=0.005)
    print(h.machine_note())
    with h.broker() as bootstrap:
        input_topic = f"bench-bounded-in-{uuid.uuid4().hex[:8]}"
        journal_topic = f"bench-bounded-journal-{uuid.uuid4().hex[:8]}"
        h.CREATED_TOPICS.extend([input_topic, journal_topic])
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(input_topic, 1, 1)])[input_topic].result()
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        config = {"kafka": {"bootstrap.servers": bootstrap}, "journal_topic": journal_topic,
                  "signing_key": h.SIGNING_KEY, "max_parallelism": MAX_PARALLELISM,
                  "max_concurrent_runs": len(live) + len(gone), "recovered_history_expiry_s": args.expiry_s}
        gone_groups = sorted({key_group(k, "STRING", MAX_PARALLELISM) for k in gone})
        print(f"# {len(live)} live keys, {len(gone)} gone keys (partitions {gone_groups}), expiry "
              f"{args.expiry_s:.0f} s, checkpoints every {args.checkpoint_ms} ms, {args.rate:.0f} inputs/s for "
              f"{args.minutes:.1f} min",
              flush=True)

        # Job A: batch 1, savepoint, batch 2 journaled after it (no checkpoint of A prunes it), cancelled.
        port = free_port()
        batch = [{"key": k, "n": n} for n in range(2) for k in live + gone]
        with running_job(build_job(bootstrap, input_topic, agent, config, rest_port=port, checkpoint_ms=600_000),
                         "bench A") as client:
            job = str(client.get_job_id())
            produce(producer, input_topic, batch)
            wait_until(client, lambda: agent_metric(port, job, "actions_executed") == 2 * len(batch), "batch 1", 300)
            savepoint = trigger_savepoint(client, tempfile.mkdtemp(prefix="far-bench-sp-"))
            produce(producer, input_topic, batch)
            wait_until(client, lambda: agent_metric(port, job, "actions_executed") == 4 * len(batch), "batch 2", 300)
        journal = Journal(bootstrap, journal_topic)
        print(f"# job A: savepoint {savepoint}; {sum(journal.watermarks()[1].values())} journal records", flush=True)

        # Job B: the savepoint with the gone keys filtered out; steady input for the live keys.
        port = free_port()
        env = build_job(bootstrap, input_topic, agent, config, rest_port=port, checkpoint_ms=args.checkpoint_ms,
                        dropped=frozenset(gone), savepoint=savepoint)
        rows = []
        with running_job(env, "bench B") as client:
            job = str(client.get_job_id())
            began = time.monotonic()
            n, next_sample, most_retained = 2, 0.0, 0
            while (elapsed := time.monotonic() - began) <= args.minutes * 60:
                low, high = journal.watermarks()  # every batch: a row's sample alone falls at one phase
                most_retained = max(most_retained, sum(high[p] - low[p] for p in high))
                if elapsed >= next_sample:
                    read, seconds = journal.restore_read(low, high)
                    row = [f"{elapsed / 60:.1f}", (n - 2) * len(live), sum(high.values()),
                           sum(high[p] - low[p] for p in high), most_retained,
                           sum(high[p] - low[p] for p in gone_groups), read, seconds,
                           agent_metric(port, job, "histories_expired") or 0, h.load1()]
                    rows.append(row)
                    print("# " + "  ".join(h._cell(v) for v in row), flush=True)
                    next_sample += args.sample_s
                    most_retained = 0
                produce(producer, input_topic, [{"key": k, "n": n} for k in live])
                n += 1
                time.sleep(max(0.0, began + (n - 2) * len(live) / args.rate - time.monotonic()))
        journal.store.close()
    h.print_table(f"Journal over time (expiry {args.expiry_s:.0f} s, checkpoints {args.checkpoint_ms} ms, "
                  f"{len(gone)} of {len(live) + len(gone)} keys never come back)",
                  ["minute", "inputs fed", "records written", "retained", "most retained since last row",
                   "retained in gone partitions",
                   "restore reads", "restore read s", "histories expired", "load1"], rows)


if __name__ == "__main__":
    main()
