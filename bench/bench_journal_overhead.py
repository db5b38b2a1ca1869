"""Journal overhead: throughput of one agent with the journal off vs on, in each durability mode.

One subtask (parallelism 1), ``max_concurrent_runs`` 8 (the default), an agent of 2 chained actions with
1 call each (2 call records + 2 completion records per run), calls of 0 ms and 20 ms. Each variant is
its own MiniCluster job over an *unbounded* Kafka input, stopped after the last output; throughput is
measured from the end of the first wave of runs (the 8th output) to the last output (job start-up
excluded), from emission times taken inside the job. Variants run back to back in one process,
interleaved over rounds (the order rotates), and the overhead is the throughput lost against the
journal-off job of the same call time: ``1 - runs/s / journal-off runs/s``.

Extra variants ``+linger0`` pass ``linger.ms=0`` to the journal's Kafka producer (through the ``kafka``
settings): librdkafka's default ``linger.ms`` of 5 ms delays every acknowledged journal write.

    .venv/bin/python bench/bench_journal_overhead.py --quick     # one round, ~2 minutes
    .venv/bin/python bench/bench_journal_overhead.py             # 2 rounds, ~7 minutes
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import _harness as h

# name -> config overrides
VARIANTS = {
    "journal off": {"journal_enabled": False},
    "per_call": {"durability": "per_call"},
    "per_action": {"durability": "per_action"},
    "per_bundle": {"durability": "per_bundle"},
}
LINGER0_VARIANTS = {
    "per_action+linger0": {"durability": "per_action", "linger.ms": 0},
    "per_bundle+linger0": {"durability": "per_bundle", "linger.ms": 0},
}
# rough throughput of a durability mode relative to journal-off, to size the first job of a variant
_GUESS = {"per_call": 0.3, "per_action": 0.4, "per_bundle": 0.6}


def _config(bootstrap: str, overrides: dict, concurrency: int, poll_interval_ms: int) -> dict:
    overrides = dict(overrides)
    kafka_extra = {k: overrides.pop(k) for k in list(overrides) if "." in k}
    config = h.agent_config(bootstrap, max_concurrent_runs=concurrency, poll_interval_ms=poll_interval_ms,
                            **overrides)
    config["kafka"] = {**config["kafka"], **kafka_extra}
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round, no linger.ms=0 variants (~2 min)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2, --quick 1)")
    parser.add_argument("--seconds", type=float, help="target measured seconds per job (default 6, --quick 2.5)")
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 20.0], help="call times (ms)")
    parser.add_argument("--concurrency", type=int, default=8, help="max_concurrent_runs (default 8)")
    parser.add_argument("--keys", type=int, default=32, help="distinct keys in the input (default 32)")
    parser.add_argument("--poll-interval-ms", type=int, default=5, help="operator poll_interval_ms (default 5)")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000, help="checkpoint interval (default 1000)")
    parser.add_argument("--no-linger0", action="store_true", help="skip the linger.ms=0 variants")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    target_s = args.seconds or (2.5 if args.quick else 6.0)
    variants = dict(VARIANTS)
    if not (args.quick or args.no_linger0):
        variants.update(LINGER0_VARIANTS)

    print(h.machine_note())
    print(f"# {rounds} round(s), concurrency {args.concurrency}, {args.keys} keys, poll {args.poll_interval_ms} ms, "
          f"checkpoints every {args.checkpoint_interval_ms} ms, ~{target_s:g} s measured per job", flush=True)
    measured: dict[tuple[str, float], list[h.JobResult]] = defaultdict(list)
    began = time.monotonic()
    with h.broker() as bootstrap:
        warm = h.produce_bench_inputs(bootstrap, args.keys, 100)
        h.timed_agent_job(bootstrap, warm, h.bench_agent("warmup", call_delay_s=0.0),
                          _config(bootstrap, {}, args.concurrency, args.poll_interval_ms), 100,
                          checkpoint_interval_ms=args.checkpoint_interval_ms)
        print(f"# warm-up job done at {time.monotonic() - began:.0f} s", flush=True)
        names = list(variants)
        for round_index in range(rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for delay_ms in args.delays_ms:
                for name in order:
                    previous = measured[(name, delay_ms)]
                    if previous:
                        runs = int(target_s * sum(r.runs for r in previous) / sum(r.seconds for r in previous))
                    else:  # first job of this variant: a rough guess (later rounds use the measured rate)
                        ideal = 600 if delay_ms == 0 else args.concurrency * 1000 / (2 * delay_ms + 5)
                        runs = int(target_s * ideal * _GUESS.get(variants[name].get("durability"), 1.0))
                    runs = max(runs, 60)
                    topic = h.produce_bench_inputs(bootstrap, args.keys, runs)
                    agent = h.bench_agent(f"overhead{round_index}", call_delay_s=delay_ms / 1000)
                    config = _config(bootstrap, variants[name], args.concurrency, args.poll_interval_ms)
                    result = h.timed_agent_job(bootstrap, topic, agent, config, runs,
                                               checkpoint_interval_ms=args.checkpoint_interval_ms)
                    measured[(name, delay_ms)].append(result)
                    print(f"# round {round_index + 1} {name:>20} {delay_ms:4g} ms: {result.runs:5d} runs in "
                          f"{result.seconds:6.2f} s = {result.runs / result.seconds:7.1f} runs/s, CPU/run: Flink "
                          f"{result.flink_cpu_s / result.runs * 1000:.2f} ms, broker "
                          f"{result.broker_cpu_s / result.runs * 1000:.2f} ms "
                          f"[{time.monotonic() - began:.0f} s, load {h.load1():.1f}]", flush=True)

    rows = []
    for delay_ms in args.delays_ms:
        base = measured[("journal off", delay_ms)]
        base_rate = sum(r.runs for r in base) / sum(r.seconds for r in base)
        for name in names:
            results = measured[(name, delay_ms)]
            runs, seconds = sum(r.runs for r in results), sum(r.seconds for r in results)
            overhead = (1 - (runs / seconds) / base_rate) * 100
            per_round = [(1 - (r.runs / r.seconds) / (b.runs / b.seconds)) * 100
                         for r, b in zip(results, base, strict=True)]
            spread = (f"{min(per_round):.0f}..{max(per_round):.0f}" if len(per_round) > 1 and name != "journal off"
                      else "")
            flink_cpu = sum(r.flink_cpu_s for r in results) / runs * 1000
            broker_cpu = sum(r.broker_cpu_s for r in results) / runs * 1000
            rows.append([name, delay_ms, runs, seconds, runs / seconds,
                         "-" if name == "journal off" else f"{overhead:.1f}", spread, flink_cpu, broker_cpu])
    h.print_table(
        f"Journal overhead: 1 subtask, max_concurrent_runs={args.concurrency}, 2 actions x 1 call per run, "
        f"{rounds} interleaved round(s)",
        ["variant", "call ms", "runs", "seconds", "runs/s", "overhead vs journal-off (%)", "per-round range (%)",
         "Flink CPU ms/run", "broker CPU ms/run"],
        rows)
    print("overhead = throughput lost against the journal-off job of the same call time: 1 - runs/s / off runs/s")
    print("CPU ms/run = CPU time of the process between the first and the last output, per run (2 cores in all)")


if __name__ == "__main__":
    main()
