"""Order restoration: a failure that reverses two upstream instances' interleaving, restoration on vs off.

The job of :mod:`tests.harness.upstreams`: a 2-partition Kafka topic, a source and a pacing
map at parallelism 2 (each instance reads one partition; every key's inputs alternate between them), the
stateful history agent (2 actions, a ``lookup`` and a ``writer`` call per input, each sleeping
``--call-ms``) at parallelism 1, checkpoints every 200 ms with a 500 ms pause. Once a checkpoint has
completed and half the keys have finished a round of both instances' inputs after the latest one, one run
raises and the instances' delays are swapped: the restored attempt receives the replayed inputs in the other
interleaving. Variants, each its own MiniCluster job over an unbounded input, interleaved over rounds:

* ``on``: ``restore_input_order=True`` (the default): inputs that arrive before their recorded
  predecessors wait for them; the recorded history is reused.
* ``off``: ``restore_input_order=False``: inputs run in arrival order; the first input at a journaled seq
  that is not the recorded one diverges, and the key's later recorded work runs again.

Columns: logical calls that ran more than once (``call:<tool>:<key>:<n>`` counted outside Flink), keys whose
replayed inputs arrived in another order than they ran (the harness did reverse them), recovery time
(from the injected failure to the last output of the restored attempt; times taken in the operator), the
time until the restored attempt had caught up (emitted again the output of every input the failed attempt
had received), run time (first input at the agent to last output) and throughput over the run (inputs /
run time). The input is paced (``--period-ms`` per lane position), so recovery and throughput are bounded
by the pacing: compare the variants, not the absolute numbers.

    .venv/bin/python bench/bench_order_restore.py --quick     # one round, ~30 s
    .venv/bin/python bench/bench_order_restore.py             # 3 rounds, ~1.5 minutes
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path

import _harness as h

from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.testing.agents import logical_call_counts
from flink_agents_replay.testing.counter import InvocationCounter
from tests.harness.upstreams import (
    FailOnceAfterCheckpoint,
    JobRecorder,
    UpstreamControl,
    history_agent,
    produce_lane_inputs,
    run_lane_job,
)


@dataclass
class Result:
    inputs: int
    calls: int
    repeated: int
    reordered_keys: int
    recovery_s: float
    caught_up_s: float
    run_s: float


def create_input_topic(bootstrap: str) -> str:
    """A fresh input topic with one partition per upstream instance."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench-lanes-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 2, 1)], request_timeout=30).values():
        future.result(timeout=60)
    h.CREATED_TOPICS.append(topic)
    return topic


def run_variant(bootstrap: str, restore: bool, args: argparse.Namespace, work: Path) -> Result:
    topic = create_input_topic(bootstrap)
    inputs = produce_lane_inputs(bootstrap, topic, args.keys, args.rounds_per_lane)
    counter = InvocationCounter(work / "calls.sqlite")
    recorder = JobRecorder(work / "job.sqlite")
    control = UpstreamControl(work / "control.json", period_ms=args.period_ms, keys=args.keys)
    fault = FailOnceAfterCheckpoint(counter, recorder, control, keys=max(1, args.keys // 2))
    agent = history_agent(counter, name=f"order{'on' if restore else 'off'}", call_delay_s=args.call_ms / 1000,
                          fault=fault)
    config = h.agent_config(bootstrap, restore_input_order=restore, max_concurrent_runs=2 * args.keys)
    h.prepare_journal_topic(config)
    outputs = run_lane_job(bootstrap, topic, agent, config, recorder, control, until_outputs=len(inputs),
                           timeout_s=300)
    if len(outputs) != len(inputs) or not counter.count("fault_fired"):
        raise RuntimeError(f"{len(outputs)} outputs for {len(inputs)} inputs, failure injected: "
                           f"{bool(counter.count('fault_fired'))}")
    record = recorder.read()
    fault_row = next(f for f in record.faults if f.name == "first")
    restored = min(a for a in record.attempts() if a > fault_row.attempt)
    calls = logical_call_counts(counter)
    last_output = max(o.t for o in record.outputs)
    # Caught up: the restored attempt emitted again the output of every input the failed attempt had received.
    received = {(a.key, a.n) for a in record.arrivals if a.attempt == fault_row.attempt}
    again = [o.t for o in record.outputs if o.attempt >= restored and (o.key, o.n) in received]
    return Result(inputs=len(inputs), calls=sum(calls.values()), repeated=sum(n - 1 for n in calls.values() if n > 1),
                  reordered_keys=len(record.reordered(restored)), recovery_s=last_output - fault_row.t,
                  caught_up_s=max(again, default=fault_row.t) - fault_row.t, run_s=last_output - record.arrivals[0].t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round (~30 s)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --quick 1)")
    parser.add_argument("--keys", type=int, default=8, help="keys (default 8)")
    parser.add_argument("--rounds-per-lane", type=int, default=10,
                        help="inputs per key and upstream instance (default 10: 2 * keys * 10 inputs)")
    parser.add_argument("--period-ms", type=float, default=40.0,
                        help="pacing: one lane position per period (default 40 ms; a key gets an input every "
                             "keys * period / 2)")
    parser.add_argument("--call-ms", type=float, default=20.0, help="time of each tool call (default 20 ms)")
    args = parser.parse_args()
    if "restore_input_order" not in {f.name for f in fields(AgentConfig)}:
        sys.exit("this build of flink_agents_replay has no order restoration (AgentConfig.restore_input_order)")
    rounds = args.rounds or (1 if args.quick else 3)

    print(h.machine_note())
    print(f"# {rounds} round(s), {args.keys} keys x {2 * args.rounds_per_lane} inputs, lane period "
          f"{args.period_ms:g} ms (an input per key every {args.keys * args.period_ms / 2:g} ms), calls of "
          f"{args.call_ms:g} ms", flush=True)
    measured: dict[bool, list[Result]] = defaultdict(list)
    variants = [True, False]
    began = time.monotonic()
    with h.broker() as bootstrap, tempfile.TemporaryDirectory(prefix="far-bench-order-") as scratch:
        for round_index in range(rounds):
            for restore in variants[round_index % 2:] + variants[:round_index % 2]:
                work = Path(scratch) / f"round{round_index}-{'on' if restore else 'off'}"
                work.mkdir()
                result = run_variant(bootstrap, restore, args, work)
                measured[restore].append(result)
                print(f"# round {round_index + 1} order restoration {'on ' if restore else 'off'}: "
                      f"{result.repeated} repeated calls of {result.calls}, {result.reordered_keys} keys reordered, "
                      f"recovery {result.recovery_s:.2f} s (caught up {result.caught_up_s:.2f} s), "
                      f"run {result.run_s:.2f} s = "
                      f"{result.inputs / result.run_s:.1f} inputs/s [{time.monotonic() - began:.0f} s, "
                      f"load {h.load1():.1f}]", flush=True)

    rows = []
    for restore in variants:
        results = measured[restore]
        inputs = sum(r.inputs for r in results)
        run_s = sum(r.run_s for r in results)
        recovery = [r.recovery_s for r in results]
        spread = f"{min(recovery):.2f}..{max(recovery):.2f}" if len(recovery) > 1 else ""
        rows.append(["on" if restore else "off", inputs, sum(r.calls for r in results),
                     sum(r.repeated for r in results), sum(r.reordered_keys for r in results),
                     sum(recovery) / len(recovery), spread, sum(r.caught_up_s for r in results) / len(results),
                     run_s / len(results), inputs / run_s])
    h.print_table(
        f"Order restoration after a failure that reverses two upstream instances' interleaving: {rounds} interleaved "
        f"round(s), {args.keys} keys, {args.call_ms:g} ms calls",
        ["order restoration", "inputs", "calls", "repeated calls", "keys reordered", "recovery s", "recovery range",
         "caught up s", "run s", "inputs/s"], rows)
    print("recovery = injected failure -> last output of the restored attempt (includes the rest of the paced input); "
          "caught up = injected failure -> the restored attempt emitted again the output of every input the failed "
          "attempt had received; run = first input at the agent -> last output; repeated calls = logical calls "
          "(tool, key, input) that ran more than once; keys reordered = keys "
          "whose replayed inputs arrived in another order than they ran before the failure")


if __name__ == "__main__":
    main()
