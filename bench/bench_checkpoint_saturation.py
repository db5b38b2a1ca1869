"""Checkpoints under saturation: how long a checkpoint takes while a fast source keeps every run slot busy.

One subtask, ``max_concurrent_runs`` 8, 32 keys, 1 action x 1 call per run, calls of 200 ms and 1 s. The
input topic is filled before the job starts, so the source is always ahead of the agent and the job is
backpressured from its first seconds; a checkpoint is triggered every second. Each checkpoint's duration is
Flink's own (``end_to_end_duration``: trigger to the last acknowledgement), read from the MiniCluster's REST
API while the job runs. Variants:

``aligned`` / ``unaligned`` / ``aligned+debloat``: aligned checkpoints, unaligned ones
(``execution.checkpointing.unaligned.enabled``), aligned ones with network buffer debloating
(``taskmanager.network.memory.buffer-debloat.enabled``).

The target is a checkpoint within 2 x the call time.

    .venv/bin/python bench/bench_checkpoint_saturation.py --quick   # 200 ms only, ~2 minutes
    .venv/bin/python bench/bench_checkpoint_saturation.py           # 200 ms and 1 s, ~8 minutes
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

import _harness as h

from flink_agents_replay.local.processes import free_port

CHECKPOINTING = {
    "aligned": {},
    "unaligned": {"execution.checkpointing.unaligned.enabled": "true"},
    "aligned+debloat": {"taskmanager.network.memory.buffer-debloat.enabled": "true"},
}


@dataclass
class Checkpoints:
    """What the REST API reported about one job's checkpoints (the last answer seen)."""

    durations_ms: list[float] = field(default_factory=list)  # completed ones
    failed: int = 0
    persisted_bytes: int = 0  # in-flight data written by unaligned checkpoints (largest)


class CheckpointWatcher(h.BackgroundLoop):
    """Polls ``/jobs/<id>/checkpoints`` of the one job a MiniCluster runs, in a thread, until stopped."""

    def __init__(self, port: int, interval_s: float = 0.2):
        super().__init__("checkpoint-watcher")
        self.base = f"http://127.0.0.1:{port}"
        self.interval_s = interval_s
        self.seen = Checkpoints()
        self.polls = 0
        self.last_error: str | None = None  # shown when a job ends with no checkpoint seen

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.base + path, timeout=2) as answer:
            return json.load(answer)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                jobs = [j["jid"] for j in self._get("/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
                if jobs:
                    self._take(self._get(f"/jobs/{jobs[0]}/checkpoints"))
                    self.polls += 1
            except (OSError, ValueError, KeyError) as e:  # the cluster is starting or gone, or a partial answer
                self.last_error = f"{type(e).__name__}: {e}"

    def _take(self, answer: dict) -> None:
        history = answer.get("history", [])
        completed = [c for c in history if c["status"] == "COMPLETED"]
        self.seen = Checkpoints(sorted(float(c["end_to_end_duration"]) for c in completed),
                                int(answer.get("counts", {}).get("failed", 0)),
                                max((int(c.get("persisted_data", 0)) for c in completed), default=0))


@dataclass
class Measured:
    job: h.JobResult
    checkpoints: Checkpoints


def _run_variant(bootstrap: str, checkpointing: str, call_ms: float, runs: int, args) -> Measured:
    topic = h.produce_bench_inputs(bootstrap, args.keys, runs)
    agent = h.bench_agent("saturation", call_delay_s=call_ms / 1000, actions=1)
    config = h.agent_config(bootstrap, max_concurrent_runs=args.concurrency)
    port = free_port()
    flink_config = {"rest.port": str(port), "web.checkpoints.history": "1000",
                    "execution.checkpointing.timeout": "10 min", **CHECKPOINTING[checkpointing]}
    with CheckpointWatcher(port) as watcher:
        job = h.timed_agent_job(bootstrap, topic, agent, config, runs, checkpoint_interval_ms=1000,
                                flink_config=flink_config)
    if not watcher.seen.durations_ms:
        print(f"# no completed checkpoint seen on port {port}: {watcher.polls} answers, last error "
              f"{watcher.last_error}", flush=True)
    return Measured(job, watcher.seen)


def _row(name: str, call_ms: float, results: list[Measured], concurrency: int) -> list:
    runs = sum(m.job.runs for m in results)
    seconds = sum(m.job.seconds for m in results)
    durations = sorted(d for m in results for d in m.checkpoints.durations_ms)
    ideal = concurrency * 1000 / call_ms
    return [name, call_ms, len(durations), h.percentile(durations, 0.5), h.percentile(durations, 0.9),
            max(durations, default=float("nan")), sum(m.checkpoints.failed for m in results),
            max(m.checkpoints.persisted_bytes for m in results) / 1024, runs / seconds / ideal * 100,
            h.percentile(sorted(t for m in results for t in m.job.latencies), 0.5) * 1000]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 ms calls only, one short round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2, --quick 1)")
    parser.add_argument("--seconds", type=float, help="seconds per job at the ideal rate (default 20, --quick 10)")
    parser.add_argument("--call-ms", type=float, nargs="+", help="call times (default 200 1000, --quick 200)")
    parser.add_argument("--concurrency", type=int, default=8, help="max_concurrent_runs (default 8)")
    parser.add_argument("--keys", type=int, default=32, help="distinct keys in the input (default 32)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    seconds = args.seconds or (10.0 if args.quick else 20.0)
    call_times = args.call_ms or ([200.0] if args.quick else [200.0, 1000.0])
    names = list(CHECKPOINTING)

    print(h.machine_note())
    print(f"# {rounds} round(s), concurrency {args.concurrency}, {args.keys} keys, 1 action x 1 call, "
          f"a checkpoint every 1000 ms, ~{seconds:g} s per job at the ideal rate", flush=True)
    measured: dict[tuple[str, float], list[Measured]] = defaultdict(list)
    began = time.monotonic()
    with h.broker() as bootstrap:
        h.warm_up_broker(bootstrap, 15 if args.quick else 30)
        for round_index in range(rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for call_ms in call_times:
                runs = int(seconds * args.concurrency * 1000 / call_ms)
                for checkpointing in order:
                    m = _run_variant(bootstrap, checkpointing, call_ms, runs, args)
                    measured[(checkpointing, call_ms)].append(m)
                    d = m.checkpoints.durations_ms
                    print(f"# round {round_index + 1} {checkpointing:>15} {call_ms:5g} ms: "
                          f"{m.job.runs / m.job.seconds:6.1f} runs/s, {len(d)} checkpoints, max "
                          f"{max(d, default=float('nan')):.0f} ms [{time.monotonic() - began:.0f} s, "
                          f"load {h.load1():.1f}]", flush=True)

    rows = [_row(c, call_ms, measured[(c, call_ms)], args.concurrency) for call_ms in call_times for c in names]
    h.print_table(
        f"Checkpoints under saturation: 1 subtask, max_concurrent_runs={args.concurrency}, {args.keys} keys, "
        f"input filled beforehand, {rounds} interleaved round(s)",
        ["variant", "call ms", "checkpoints", "p50 ms", "p90 ms", "max ms", "failed", "in-flight KiB",
         "% of ideal", "latency p50 ms"],
        rows)
    print("checkpoint ms = Flink's end_to_end_duration (trigger -> last acknowledgement) of the completed ones; "
          "target: within 2 x the call time")
    print("in-flight KiB = the largest in-flight data an unaligned checkpoint persisted; % of ideal = runs/s "
          "against max_concurrent_runs / call time; latency = run began -> output left the operator")


if __name__ == "__main__":
    main()
