"""What the fence check costs an external call: a real broker, the engine, no Flink.

Since issue 36 an attempt makes no ``external`` call once a newer attempt of its task started elsewhere: after the
call's *started* record is acknowledged, and before the call is made, it asks the broker for the end of the
journal's fence topic (one ListOffsets round trip; concurrent checks share one) and reads what is new there
(``storage/journal/fence_watch.py``, docs/design.md §5.3). This measures the price side by side, on the journal's
own store against a local broker: a run is one ``external`` call taking ``--call-ms``, then its outcome record.
``--threads`` threads (1 and 8 by default, like ``max_concurrent_runs``) run runs for their own keys; the variants
alternate over rounds (the order rotates):

* ``check`` — as built (the writer has a fence watch, announced like an attempt's start);
* ``off`` — the same writer without one (the behaviour before).

Per variant: runs/s, run latency p50/p99 (ms), and for ``check`` the mean time a check took (ms) and the
ListOffsets round trips per check (below 1: checks shared a query).

    .venv/bin/python bench/bench_fence_check.py            # 5 rounds x (1, 8 threads) x (0, 20 ms calls), ~3 min
    .venv/bin/python bench/bench_fence_check.py --quick    # 1 round, 8 threads, 0 ms
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from typing import Any

import _harness as h

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.journal.attempts import write_attempt_records
from flink_agents_replay.storage.journal.fence_watch import FenceWatch, fence_topic_of
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec

PARTITIONS = 128


def external_call_agent(call_s: float) -> Agent:
    """One external call per run (its started record acknowledged, then the fence check, then the call)."""

    def charge(order: str) -> str:
        if call_s:
            time.sleep(call_s)
        return f"charged {order}"

    class Charges(Agent):
        @action(InputEvent)
        def charge(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("charge", event.input)))

    return Charges(name="fence-check", resources={"charge": Tool(charge, side_effects="external")})


class _TimedWatch:
    """The watch's check, timed (the wrapper adds a few microseconds to the ``check`` variant only)."""

    def __init__(self, watch: FenceWatch):
        self.watch = watch
        self.spent = 0.0
        self.count = 0
        self._lock = threading.Lock()
        self._check = watch.check

    def check(self, partition: int, what: str = "an external call") -> None:
        began = time.perf_counter()
        try:
            self._check(partition, what)
        finally:
            spent = time.perf_counter() - began
            with self._lock:
                self.spent += spent
                self.count += 1


def measure(writer: JournalWriter, timed: _TimedWatch | None, call_s: float, runs: int, threads: int
            ) -> dict[str, float]:
    agent = external_call_agent(call_s)
    latencies: list[float] = []
    queries_before = timed.watch.queries if timed is not None else 0
    if timed is not None:
        timed.spent, timed.count = 0.0, 0
    began = time.perf_counter()
    workers = [threading.Thread(target=_runs, args=(agent, writer, index, runs // threads, latencies))
               for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    latencies.sort()
    result = {"runs/s": len(latencies) / elapsed, "p50": h.percentile(latencies, 0.5) * 1e3,
              "p99": h.percentile(latencies, 0.99) * 1e3}
    if timed is not None and timed.count:
        result["check"] = timed.spent / timed.count * 1e3
        result["queries/check"] = (timed.watch.queries - queries_before) / timed.count
    return result


_seqs: dict[str, int] = {}
_seq_lock = threading.Lock()


def _runs(agent: Agent, writer: JournalWriter, index: int, count: int, latencies: list[float]) -> None:
    for n in range(count):
        key, group = f"t{index}-{n % 4}", index * 16 + n % 4
        with _seq_lock:
            seq = _seqs[key] = _seqs.get(key, 0) + 1
        began = time.perf_counter()
        execute_run(agent, RunInput(key, group, seq, f"O-{index}{n:05d}"), {}, journal=writer.run_journal(group))
        latencies.append(time.perf_counter() - began)


def measure_start(settings: dict, topic: str, *, fenced: bool) -> float:
    """A start's acknowledged records with new clients (what an attempt's start waits for), in ms: its fence record
    then its attempt records, or the attempt records alone."""
    store = KafkaJournalStore(settings, topic, PARTITIONS)
    watch = FenceWatch(settings, topic, journal_store=store) if fenced else None
    writer = JournalWriter(store, RecordCodec(h.SIGNING_KEY.encode(), "fence-check"), Durability.PER_RUN,
                           fence_watch=watch)
    try:
        began = time.perf_counter()
        write_attempt_records(writer, range(PARTITIONS), "bench-start", 0, 0)
        return (time.perf_counter() - began) * 1e3
    finally:
        if watch is not None:
            watch.close()
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, 8 threads, 0 ms calls")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=100, help="runs per thread, round and variant (at least 200)")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--call-ms", type=float, nargs="*", default=[0.0, 20.0])
    options = parser.parse_args()
    rounds, delays, thread_counts = ((1, [0.0], [8]) if options.quick
                                     else (options.rounds, options.call_ms, options.threads))
    print(h.machine_note())
    with h.broker() as bootstrap:
        h.warm_up_broker(bootstrap, 20)
        topic = f"bench-fence-check-{uuid.uuid4().hex[:8]}"
        h.CREATED_TOPICS += [topic, fence_topic_of(topic)]
        settings = {"bootstrap.servers": bootstrap}
        store = KafkaJournalStore(settings, topic, PARTITIONS)
        watch = FenceWatch(settings, topic, journal_store=store)
        codec = RecordCodec(h.SIGNING_KEY.encode(), "fence-check")
        checked = JournalWriter(store, codec, Durability.PER_RUN, fence_watch=watch)
        started = time.perf_counter()
        write_attempt_records(checked, range(PARTITIONS), "bench", 0, 0)  # announces the fence, then the markers
        start_ms = (time.perf_counter() - started) * 1e3
        timed = _TimedWatch(watch)
        watch.check = timed.check  # type: ignore[method-assign]
        unchecked = JournalWriter(store, codec, Durability.PER_RUN)
        unchecked.begin_attempt(checked.fences)
        rows = []
        for threads in thread_counts:
            for call_ms in delays:
                results: dict[str, list[dict[str, float]]] = {"check": [], "off": []}
                for round_index in range(rounds):
                    order = list(results) if round_index % 2 == 0 else list(reversed(results))
                    for variant in order:
                        writer, timing = (checked, timed) if variant == "check" else (unchecked, None)
                        results[variant].append(measure(writer, timing, call_ms / 1e3,
                                                                        max(200, options.runs * threads), threads))
                rows += [_row(threads, call_ms, variant, measured) for variant, measured in results.items()]
                rows.append([threads, call_ms, "check / off", _ratio(results, "runs/s"), _ratio(results, "p50"),
                             _ratio(results, "p99"), f"+{_added(results, 'p50'):.2f} ms p50", ""])
        watch.close()
        store.close()
        starts: dict[str, list[float]] = {"check": [], "off": []}
        for round_index in range(rounds):
            for variant in (list(starts) if round_index % 2 == 0 else list(reversed(starts))):
                starts[variant].append(measure_start(settings, topic, fenced=variant == "check"))
    print(f"\nfirst start (new clients): {start_ms:.0f} ms")
    h.print_table(f"a start's acknowledged records for {PARTITIONS} partitions with new clients, ms (a new producer's "
                  "first write included)", ["variant", "median", "per round"],
                  [[variant, f"{_median(values):.0f}", ", ".join(f"{v:.0f}" for v in values)]
                   for variant, values in starts.items()])
    h.print_table(f"one external call per run, per_run, {rounds} rounds (medians)",
                  ["threads", "call ms", "variant", "runs/s", "p50 ms", "p99 ms", "check ms", "queries/check"], rows)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _row(threads: int, call_ms: float, variant: str, measured: list[dict[str, float]]) -> list[Any]:
    cells = [f"{_median([m[name] for m in measured]):.{digits}f}" for name, digits in
             (("runs/s", 0), ("p50", 2), ("p99", 2))]
    extra = [f"{_median([m[name] for m in measured]):.{digits}f}" if name in measured[0] else "-"
             for name, digits in (("check", 2), ("queries/check", 2))]
    return [threads, call_ms, variant, *cells, *extra]


def _ratio(results: dict[str, list[dict[str, float]]], name: str) -> str:
    return f"{_median([m[name] for m in results['check']]) / _median([m[name] for m in results['off']]):.2f}x"


def _added(results: dict[str, list[dict[str, float]]], name: str) -> float:
    return _median([m[name] for m in results["check"]]) - _median([m[name] for m in results["off"]])


if __name__ == "__main__":
    main()
