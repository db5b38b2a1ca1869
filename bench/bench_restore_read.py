"""Restore read rate: ``read_recovery_index`` vs a raw confluent-kafka consume of the same records.

A journal topic of 128 partitions (max parallelism 128) is filled with realistic records, written with
the real codec (``RecordCodec``: cloudpickled ``CallRecord`` / ``CompletionRecord``, JSON header,
HMAC-SHA256) through ``KafkaJournalStore.append``, into the key groups subtask 0 of 2 owns
(``key_group_range(0, 2, 128)`` = partitions 0-63). The shape is the one the runner writes: per run of a
key, 2 actions, each with 1 call record (a ~300-byte model answer) and 1 completion record (a memory
update and a sent event), so payloads are a few hundred bytes.

Readers, each over the same partitions from offset 0 to the end offsets, interleaved over rounds:

* ``raw consume``: a confluent-kafka ``Consumer`` with the same settings the store uses (assign, batched
  ``consume``), touching each record's key and value: the ceiling.
* ``store.read``: ``KafkaJournalStore.read`` (the raw loop plus bounds bookkeeping and ``StoredRecord``).
* ``read_recovery_index``: what a restoring subtask does: read, parse the Kafka key, verify the HMAC,
  unpickle and index every record.
* ``read_recovery_index (keep=none)``: the same with a ``keep`` filter that rejects every record (the
  records of runs the checkpoint already holds are never verified nor unpickled): the read-and-parse part.

``--profile`` adds a cProfile of one ``read_recovery_index`` pass.

    .venv/bin/python bench/bench_restore_read.py --quick     # 50k records, one round, ~1 minute
    .venv/bin/python bench/bench_restore_read.py             # 200k records, 3 rounds, ~3 minutes
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import time
import uuid
from collections import defaultdict

import _harness as h
from confluent_kafka import Consumer, TopicPartition

from flink_agents_replay.api.agent import OutputEvent, with_event_id
from flink_agents_replay.api.memory import MemoryUpdate
from flink_agents_replay.core.keygroups import key_group, key_group_range
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import (
    CallOutcome,
    CallRecord,
    CompletionRecord,
    RecordKind,
    event_id,
    input_event_id,
    journal_key,
    key_digest,
)
from flink_agents_replay.testing.agents import Classified

MAX_PARALLELISM = 128
PRODUCER = "flink-agents-replay/bench-restore"


def fill_journal(store: KafkaJournalStore, codec: RecordCodec, owned: range, records: int,
                 keys: int) -> tuple[int, int]:
    """Write about ``records`` records for ``keys`` keys of the owned key groups; return (records, bytes)."""
    rng = random.Random(11)
    chosen: list[tuple[str, int]] = []
    candidate = 0
    while len(chosen) < keys:
        key = f"customer-{candidate:06d}"
        group = key_group(key, "STRING", MAX_PARALLELISM)
        if group in owned:
            chosen.append((key, group))
        candidate += 1
    seqs = defaultdict(int)
    written = size = 0

    def append(group: int, record_key: bytes, value: bytes) -> None:
        nonlocal size
        size += len(record_key) + len(value)
        store.append(group, record_key, value)

    while written < records:
        key, group = chosen[rng.randrange(len(chosen))]
        seqs[key] += 1
        seq, digest = seqs[key], key_digest(key)
        parent = input_event_id(digest, seq)
        for order, (action_name, last) in enumerate((("classify", False), ("reply", True))):
            answer = f"{action_name} answer for {key} #{seq}: " + "".join(
                rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(300))
            record_key = journal_key(group, seq, parent, action_name, digest)
            call = CallRecord(seq, order, parent, action_name, 0, "llm", f"{rng.getrandbits(64):016x}",
                              CallOutcome.RETURNED, answer, input_digest=f"{seq:016x}")
            append(group, record_key, codec.encode(record_key, RecordKind.CALL, call, topic=store.topic,
                                                   partition=group, fingerprint="f" * 16))
            sent_id = event_id(digest, seq, parent, action_name, 0)
            sent = (with_event_id(OutputEvent(output={"reply": answer[:120]}), sent_id) if last
                    else with_event_id(Classified(label=answer[:40], detail=answer[40:160]), sent_id))
            completion = CompletionRecord(seq, order, parent, action_name, "f" * 16,
                                          [MemoryUpdate(f"history.{action_name}", answer[:80])], [sent], calls=1,
                                          input_digest=f"{seq:016x}")
            append(group, record_key, codec.encode(record_key, RecordKind.COMPLETION, completion, topic=store.topic,
                                                   partition=group, fingerprint="f" * 16))
            written += 2
            parent = sent_id
    store.flush(120)
    return written, size


def raw_consume(bootstrap: str, topic: str, start: dict[int, int], end: dict[int, int]) -> int:
    """The ceiling: the store's consumer settings and loop shape, touching key and value only."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "error"})
    remaining = {p: (start[p], end[p]) for p in start if start[p] < end[p]}  # partition -> (next, end)
    count = size = 0
    try:
        consumer.assign([TopicPartition(topic, p, start[p]) for p in remaining])
        while remaining:
            left = sum(stop - offset for offset, stop in remaining.values())
            for message in consumer.consume(max(1, min(2000, left)), timeout=0.5):
                if message.error():
                    raise RuntimeError(str(message.error()))
                partition, offset = message.partition(), message.offset()
                bounds = remaining.get(partition)
                if bounds is None or offset >= bounds[1]:
                    continue
                count += 1
                size += len(message.key()) + len(message.value())
                if offset + 1 >= bounds[1]:
                    del remaining[partition]
                else:
                    remaining[partition] = (offset + 1, bounds[1])
    finally:
        consumer.close()
    return count


def restore_sizes(store: KafkaJournalStore, codec: RecordCodec, end: dict[int, int], sizes: list[int],
                  repeats: int) -> None:
    """Print how long a restore's read takes for ``sizes`` records (the last ones of every partition): the fixed
    cost is what a restore that reads a handful of records pays."""
    rows = []
    for size in sizes:
        share = {p: min(end[p], -(-size // len(end))) for p in end}  # ceil(size / partitions) each
        while sum(share.values()) > size:  # trim to exactly ``size``
            p = max(share, key=share.get)
            share[p] -= 1
        start = {p: end[p] - share[p] for p in end}
        timings = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            index = read_recovery_index(store, codec, start, end)
            timings.append(time.perf_counter() - t0)
            if index.records_read != size:
                raise RuntimeError(f"read {index.records_read} records, expected {size}")
        timings.sort()
        rows.append([size, timings[len(timings) // 2] * 1000, timings[0] * 1000, timings[-1] * 1000])
    h.print_table(f"Restore read by size: read_recovery_index of the last N records of {len(end)} partitions "
                  f"(a fresh consumer each, {repeats} times)",
                  ["records", "median ms", "min ms", "max ms"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50k records, one round (~1 min)")
    parser.add_argument("--records", type=int, help="journal records to write (default 200000, --quick 50000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --quick 1)")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of read_recovery_index")
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 100, 1000, 100_000],
                        help="restore sizes for the by-size table (default 0 100 1000 100000)")
    args = parser.parse_args()
    records = args.records or (50_000 if args.quick else 200_000)
    rounds = args.rounds or (1 if args.quick else 3)
    owned = key_group_range(0, 2, MAX_PARALLELISM)

    print(h.machine_note())
    with h.broker() as bootstrap:
        kafka = {"bootstrap.servers": bootstrap}
        topic = f"bench-restore-{uuid.uuid4().hex[:8]}"
        store = KafkaJournalStore(kafka, topic, MAX_PARALLELISM)
        h.CREATED_TOPICS.append(topic)
        codec = RecordCodec(h.SIGNING_KEY.encode(), PRODUCER)
        began = time.monotonic()
        written, size = fill_journal(store, codec, owned, records, keys=max(records // 40, 10))
        start = dict.fromkeys(owned, 0)
        end = store.end_offsets(owned)
        print(f"# wrote {written:,} records ({size / written:.0f} bytes each on average, key and value) to "
              f"partitions {owned.start}-{owned.stop - 1} of {topic} in {time.monotonic() - began:.1f} s", flush=True)
        if sum(end.values()) != written:
            raise RuntimeError(f"end offsets sum to {sum(end.values())}, expected {written}")

        def recovery_index() -> int:
            index = read_recovery_index(store, codec, start, end)
            return index.records_read

        def recovery_keep_none() -> int:
            index = read_recovery_index(store, codec, start, end, keep=lambda *_: False)
            return index.records_read

        readers = {
            "raw consume": lambda: raw_consume(bootstrap, topic, start, end),
            "store.read": lambda: sum(1 for _ in store.read(start, end)),
            "read_recovery_index": recovery_index,
            "read_recovery_index (keep=none)": recovery_keep_none,
        }
        names = list(readers)
        measured: dict[str, list[tuple[int, float]]] = defaultdict(list)
        readers["raw consume"]()  # warm-up: broker page cache, connections
        for round_index in range(rounds):
            for name in names[round_index % len(names):] + names[:round_index % len(names)]:
                t0 = time.perf_counter()
                count = readers[name]()
                seconds = time.perf_counter() - t0
                if count != written:
                    raise RuntimeError(f"{name} read {count} records, expected {written}")
                measured[name].append((count, seconds))
                print(f"# round {round_index + 1} {name:>32}: {count:,} records in {seconds:.2f} s = "
                      f"{count / seconds:,.0f} records/s", flush=True)

        restore_sizes(store, codec, end, [n for n in args.sizes if n <= written], repeats=5 if args.quick else 9)
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            recovery_index()
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
            print("\n# cProfile of one read_recovery_index pass (sorted by own time; profiling slows it down)")
            print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])
        store.close()

    raw = measured["raw consume"]
    raw_count, raw_seconds = map(sum, zip(*raw, strict=True))
    raw_rate = raw_count / raw_seconds
    rows = []
    for name in names:
        results = measured[name]
        count, seconds = sum(c for c, _ in results), sum(s for _, s in results)
        per_round = [(c / s) / (rc / rs) * 100 for (c, s), (rc, rs) in zip(results, raw, strict=True)]
        spread = f"{min(per_round):.0f}..{max(per_round):.0f}" if len(per_round) > 1 else ""
        rows.append([name, count, seconds, count / seconds, f"{count / seconds / raw_rate * 100:.1f}", spread])
    h.print_table(
        f"Restore read: {written:,} journal records in the {len(owned)} partitions of subtask 0 of 2 "
        f"(max parallelism {MAX_PARALLELISM}), {rounds} interleaved round(s), one reader at a time",
        ["reader", "records", "seconds", "records/s", "% of raw", "per-round range (%)"], rows)


if __name__ == "__main__":
    main()
