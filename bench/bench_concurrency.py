"""Concurrent runs: throughput with 200 ms calls at max_concurrent_runs = 1, 8, 32 on one subtask (any other
concurrency and call time by option: ``--concurrency 128 1000 --call-ms 1000``).

One subtask (parallelism 1), an agent of 1 action with 1 call that sleeps 200 ms (``--call-ms``), twice as
many keys as run slots (at least 16) so every slot has work. The ideal is ``concurrency / call time``: every
slot busy with a call all the time. Each point is its own MiniCluster job over an *unbounded* Kafka input,
measured from the end of the first wave of runs to the last output (start-up excluded); points run back
to back in one process, interleaved over rounds. The journal is on (``per_run``, the default) unless
``--journal off``; ``--journal both`` measures both side by side.

    .venv/bin/python bench/bench_concurrency.py --quick     # journal on, one round, ~2 minutes
    .venv/bin/python bench/bench_concurrency.py             # journal on and off, 2 rounds, ~5 minutes
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import _harness as h

#: The variant whose keys poll for their runs every poll_interval_ms (the operator before completion wake-ups).
POLLING = "per_run, polling"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="journal on only, one short round (~2 min)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2, --quick 1)")
    parser.add_argument("--seconds", type=float, help="measured seconds per job at the ideal rate "
                                                      "(default 8, --quick 4)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="max_concurrent_runs values")
    parser.add_argument("--call-ms", type=float, default=200.0, help="call time (default 200 ms)")
    parser.add_argument("--journal", choices=["on", "off", "both"], help="default: both; --quick: on")
    parser.add_argument("--polling", action="store_true",
                        help="also measure per_run with every key polling for its run (wake_on_completion=False) "
                             "instead of being woken by it")
    parser.add_argument("--poll-interval-ms", type=int, default=5,
                        help="operator poll_interval_ms of the polling variant (default 5)")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000, help="checkpoint interval (default 1000)")
    parser.add_argument("--work-us", type=float, default=0.0,
                        help="Python CPU per run in the action, an agent's own code (default 0)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    target_s = args.seconds or (4.0 if args.quick else 8.0)
    journal = args.journal or ("on" if args.quick else "both")
    modes = {"on": ["per_run"], "off": ["off"], "both": ["per_run", "off"]}[journal]
    if args.polling:
        modes.insert(1, POLLING)
    call_s = args.call_ms / 1000

    print(h.machine_note())
    print(f"# {rounds} round(s), {args.call_ms:g} ms calls, {args.work_us:g} us of Python per run, poll "
          f"{args.poll_interval_ms} ms, checkpoints every {args.checkpoint_interval_ms} ms, ~{target_s:g} s per job "
          "at the ideal rate", flush=True)
    measured: dict[tuple[str, int], list[h.JobResult]] = defaultdict(list)
    began = time.monotonic()
    with h.broker() as bootstrap:
        h.warm_up_broker(bootstrap, 15 if args.quick else 30)
        warm = h.produce_bench_inputs(bootstrap, 16, 100)
        h.timed_agent_job(bootstrap, warm, h.bench_agent("warmup", call_delay_s=0.0, actions=1),
                          h.agent_config(bootstrap), 100, checkpoint_interval_ms=args.checkpoint_interval_ms)
        print(f"# warm-up job done at {time.monotonic() - began:.0f} s", flush=True)
        points = [(mode, c) for c in args.concurrency for mode in modes]
        for round_index in range(rounds):
            order = points[round_index % len(points):] + points[:round_index % len(points)]
            for mode, concurrency in order:
                ideal = concurrency / call_s
                keys = max(2 * concurrency, 16)
                # at least two waves of every key, so the measured span is not one wave's start-to-end
                runs = max(int(target_s * ideal), 2 * keys, 20)
                topic = h.produce_bench_inputs(bootstrap, keys, runs)
                agent = h.bench_agent(f"concurrency{round_index}", call_delay_s=call_s, actions=1,
                                      work_us=args.work_us)
                config = h.agent_config(bootstrap, journal_enabled=mode != "off", max_concurrent_runs=concurrency,
                                        poll_interval_ms=args.poll_interval_ms, wake_on_completion=mode != POLLING)
                result = h.timed_agent_job(bootstrap, topic, agent, config, runs,
                                           checkpoint_interval_ms=args.checkpoint_interval_ms)
                measured[(mode, concurrency)].append(result)
                print(f"# round {round_index + 1} {mode:>22} concurrency {concurrency:3d}: "
                      f"{result.runs:5d} runs in {result.seconds:6.2f} s = {result.runs / result.seconds:6.1f} runs/s "
                      f"({result.runs / result.seconds / ideal * 100:.0f} % of ideal), Flink CPU "
                      f"{result.flink_cpu_s / result.seconds * 100:.0f} % of a core "
                      f"[{time.monotonic() - began:.0f} s, load {h.load1():.1f}]", flush=True)

    rows = []
    smallest = min(args.concurrency)
    for mode, concurrency in points:
        results = measured[(mode, concurrency)]
        runs, seconds = sum(r.runs for r in results), sum(r.seconds for r in results)
        ideal = concurrency / call_s
        per_round = [r.runs / r.seconds / ideal * 100 for r in results]
        spread = f"{min(per_round):.0f}..{max(per_round):.0f}" if len(per_round) > 1 else ""
        flink_cpu = sum(r.flink_cpu_s for r in results)
        rss = max(r.flink_rss_mb for r in results)
        base_rss = max(r.flink_rss_mb for r in measured[(mode, smallest)])
        per_run_kib = (f"{(rss - base_rss) * 1024 / (concurrency - smallest):.0f}" if concurrency > smallest
                       else "-")
        rows.append([mode, concurrency, runs, seconds, runs / seconds, ideal,
                     f"{runs / seconds / ideal * 100:.1f}", spread, flink_cpu / runs * 1000,
                     f"{flink_cpu / seconds * 100:.0f}", f"{rss:.0f}", per_run_kib])
    h.print_table(
        f"Concurrent runs: 1 subtask, 1 action x 1 call of {args.call_ms:g} ms per run, {rounds} interleaved round(s)",
        ["variant", "concurrency", "runs", "seconds", "runs/s", "ideal runs/s", "% of ideal", "per-round range (%)",
         "Flink CPU ms/run", "Flink CPU (% of a core)", "Flink RSS MiB", "KiB per run in flight"],
        rows)
    print(f"ideal = concurrency / {call_s:g} s (every slot always inside a call); Flink CPU = CPU time of the "
          "Flink JVM (task thread, embedded Python, agent threads) between the first and the last output")
    print(f"RSS = the Flink JVM's peak resident memory in the window (heap included); per run in flight = its growth "
          f"over the concurrency-{smallest} point of the same variant, per added run")


if __name__ == "__main__":
    main()
