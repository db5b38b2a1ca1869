"""Journal overhead: throughput of one agent with the journal off vs on, in each durability mode.

One subtask (parallelism 1), ``max_concurrent_runs`` 8 (the default), an agent of 2 chained actions with
1 call each (2 call records + 2 completion records per run, plus the accepted record: 5), calls of 0, 20
and 200 ms. Each variant is its own MiniCluster job over an *unbounded* Kafka input, stopped after the last
output; throughput is measured from the end of the first wave of runs (the 8th output) to the last output
(job start-up excluded), from emission times taken inside the job. Variants run back to back in one
process, interleaved over rounds (the order rotates), and the overhead is the throughput lost against the
journal-off job of the same call time: ``1 - runs/s / journal-off runs/s``.

Variants: journal off; ``sync flush`` (the flink-agents baseline: a synchronous producer flush after every
journal write, :func:`_harness.install_sync_flush`); the durability modes ``per_call``, ``per_action``,
``per_run`` (the default) and ``at_checkpoint``; journal off and ``per_run`` with every key polling for its run
(``wake_on_completion=False``); and (full run) ``per_run`` with librdkafka's ``linger.ms``
at 0, 1 and 20 ms instead of its default 5 ms. Besides throughput: Flink CPU per run and per journaled
record (against journal off), the journal producer's Produce requests and bytes per run (librdkafka
statistics), and run latency (first action began -> output left the operator) p50/p99.

    .venv/bin/python bench/bench_journal_overhead.py --quick     # one round, 0 and 20 ms, ~4 minutes
    .venv/bin/python bench/bench_journal_overhead.py             # 2 rounds, 0/20/200 ms, ~20 minutes
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass

import _harness as h

#: Records a run journals: accepted, 2 calls, 2 completions.
RECORDS_PER_RUN = 5
# name -> config overrides ("sync_flush" is the baseline agent's switch, names with a dot are Kafka settings)
VARIANTS = {
    "journal off": {"journal_enabled": False},
    "sync flush": {"durability": "per_call", "sync_flush": True},
    "per_call": {"durability": "per_call"},
    "per_action": {"durability": "per_action"},
    "per_run": {"durability": "per_run"},
    "at_checkpoint": {"durability": "at_checkpoint"},
    # every key polling for its run every poll_interval_ms instead of being woken by it (before issue #14's wake-ups)
    "journal off, polling": {"journal_enabled": False, "wake_on_completion": False},
    "per_run, polling": {"durability": "per_run", "wake_on_completion": False},
}
LINGER_VARIANTS = {f"per_run+linger{ms}": {"durability": "per_run", "linger.ms": ms} for ms in (0, 1, 20)}
# rough throughput of a variant relative to journal-off, to size its first job
_GUESS = {"sync flush": 0.1, "per_call": 0.3, "per_action": 0.4}


def _config(bootstrap: str, overrides: dict, concurrency: int, poll_interval_ms: int, stats_path: str) -> dict:
    overrides = dict(overrides)
    kafka_extra = {k: overrides.pop(k) for k in list(overrides) if "." in k}
    config = h.agent_config(bootstrap, max_concurrent_runs=concurrency, poll_interval_ms=poll_interval_ms,
                            **overrides)
    config["kafka"] = {**config["kafka"], **kafka_extra, **h.producer_statistics(stats_path)}
    return config


def _job_size(name: str, overrides: dict, previous: list[h.JobResult], delay_ms: float, concurrency: int,
              target_s: float) -> int:
    """Inputs for a job of about ``target_s`` measured seconds: from the variant's measured rate, else a guess."""
    if previous:
        return max(60, int(target_s * sum(r.runs for r in previous) / sum(r.seconds for r in previous)))
    ideal = 600 if delay_ms == 0 else concurrency * 1000 / (2 * delay_ms + 5)
    return max(60, int(target_s * ideal * _GUESS.get(name, _GUESS.get(overrides.get("durability"), 1.0))))


@dataclass
class Measured:
    """One job of one variant: its timing and what its journal producer sent."""

    job: h.JobResult
    produced: h.ProduceStats
    load: float  # the machine's 1-minute load average as the job ended


def _run_variant(bootstrap: str, name: str, overrides: dict, delay_ms: float, runs: int, args, label: str, *,
                 flink_config: dict[str, str] | None = None) -> Measured:
    """One job of a variant (``bench_tracing_overhead.py`` runs its jobs through this too)."""
    topic = h.produce_bench_inputs(bootstrap, args.keys, runs)
    agent = h.bench_agent(label, call_delay_s=delay_ms / 1000, sync_flush=bool(overrides.get("sync_flush")))
    stats_path = os.path.join(tempfile.mkdtemp(prefix="far-bench-stats-"), "producer.jsonl")
    config = _config(bootstrap, overrides, args.concurrency, args.poll_interval_ms, stats_path)
    job = h.timed_agent_job(bootstrap, topic, agent, config, runs, checkpoint_interval_ms=args.checkpoint_interval_ms,
                            flink_config=flink_config)
    return Measured(job, h.read_producer_statistics(stats_path), h.load1())


def _row(name: str, delay_ms: float, results: list[Measured], base: list[Measured], concurrency: int) -> list:
    """A table row: throughput against journal off and ideal, CPU, what was produced, latency added and the
    journal's acknowledgement latency."""
    jobs, base_jobs = [m.job for m in results], [m.job for m in base]
    runs, seconds = sum(r.runs for r in jobs), sum(r.seconds for r in jobs)
    base_rate = sum(r.runs for r in base_jobs) / sum(r.seconds for r in base_jobs)
    off = name == "journal off"  # the base
    unjournaled = name.startswith("journal off")  # no records: no per-record columns
    per_round = [(1 - (r.runs / r.seconds) / (b.runs / b.seconds)) * 100 for r, b in zip(jobs, base_jobs, strict=True)]
    spread = f"{min(per_round):.0f}..{max(per_round):.0f}" if len(per_round) > 1 and not off else ""
    flink_cpu = sum(r.flink_cpu_s for r in jobs) / runs * 1000
    base_cpu = sum(r.flink_cpu_s for r in base_jobs) / sum(r.runs for r in base_jobs) * 1000
    latencies = sorted(t for r in jobs for t in r.latencies)
    base_latencies = sorted(t for r in base_jobs for t in r.latencies)
    produced = h.ProduceStats(*(sum(getattr(m.produced, f) for m in results)
                                for f in ("records", "requests", "record_bytes", "wire_bytes")))
    requests, record_bytes, _ = produced.per(RECORDS_PER_RUN)
    acks = sorted(a for r in jobs for a in r.ack_latencies)
    # ideal: every slot always calling (2 calls per run); no ideal without call time
    ideal = f"{runs / seconds / (concurrency * 1000 / (2 * delay_ms)) * 100:.1f}" if delay_ms else "-"

    def added(p: float) -> str:
        return "-" if off else f"{(h.percentile(latencies, p) - h.percentile(base_latencies, p)) * 1000:.1f}"

    def ack(p: float) -> str:
        return f"{h.percentile(acks, p) * 1000:.1f}" if acks else "-"

    return [name, delay_ms, runs, runs / seconds, "-" if off else f"{(1 - runs / seconds / base_rate) * 100:.1f}",
            spread, ideal, flink_cpu, "-" if unjournaled else f"{(flink_cpu - base_cpu) * 1000 / RECORDS_PER_RUN:.0f}",
            sum(r.broker_cpu_s for r in jobs) / runs * 1000, "-" if unjournaled else requests,
            "-" if unjournaled else record_bytes, h.percentile(latencies, 0.5) * 1000,
            h.percentile(latencies, 0.99) * 1000, added(0.5), added(0.99), ack(0.5), ack(0.99),
            f"{sum(m.load for m in results) / len(results):.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round, 0 and 20 ms, no linger variants")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2, --quick 1)")
    parser.add_argument("--seconds", type=float, help="target measured seconds per job (default 6, --quick 2.5)")
    parser.add_argument("--delays-ms", type=float, nargs="+", help="call times (ms; default 0 20 200, --quick 0 20)")
    parser.add_argument("--concurrency", type=int, default=8, help="max_concurrent_runs (default 8)")
    parser.add_argument("--keys", type=int, default=32, help="distinct keys in the input (default 32)")
    parser.add_argument("--poll-interval-ms", type=int, default=5, help="operator poll_interval_ms (default 5)")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000, help="checkpoint interval (default 1000)")
    parser.add_argument("--no-linger", action="store_true", help="skip the linger.ms variants")
    parser.add_argument("--variants", nargs="+", help="only these variants (journal off is always measured)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    target_s = args.seconds or (2.5 if args.quick else 6.0)
    delays = args.delays_ms or ([0.0, 20.0] if args.quick else [0.0, 20.0, 200.0])
    variants = dict(VARIANTS)
    if not (args.quick or args.no_linger):
        variants.update(LINGER_VARIANTS)
    if args.variants:
        variants = {n: v for n, v in variants.items() if n in args.variants or n == "journal off"}

    print(h.machine_note())
    print(f"# {rounds} round(s), concurrency {args.concurrency}, {args.keys} keys, poll {args.poll_interval_ms} ms, "
          f"checkpoints every {args.checkpoint_interval_ms} ms, ~{target_s:g} s measured per job", flush=True)
    measured: dict[tuple[str, float], list[Measured]] = defaultdict(list)
    began = time.monotonic()
    with h.broker() as bootstrap:
        h.warm_up_broker(bootstrap, 15 if args.quick else 30)
        _run_variant(bootstrap, "warm-up", {}, 0.0, 300, args, "warmup")
        print(f"# warm-up job done at {time.monotonic() - began:.0f} s", flush=True)
        names = list(variants)
        for round_index in range(rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for delay_ms in delays:
                for name in order:
                    previous = [m.job for m in measured[(name, delay_ms)]]
                    runs = _job_size(name, variants[name], previous, delay_ms, args.concurrency, target_s)
                    m = _run_variant(bootstrap, name, variants[name], delay_ms, runs, args, f"overhead{round_index}")
                    measured[(name, delay_ms)].append(m)
                    r = m.job
                    print(f"# round {round_index + 1} {name:>18} {delay_ms:4g} ms: {r.runs:5d} runs in "
                          f"{r.seconds:6.2f} s = {r.runs / r.seconds:7.1f} runs/s, CPU/run: Flink "
                          f"{r.flink_cpu_s / r.runs * 1000:.2f} ms, broker {r.broker_cpu_s / r.runs * 1000:.2f} ms, "
                          f"{m.produced.requests} Produce requests for {m.produced.records} records "
                          f"[{time.monotonic() - began:.0f} s, load {h.load1():.1f}]", flush=True)

    rows = [_row(name, delay_ms, measured[(name, delay_ms)], measured[("journal off", delay_ms)], args.concurrency)
            for delay_ms in delays for name in names]
    h.print_table(
        f"Journal overhead: 1 subtask, max_concurrent_runs={args.concurrency}, 2 actions x 1 call per run "
        f"({RECORDS_PER_RUN} records), {rounds} interleaved round(s)",
        ["variant", "call ms", "runs", "runs/s", "lost vs off (%)", "per-round (%)", "% of ideal", "Flink CPU ms/run",
         "Flink CPU us/record", "broker CPU ms/run", "Produce req/run", "bytes/run", "latency p50 ms",
         "p99 ms", "p50 added ms", "p99 added ms", "ack p50 ms", "ack p99 ms", "load"],
        rows)
    print("lost vs off = throughput lost against the journal-off job of the same call time: 1 - runs/s / off runs/s")
    print("CPU = CPU time of the process between the first and the last output (2 cores in all); us/record = Flink "
          "CPU per run above journal off, per journaled record")
    print("Produce req/run, bytes/run = the journal producer's Produce requests and record bytes (keys + values) "
          "per run (librdkafka statistics)")
    print("% of ideal = runs/s against every slot calling all the time (slots / (2 x call time))")
    print("latency = first action began -> output left the operator, for the runs in the measured window; added = "
          "the variant's percentile minus journal off's (p99 added: its p99 minus journal off's p99)")
    print("ack = a journal record appended -> Kafka's answer, timed in the same job's worker; load = the machine's "
          "1-minute load average as the variant's jobs ended")
    _print_cpu_by_thread_group(measured, delays, names)


def _print_cpu_by_thread_group(measured: dict[tuple[str, float], list[Measured]], delays: list[float],
                               names: list[str]) -> None:
    """Where the Flink CPU per journaled record goes: each thread group's CPU per run above journal off."""
    def per_run(results: list[Measured]) -> dict[str, float]:
        runs = sum(m.job.runs for m in results)
        totals: dict[str, float] = defaultdict(float)
        for m in results:
            for group, seconds in m.job.flink_cpu_by_group_s.items():
                totals[group] += seconds
        return {group: seconds / runs for group, seconds in totals.items()}

    groups = [g for g, _ in h.THREAD_GROUPS] + ["other JVM"]
    rows = []
    for delay_ms in delays:
        base = per_run(measured[("journal off", delay_ms)])
        for name in (n for n in names if not n.startswith("journal off")):
            got = per_run(measured[(name, delay_ms)])
            extra = [(got.get(g, 0.0) - base.get(g, 0.0)) * 1e6 / RECORDS_PER_RUN for g in groups]
            rows.append([name, delay_ms, *(f"{e:.0f}" for e in extra), f"{sum(extra):.0f}"])
    h.print_table("Flink CPU per journaled record by thread group (us above journal off)",
                  ["variant", "call ms", *groups, "all"], rows)
    print("task + runs = the task thread and the Python threads it started (run workers, the journal's delivery "
          "thread); librdkafka = the producer's own threads; groups sampled at 2 Hz, so 'all' differs a little "
          "from the table above")


if __name__ == "__main__":
    main()


