"""Python CPU per journal record, in one process: no Flink, no broker.

The Flink-side CPU per journaled record (``bench_journal_overhead.py``) is this cost plus what the job adds
around it (the Kafka producer's thread and delivery callbacks, wake-ups, the Java operator). This script
isolates the part in Python's engine, so a change to records or to the engine can be measured side by side
in seconds:

* **encode**: ``RecordCodec.encode`` of each record kind a run writes, with the payloads the benchmark
  agent really produces (captured from one run): schema to plain data, user values pickled, msgpack,
  header, HMAC-SHA256. Min over repeats of ``timeit``.
* **engine**: ``execute_run`` of the benchmark agent (2 actions x 1 call, 0 ms calls, ~200-byte results)
  over an in-memory journal store, journal off against on (``per_run``), and on with encoding replaced by
  constant bytes: the difference is what journaling costs per record, and how much of it is encoding.
  Process CPU time, min over rounds, interleaved.

``--profile`` adds a cProfile of journaled runs (top functions by own time).

    .venv/bin/python bench/bench_record_cost.py            # ~20 s
    .venv/bin/python bench/bench_record_cost.py --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
import timeit

import _harness as h

from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.writer import JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec

RECORDS_PER_RUN = 5  # accepted, and per action one call and one completion
KEYS = 32


class _Setup:
    """The benchmark agent, a codec and a writer over an in-memory store of 128 partitions."""

    def __init__(self) -> None:
        self.agent = h.bench_agent("record-cost", call_delay_s=0.0)
        self.codec = RecordCodec(h.SIGNING_KEY.encode(), "record-cost")
        self.writer = JournalWriter(MemoryJournalStore(128), self.codec, "per_run")
        self.seq = 0

    def runs(self, count: int, *, journal: bool) -> None:
        for _ in range(count):
            self.seq += 1
            key = f"k{self.seq % KEYS}"
            run_journal = self.writer.run_journal(self.seq % 128) if journal else None
            execute_run(self.agent, RunInput(key, 5, self.seq, {"key": key, "n": self.seq}), {},
                        journal=run_journal, acknowledge=False)

    def captured_records(self) -> dict[str, tuple]:
        """One run's ``encode`` arguments per record kind."""
        captured: dict[str, tuple] = {}
        encode = self.codec.encode

        def capture(record_key, kind, payload, **options):
            captured[getattr(kind, "value", kind)] = (record_key, kind, payload, options)
            return encode(record_key, kind, payload, **options)

        self.codec.encode = capture
        try:
            self.runs(1, journal=True)
        finally:
            self.codec.encode = encode
        return captured


def encode_rows(setup: _Setup, repeats: int) -> list[list]:
    rows = []
    for kind, (record_key, record_kind, payload, options) in setup.captured_records().items():
        def encode(record_key=record_key, record_kind=record_kind, payload=payload, options=options):
            return setup.codec.encode(record_key, record_kind, payload, **options)

        seconds = min(timeit.repeat(encode, number=2000, repeat=repeats)) / 2000
        rows.append([kind, len(encode()), f"{seconds * 1e6:.1f}"])
    return rows


def engine_row(setup: _Setup, rounds: int, runs: int) -> list:
    best = {"off": float("inf"), "on": float("inf"), "on, encoding stubbed": float("inf")}
    encode = setup.codec.encode
    for _ in range(rounds):
        for variant in best:
            if variant == "on, encoding stubbed":
                setup.codec.encode = lambda *_args, **_options: b"x" * 300
            began = time.process_time()
            setup.runs(runs, journal=variant != "off")
            best[variant] = min(best[variant], (time.process_time() - began) / runs * 1e6)
            setup.codec.encode = encode
    per_record = (best["on"] - best["off"]) / RECORDS_PER_RUN
    outside_encoding = (best["on, encoding stubbed"] - best["off"]) / RECORDS_PER_RUN
    return [f"{best['off']:.0f}", f"{best['on']:.0f}", f"{per_record:.1f}", f"{per_record - outside_encoding:.1f}",
            f"{outside_encoding:.1f}"]


def profile(setup: _Setup, runs: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    setup.runs(runs, journal=True)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds (and timeit repeats); the minimum counts")
    parser.add_argument("--runs", type=int, default=500, help="runs per round and variant")
    parser.add_argument("--profile", action="store_true", help="add a cProfile of journaled runs")
    options = parser.parse_args()
    print(h.machine_note())
    setup = _Setup()
    setup.runs(200, journal=True)  # warm caches (lru caches, the agent's first call)
    h.print_table("Encode one record (RecordCodec.encode, the benchmark agent's payloads)",
                  ["kind", "bytes", "us"], encode_rows(setup, options.rounds))
    h.print_table(f"Engine per run (execute_run, in-memory store, {RECORDS_PER_RUN} records per run, process CPU)",
                  ["off us/run", "on us/run", "us/record", "of which encoding", "outside encoding"],
                  [engine_row(setup, options.rounds, options.runs)])
    if options.profile:
        print(profile(setup, options.runs * 4))


if __name__ == "__main__":
    main()
