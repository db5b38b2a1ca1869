"""Where a run's latency goes: each step of one p50 run and one p99 run, stamped inside the job.

The workload of ``bench_journal_overhead.py`` (one subtask, 32 keys, 8 run slots, 2 actions x 1 call per run,
``per_run``), with the steps of every run stamped in the worker's interpreter (``time.monotonic``):

* ``submitted``: the task thread handed the run to the pool (``RunPool.submit``);
* ``slot taken`` / ``slot freed``: a worker thread began and ended the run's code;
* ``call returned``: each of the run's calls returned to its action;
* ``acknowledged, wake-up posted``: the journal's last acknowledgement arrived and its callback wrote the
  run's wake-up (``on_ready``: the same instant);
* ``task thread at the key``: the operator's ``on_timer`` asked whether the key's run may be applied (from the
  wake-up's mail, or a check that found it unfinished);
* ``applied, output emitted``: the run was taken out of the pool and its output yielded (same call).

Between the run's last call returning and its output, the task thread's other steps (runs submitted, keys
checked, applied, the input held or released) say what it was doing meanwhile. The p50 and p99 runs are
picked by latency from the first action's start to the output, as the journal-overhead bench defines it.

    .venv/bin/python bench/trace_run_latency.py                  # 20 and 200 ms calls, ~3 minutes
    .venv/bin/python bench/trace_run_latency.py --call-ms 20
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict

import _harness as h


def install_run_tracer(path: str) -> None:
    """Stamp each run's steps into ``path`` (one line per step), from the worker; idempotent."""
    from flink_agents_replay.flink import runs
    from flink_agents_replay.flink.input_hold import InputHold
    from flink_agents_replay.flink.runs import RunPool
    from flink_agents_replay.integrations.kafka.store import KafkaTopicStore
    from flink_agents_replay.storage.journal.checkpoints import JournalCheckpoints
    from flink_agents_replay.storage.journal.writer import JournalWriter

    # Claimed by one thread (dict.setdefault is atomic): two runs' first calls may return at once. A later job
    # (another path) wraps these wrappers, each stamping into its own job's file.
    claim = object()
    if vars(runs).setdefault("bench_trace_claims", {}).setdefault(path, claim) is not claim:
        return
    out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the worker's interpreter

    def stamp(kind: str, key, seq=-1) -> None:
        out.write(f"{time.monotonic():.6f}\t{kind}\t{key}\t{seq}\n")

    submit, done, finished, sync = RunPool.submit, RunPool.done, RunPool.finished, InputHold._sync

    def traced_submit(self, key, run, execute, *, on_ready=None):
        stamp("submitted", key, run.seq)

        def traced_execute():
            stamp("slot taken", key, run.seq)
            try:
                return execute()
            finally:
                stamp("slot freed", key, run.seq)

        def traced_ready():
            stamp("acknowledged, wake-up posted", key, run.seq)
            on_ready()

        return submit(self, key, run, traced_execute, on_ready=traced_ready if on_ready else None)

    def traced_done(self, key, *, wait_for_it=False):
        stamp("task thread at the key", key, self._runs[key].run.seq)
        return done(self, key, wait_for_it=wait_for_it)

    def traced_finished(self, key):
        result = finished(self, key)
        stamp("applied, output emitted", key, result.seq)
        return result

    def traced_sync(self):
        held = self.held
        sync(self)
        if self.held != held:
            stamp("input held" if self.held else "input released", "-")

    def traced_on_task_thread(method, began: str, ended: str):
        def traced(self, *args, **kwargs):
            stamp(began, "-")
            try:
                return method(self, *args, **kwargs)
            finally:
                stamp(ended, "-")
        return traced

    RunPool.submit, RunPool.done, RunPool.finished, InputHold._sync = (traced_submit, traced_done, traced_finished,
                                                                      traced_sync)
    # The journal's halves of snapshot_state and notify_checkpoint_complete (the bridge bound the operator's own
    # methods when it opened, before this ran).
    journal = JournalCheckpoints
    journal.snapshot = traced_on_task_thread(journal.snapshot, "snapshot began", "snapshot ended")
    journal.completed = traced_on_task_thread(journal.completed, "prune began", "prune ended")
    JournalWriter.acknowledge_appended = traced_on_task_thread(
        JournalWriter.acknowledge_appended, "waiting for appended records began", "waiting for appended records ended")
    KafkaTopicStore.end_offsets = traced_on_task_thread(KafkaTopicStore.end_offsets, "end offsets began",
                                                        "end offsets ended")


def traced_agent(name: str, call_delay_s: float, path: str):
    """The journal-overhead bench's agent (:func:`_harness.bench_agent`), stamping each call's return."""

    def note(ctx) -> None:
        install_run_tracer(path)
        with open(path, "a") as out:
            out.write(f"{time.monotonic():.6f}\tcall returned\t{ctx.key}\t{ctx.seq}\n")

    return h.bench_agent(name, call_delay_s=call_delay_s, after_call=note)


_CHECKPOINT_STEPS = tuple(f"{step} {edge}" for step in ("snapshot", "waiting for appended records", "end offsets",
                                                       "prune") for edge in ("began", "ended"))


def read_trace(path: str) -> tuple[dict[tuple[str, int], list[tuple[float, str]]], list[tuple[float, str, str]]]:
    """Steps by run (key, seq), and the task thread's steps in time order (kind, key)."""
    by_run: dict[tuple[str, int], list[tuple[float, str]]] = defaultdict(list)
    task_thread: list[tuple[float, str, str]] = []
    with open(path) as handle:
        for line in handle:
            at, kind, key, seq = line.rstrip("\n").split("\t")
            if int(seq) >= 0:
                by_run[(key, int(seq))].append((float(at), kind))
            if kind in ("submitted", "task thread at the key", "applied, output emitted", "input held",
                        "input released", *_CHECKPOINT_STEPS):
                task_thread.append((float(at), kind, key))
    return by_run, task_thread


def show(run: tuple[str, int], steps: list[tuple[float, str]], task_thread: list, label: str) -> None:
    steps = sorted(steps)
    began = next(at for at, kind in steps if kind == "slot taken")
    print(f"\n{label}: key {run[0]} seq {run[1]}, {(steps[-1][0] - began) * 1000:.1f} ms from its start to its output")
    for at, kind in steps:
        print(f"  {(at - began) * 1000:8.1f} ms  {kind}")
    last_call = max(at for at, kind in steps if kind == "call returned")
    emitted = max(at for at, kind in steps if kind == "applied, output emitted")
    between = [(at, kind, key) for at, kind, key in task_thread if last_call < at < emitted and key != run[0]]
    counts: dict[str, int] = defaultdict(int)
    for _, kind, _ in between:
        counts[kind] += 1
    print(f"  the task thread between its last call's return and its output ({(emitted - last_call) * 1000:.1f} ms): "
          + (", ".join(f"{kind} x{n}" for kind, n in counts.items()) or "nothing"))


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(int(len(values) * q), len(values) - 1)] * 1000 if values else float("nan")


def _spans(task_thread: list) -> list[tuple[str, float, float]]:
    """(step, began, ended) of each checkpoint step on the task thread."""
    spans, opened = [], {}
    for at, kind, _ in task_thread:
        step = kind.rsplit(" ", 1)[0]
        if kind.endswith(" began"):
            opened[step] = at
        elif kind.endswith(" ended") and step in opened:
            spans.append((step, opened.pop(step), at))
    return spans


def show_tail(runs: list, steps_of: dict, task_thread: list, call_s: float) -> None:
    """Where the slowest 1 % of runs lost their time, against all runs: calls returning late (the worker's
    interpreter stalled), the acknowledgement (slot freed -> acknowledged), and the task thread reaching the key
    after the wake-up (late when a checkpoint's snapshot held it); and what the checkpoint steps took."""
    spans = _spans(task_thread)
    parts: dict[str, list[float]] = defaultdict(list)
    tail = set(runs[int(len(runs) * 0.99):])
    tail_parts: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        steps = sorted(steps_of[run])
        at = {kind: when for when, kind in steps}
        if not {"slot taken", "slot freed", "acknowledged, wake-up posted", "task thread at the key"} <= set(at):
            continue
        calls = at["slot freed"] - at["slot taken"] - 2 * call_s
        acked, reached = at["acknowledged, wake-up posted"], at["task thread at the key"]
        held = any(began < reached and ended > acked for step, began, ended in spans if step == "snapshot")
        values = {"calls late": calls, "acknowledgement": acked - at["slot freed"],
                  "wake-up -> task thread": reached - acked, "a snapshot held the task thread": float(held)}
        for name, value in values.items():
            parts[name].append(value)
            if run in tail:
                tail_parts[name].append(value)
    print(f"\n  where the time went, ms: all runs p50 / p99 | the slowest 1 % ({len(tail)} runs) mean / max")
    for name in ("calls late", "acknowledgement", "wake-up -> task thread"):
        values, slow = parts[name], tail_parts[name]
        print(f"    {name:24} {_pct(values, 0.5):6.1f} / {_pct(values, 0.99):6.1f} | "
              f"{sum(slow) / max(len(slow), 1) * 1000:6.1f} / {max(slow, default=0) * 1000:6.1f}")
    held = tail_parts["a snapshot held the task thread"]
    print(f"    a snapshot held the task thread between the wake-up and the key: {sum(held):.0f} of the slowest "
          f"{len(held)}, {sum(parts['a snapshot held the task thread']):.0f} of all {len(parts['calls late'])}")
    for step in ("snapshot", "waiting for appended records", "end offsets", "prune"):
        took = [ended - began for name, began, ended in spans if name == step]
        print(f"  {step} (task thread), ms: {len(took)} times, p50 {_pct(took, 0.5):.1f}, p90 {_pct(took, 0.9):.1f}, "
              f"max {max(took, default=float('nan')) * 1000:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--call-ms", type=float, nargs="+", default=[20, 200])
    parser.add_argument("--seconds", type=float, default=10, help="measured seconds per job (default 10)")
    args = parser.parse_args()
    print(h.machine_note())
    with h.broker() as bootstrap:
        h.warm_up_broker(bootstrap, 30)
        for call_ms in args.call_ms:
            call_s = call_ms / 1000
            runs = max(int(args.seconds * 8 / (2 * call_s + 0.002)), 200)
            topic = h.produce_bench_inputs(bootstrap, 32, runs)
            fd, path = tempfile.mkstemp(prefix="run-trace-", suffix=".tsv")
            os.close(fd)
            agent = traced_agent(f"trace{call_ms:g}", call_s, path)
            result = h.timed_agent_job(bootstrap, topic, agent, h.agent_config(bootstrap, durability="per_run"), runs)
            by_run, task_thread = read_trace(path)
            os.unlink(path)
            complete = {run: steps for run, steps in by_run.items()
                        if {kind for _, kind in steps} >= {"slot taken", "applied, output emitted"}}
            latency = {run: max(at for at, _ in steps) - min(at for at, k in steps if k == "slot taken")
                       for run, steps in complete.items()}
            started = sorted(complete, key=lambda run: min(at for at, k in complete[run] if k == "slot taken"))
            ordered = sorted(started[8:], key=latency.get)  # a wave's worth left out, as the benchmarks do
            print(f"\n## {call_ms:g} ms calls: {len(ordered)} runs traced, p50 "
                  f"{latency[ordered[len(ordered) // 2]] * 1000:.1f} ms, p99 "
                  f"{latency[ordered[int(len(ordered) * 0.99)]] * 1000:.1f} ms (the job's own: p50 "
                  f"{result.latencies[len(result.latencies) // 2] * 1000:.1f} ms)")
            for label, index in (("p50 run", len(ordered) // 2), ("p99 run", int(len(ordered) * 0.99))):
                run = ordered[index]
                show(run, complete[run], task_thread, label)
            show_tail(ordered, complete, task_thread, call_s)


if __name__ == "__main__":
    main()
