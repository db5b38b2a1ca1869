"""What the wait for an external call's outcome costs a tool loop: a real broker, the engine, no Flink.

Since 0.5.1 a run makes no call while an earlier external call's outcome record is unacknowledged
(``RunJournal.before_call``): a tool loop's next model turn waits for the tool's *returned* record, so a crash
during that turn never makes the tool again. This measures the price side by side, on the journal's own store
against a local broker: a run is one tool-loop step, an ``external`` tool (its *started* record acknowledged
first, as always) then a model turn without side effects, each taking ``--call-ms``. ``8`` threads run
runs for their own keys, like ``max_concurrent_runs``; variants alternate over rounds:

* ``wait`` — as built;
* ``no wait`` — ``before_call`` switched off (0.5.0's behaviour).

Per variant: runs/s, run latency p50/p99 (ms) and the mean time the model turn waited before it began (ms).

    .venv/bin/python bench/bench_external_outcome_wait.py            # 3 rounds x (0 and 20 ms calls), ~2 min
    .venv/bin/python bench/bench_external_outcome_wait.py --quick    # 1 round, 0 ms
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
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter, RunJournal
from flink_agents_replay.storage.records.codec import RecordCodec

THREADS = 8
PARTITIONS = 128


def loop_step_agent(call_s: float, turn_waits: list[float]) -> Agent:
    """One tool-loop step: an external tool, then a model turn that notes how long after the tool it began."""
    tool_done = threading.local()

    def find_order(order: str) -> dict:
        time.sleep(call_s)
        tool_done.at = time.perf_counter()
        return {"order": order, "status": "in transit"}

    def model(found: dict) -> str:
        turn_waits.append(time.perf_counter() - tool_done.at)
        time.sleep(call_s)
        return f"your order {found['order']} is {found['status']}"

    class LoopStep(Agent):
        @action(InputEvent)
        def step(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("llm", ctx.call("find_order", event.input))))

    return LoopStep(name="outcome-wait", resources={"find_order": Tool(find_order, side_effects="external"),
                                                    "llm": Tool(model, side_effects="none")})


def measure(writer: JournalWriter, call_s: float, runs: int, *, wait: bool) -> dict[str, float]:
    turn_waits: list[float] = []
    agent = loop_step_agent(call_s, turn_waits)
    latencies: list[float] = []
    original = RunJournal.before_call
    if not wait:
        RunJournal.before_call = lambda self: None
    try:
        began = time.perf_counter()
        threads = [threading.Thread(target=_runs, args=(agent, writer, index, runs // THREADS, latencies))
                   for index in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
    finally:
        RunJournal.before_call = original
    latencies.sort()
    return {"runs/s": len(latencies) / elapsed, "p50": h.percentile(latencies, 0.5) * 1e3,
            "p99": h.percentile(latencies, 0.99) * 1e3, "turn wait": sum(turn_waits) / len(turn_waits) * 1e3}


def _runs(agent: Agent, writer: JournalWriter, index: int, count: int, latencies: list[float]) -> None:
    for n in range(count):
        key = f"t{index}-{n % 4}"
        began = time.perf_counter()
        execute_run(agent, RunInput(key, index * 16 + n % 4, n + 1, f"O-{index}{n:05d}"), {},
                    journal=writer.run_journal(index * 16 + n % 4))
        latencies.append(time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, 0 ms calls")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=800, help="runs per round and variant")
    parser.add_argument("--call-ms", type=float, nargs="*", default=[0.0, 20.0])
    options = parser.parse_args()
    rounds, delays = (1, [0.0]) if options.quick else (options.rounds, options.call_ms)
    print(h.machine_note())
    with h.broker() as bootstrap:
        h.warm_up_broker(bootstrap, 20)
        topic = f"bench-outcome-wait-{uuid.uuid4().hex[:8]}"
        h.CREATED_TOPICS.append(topic)
        store = KafkaJournalStore({"bootstrap.servers": bootstrap}, topic, PARTITIONS)
        writer = JournalWriter(store, RecordCodec(h.SIGNING_KEY.encode(), "outcome-wait"), Durability.PER_RUN)
        rows = []
        for call_ms in delays:
            results: dict[str, list[dict[str, float]]] = {"wait": [], "no wait": []}
            for round_index in range(rounds):
                order = list(results) if round_index % 2 == 0 else list(reversed(results))
                for variant in order:
                    results[variant].append(measure(writer, call_ms / 1e3, options.runs, wait=variant == "wait"))
            rows += [_row(call_ms, variant, measured) for variant, measured in results.items()]
            rows.append([call_ms, "wait / no wait", _ratio(results, "runs/s"), _ratio(results, "p50"),
                         _ratio(results, "p99"), ""])
        store.close()
    h.print_table(f"one tool-loop step per run (external tool, then a model turn), {THREADS} threads, per_run",
                  ["call ms", "variant", "runs/s", "p50 ms", "p99 ms", "turn waited ms"], rows)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _row(call_ms: float, variant: str, measured: list[dict[str, float]]) -> list[Any]:
    return [call_ms, variant, *(f"{_median([m[name] for m in measured]):.{digits}f}"
                                for name, digits in (("runs/s", 0), ("p50", 2), ("p99", 2), ("turn wait", 2)))]


def _ratio(results: dict[str, list[dict[str, float]]], name: str) -> str:
    return f"{_median([m[name] for m in results['wait']]) / _median([m[name] for m in results['no wait']]):.2f}x"


if __name__ == "__main__":
    main()
