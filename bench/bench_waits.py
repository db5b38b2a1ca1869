"""Waiting runs (issue 35): what runs parked at ``ctx.wait_for`` cost the keys that do not wait, and the
TaskManager memory each parked run takes.

**Throughput** (target: with 1,000 runs per subtask waiting at once and ``max_concurrent_runs=8``, the
non-waiting keys keep >= 90 % of the throughput of the same job with no waits). One subtask, one agent of one
action: a busy input makes one call of ``--call-ms`` (default 20 ms) and emits one output; a waiting input
calls ``wait_for`` (a ~200-byte payload, a one-day timeout, no decision ever sent) and emits nothing. Three
variants, each its own MiniCluster job on an *unbounded* Kafka input of ``--busy-keys`` (32) busy keys'
inputs, interleaved over rounds (the order rotates):

- **A** no waits: ``connect_to_agent(keyed, agent, config)``, no signals wired;
- **B** signals wired (an empty signals topic) and no waits: the cost of the decisions' tagging step alone;
- **C** signals wired and ``--waiting`` (1,000) extra keys whose first input waits, produced *before* the busy
  inputs on the one input partition, so every one is parked before the busy runs are measured (the table
  says how many were parked when the window began).

Throughput counts the busy keys' outputs from the end of the first wave (the 8th output, in C at the
earliest the first output after the last wait opened) to the last; latency is a busy run's start (in its
action) -> its output leaving the operator (p50 / p99, "added" = minus A's in the same round); Flink CPU per
run is the JVM's CPU over that window; "wait hooks" is the task thread's CPU inside the operator's wait
bookkeeping (``OperatorWaits.on_timer`` and the parked-run check of a queued input), timed in the worker.

**Memory** (target: <= 4 KiB of TaskManager memory per waiting run beyond its payload). One job of C's shape
(signals wired, the heap state backend, checkpoints to files); after 128 busy runs it is measured with 0
parked runs, then ``--parked`` waiting inputs (default 10,000; 2,000 with ``--quick``) are produced into its
running input in ``--steps`` (4) steps, each measured once all its runs are parked, a checkpoint has completed
and the worker's interpreter has collected its garbage. Each point: the Flink JVM's live heap after a full GC
(``jcmd <pid> GC.class_histogram``), its RSS and the part outside the heap (the embedded Python interpreter's
included), and the last checkpoint's state size (REST API). Per waiting run (a least-squares slope): beyond
its payload, and beyond the keyed-state entries it writes (``waiting_run``, ``in_flight``, ``seq``, measured on
a representative run of the same agent); and which Java classes grew. A last *control* step runs as many
busy runs as a step parked (no new keys) and measures again: memory that grows with runs made, not kept.
The memory job runs first (the worker's interpreter outlives jobs). Needs Linux (``/proc``) and the JDK's
``jcmd`` on the ``PATH``.

    .venv/bin/python bench/bench_waits.py --quick   # one short round, 2,000 parked runs: ~2.5 minutes
    .venv/bin/python bench/bench_waits.py           # 3 rounds, 10,000 parked runs: ~5 minutes
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _harness as h

A, B, C = "A no waits", "B signals", "C parked"
#: The name of every wait the benchmark opens (its payload: ``--payload-bytes`` of JSON).
WAIT_NAME = "bench-approval"
WAIT_TIMEOUT_S = 86_400.0  # a day: no deadline passes during a benchmark


# -- the agent (shipped by value: defined in __main__) ---------------------------------------------
def waits_agent(name: str, *, call_s: float, payload_bytes: int, calls_before_wait: int) -> Any:
    """One action. A busy input (``{"key", "n"}``) makes one call of ``call_s`` (a ~200-byte result), writes one
    memory path and emits one output carrying its run's start (``began``). A waiting input (``"wait": true``)
    makes ``calls_before_wait`` calls, then waits for a decision that never comes (a one-day timeout)."""
    from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
    from flink_agents_replay.api.resources import Tool

    filler = "x" * 160
    note = "p" * max(0, payload_bytes - 45)

    def tool(argument: str) -> str:
        if call_s:
            time.sleep(call_s)
        return f"{argument[:40]}|{filler}"

    class WaitsBench(Agent):
        @action(InputEvent)
        def step(event, ctx):
            began = time.time()
            install_hook_timer()
            record = event.input
            if record.get("wait"):
                for call in range(calls_before_wait):
                    ctx.call("tool", f"{ctx.key}|{ctx.seq}|{call}")
                ctx.wait_for(WAIT_NAME, {"key": record["key"], "n": record["n"], "note": note},
                             timeout_s=WAIT_TIMEOUT_S, on_timeout=None)
                ctx.send_event(OutputEvent(output={"seq": ctx.seq, "began": began, "waited": True}))
                return
            python = None
            if record.get("gc"):  # the memory part's marker: collect the worker's garbage, count its objects
                gc.collect()
                with contextlib.suppress(OSError, AttributeError):  # glibc: free pages back to the system
                    ctypes.CDLL("libc.so.6").malloc_trim(0)
                python = {"blocks": sys.getallocatedblocks(),
                          "types": Counter(type(o).__qualname__ for o in gc.get_objects()).most_common(60)}
            text = ctx.call("tool", f"{ctx.key}|{ctx.seq}|{record['key']}")
            ctx.memory.set("last", text[:64])
            ctx.send_event(OutputEvent(output={"seq": ctx.seq, "began": began, "python": python}))

    return WaitsBench(name=name, resources={"tool": Tool(tool, side_effects="none")})


def install_hook_timer() -> None:
    """Time the operator's wait bookkeeping on the task thread (CPU seconds): ``OperatorWaits.on_timer``, which
    every processing-time timer of every key passes through, and the parked-run check (``runs.is_empty()``, the
    ``parked_runs`` map state) a queued input makes. Called by the worker; idempotent. The samples wait on the class
    (``OperatorWaits.bench_hook_cpu``) until :func:`stamp_output` carries them out with an output."""
    from flink_agents_replay.flink.waits import OperatorWaits

    if hasattr(OperatorWaits, "bench_hook_cpu"):
        return
    timers: list[float] = []
    checks: list[float] = []
    original = OperatorWaits.on_timer

    class TimedState:
        """The ``parked_runs`` map state, its emptiness checks outside ``on_timer`` timed."""

        def __init__(self, state, owner):
            self._state, self._owner = state, owner

        def is_empty(self):
            began = time.thread_time()
            try:
                return self._state.is_empty()
            finally:
                if not self._owner.bench_in_timer:
                    checks.append(time.thread_time() - began)

        def __getattr__(self, name):
            return getattr(self._state, name)

    def on_timer(self, key, timestamp, ctx):
        self.bench_in_timer = True
        if not isinstance(self.runs, TimedState):
            self.runs = TimedState(self.runs, self)
        began = time.thread_time()
        try:
            yield from original(self, key, timestamp, ctx)
        finally:
            timers.append(time.thread_time() - began)
            self.bench_in_timer = False

    OperatorWaits.on_timer = on_timer
    OperatorWaits.bench_hook_cpu = (timers, checks)


def stamp_output(output) -> tuple:
    """("out", key, seq, emission time, run began, wait hooks since the last output: (on_timer CPU seconds, calls,
    check CPU seconds, calls)): right after the agent operator."""
    from flink_agents_replay.flink.waits import OperatorWaits

    hooks = []
    for samples in getattr(OperatorWaits, "bench_hook_cpu", ([], [])):
        taken = [samples.pop() for _ in range(len(samples))]  # pop is atomic; appends may race in
        hooks += [sum(taken), len(taken)]
    fields = output.output if isinstance(output.output, dict) else {}
    return ("out", output.key, output.seq, time.time(), fields.get("began"), tuple(hooks), fields.get("python"))


def stamp_event(event) -> tuple:
    """("event", kind, key, emission time) of a wait event."""
    return ("event", event.kind, event.key, time.time())


# -- a job ------------------------------------------------------------------------------------------
@dataclass
class Rows:
    """What a running job's collect returned so far."""

    outputs: list[tuple] = field(default_factory=list)  # ("out", key, seq, t, began, hooks, python)
    opened: list[float] = field(default_factory=list)  # emission times of "opened" wait events
    events: Counter = field(default_factory=Counter)  # wait events by kind


class WaitsJob:
    """The benchmark's job on a MiniCluster: ``input_topic`` (unbounded) -> the agent (with ``signals_topic``
    wired when given) -> its outputs and wait events, stamped and collected. Checkpoints go to files (the heap
    state backend, Flink's default), the REST API listens on its own port. Leaving the block cancels it."""

    def __init__(self, bootstrap: str, input_topic: str, agent: Any, config: dict, *, signals_topic: str | None,
                 checkpoint_interval_ms: int, checkpoint_history: int = 1000, timeout_s: float = 900.0):
        from flink_agents_replay.local.processes import free_port

        self.bootstrap, self.input_topic, self.agent, self.config = bootstrap, input_topic, agent, config
        self.signals_topic = signals_topic
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.checkpoint_history = checkpoint_history  # checkpoints the REST API keeps (each some heap)
        self.timeout_s = timeout_s
        self.port = free_port()
        self.rows = Rows()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> WaitsJob:
        from pyflink.common import Types

        from flink_agents_replay.flink.env import create_environment
        from flink_agents_replay.flink.pipeline import connect_to_agent, wait_events
        from flink_agents_replay.local.jars import kafka_connector_jar
        from flink_agents_replay.testing.jobs import keyed_json_inputs

        h.prepare_journal_topic(self.config)
        checkpoints = tempfile.mkdtemp(prefix="far-bench-waits-chk-")
        self._stack.callback(shutil.rmtree, checkpoints, True)
        flink_config = {"rest.port": str(self.port), "web.checkpoints.history": str(self.checkpoint_history),
                        "execution.checkpointing.storage": "filesystem",
                        "execution.checkpointing.dir": Path(checkpoints).as_uri()}
        env = create_environment(parallelism=1, checkpoint_interval_ms=self.checkpoint_interval_ms,
                                 jars=[kafka_connector_jar()], config=flink_config)
        keyed = keyed_json_inputs(env, self.bootstrap, self.input_topic)
        signals = None if self.signals_topic is None else keyed_json_inputs(
            env, self.bootstrap, self.signals_topic, source_uid="signals", parse_uid="parse-signals")
        outputs = connect_to_agent(keyed, self.agent, self.config, signals=signals)
        rows = outputs.map(stamp_output, output_type=Types.PICKLED_BYTE_ARRAY()).union(
            wait_events(outputs).map(stamp_event, output_type=Types.PICKLED_BYTE_ARRAY()))
        self.results = self._stack.enter_context(rows.execute_and_collect(f"bench {self.agent.name}"))
        watchdog = threading.Timer(self.timeout_s, self.results.close)  # a stuck job ends the benchmark
        watchdog.daemon = True
        watchdog.start()
        self._stack.callback(watchdog.cancel)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def until(self, *, outputs: int = 0, opened: int = 0) -> Rows:
        """Read rows until at least ``outputs`` outputs and ``opened`` opened waits arrived."""
        rows = self.rows
        while len(rows.outputs) < outputs or len(rows.opened) < opened:
            row = next(self.results, None)
            if row is None:
                raise RuntimeError(f"the job ended (or timed out) with {len(rows.outputs)} of {outputs} outputs and "
                                   f"{len(rows.opened)} of {opened} opened waits; wait events {dict(rows.events)}")
            if row[0] == "out":
                rows.outputs.append(row)
            else:
                rows.events[row[1]] += 1
                if row[1] == "opened":
                    rows.opened.append(row[3])
        return rows

    def checkpoints(self) -> dict:
        """The REST API's checkpoint statistics of the running job (``{}`` if it does not answer)."""
        base = f"http://127.0.0.1:{self.port}"
        try:
            with urllib.request.urlopen(base + "/jobs/overview", timeout=5) as answer:
                jobs = [j["jid"] for j in json.load(answer)["jobs"] if j["state"] == "RUNNING"]
            with urllib.request.urlopen(f"{base}/jobs/{jobs[0]}/checkpoints", timeout=5) as answer:
                return json.load(answer)
        except (OSError, ValueError, KeyError, IndexError) as exc:
            print(f"# no checkpoint statistics on port {self.port}: {type(exc).__name__}: {exc}", flush=True)
            return {}


def completed_checkpoints(stats: dict) -> list[dict]:
    return [c for c in stats.get("history", []) if c.get("status") == "COMPLETED"]


def latest_checkpoint(stats: dict) -> dict:
    """The last completed checkpoint (``{}`` if none)."""
    return (stats.get("latest") or {}).get("completed") or {}


def checkpoint_bytes(checkpoint: dict) -> float:
    """A completed checkpoint's full state size (bytes)."""
    return float(checkpoint.get("state_size", checkpoint.get("checkpointed_size", float("nan"))))


# -- throughput -------------------------------------------------------------------------------------
@dataclass
class Measured:
    """One throughput job: the busy keys' runs in the window and what they cost."""

    variant: str
    round: int
    runs: int
    seconds: float
    latencies: list[float]  # sorted, seconds
    flink_cpu_s: float
    task_cpu_s: float  # the "task + runs" thread group
    hooks: tuple[float, int, float, int]  # wait bookkeeping on the task thread in the window: on_timer s, calls,
    #                                       queued inputs' parked-run checks s, calls
    parked_at_start: int
    checkpoint_p50_ms: float
    checkpoint_max_ms: float
    checkpoint_kib: float
    load: float

    @property
    def rate(self) -> float:
        return self.runs / self.seconds

    @property
    def hooks_us(self) -> float:
        """Wait bookkeeping per busy run (us of the task thread's CPU)."""
        return (self.hooks[0] + self.hooks[2]) / self.runs * 1e6


def throughput_job(bootstrap: str, variant: str, round_index: int, args) -> Measured:
    """Run one variant (see the module docstring) and measure its busy runs."""
    from flink_agents_replay.testing.jobs import produce_inputs

    runs = args.runs
    busy = [{"key": f"busy-{i % args.busy_keys:04d}", "n": i // args.busy_keys} for i in range(runs)]
    waiting = [{"key": f"wait-{i:05d}", "n": 0, "wait": True} for i in range(args.waiting)] if variant == C else []
    topic = produce_inputs(bootstrap, waiting + busy)  # the waiting inputs first: all parked before the window
    h.CREATED_TOPICS.append(topic)
    signals_topic = None
    if variant != A:
        signals_topic = produce_inputs(bootstrap, [])
        h.CREATED_TOPICS.append(signals_topic)
    agent = waits_agent(f"waits-{variant[0].lower()}{round_index}", call_s=args.call_ms / 1000,
                        payload_bytes=args.payload_bytes, calls_before_wait=args.calls_before_wait)
    config = h.agent_config(bootstrap, max_concurrent_runs=args.concurrency)
    with WaitsJob(bootstrap, topic, agent, config, signals_topic=signals_topic,
                  checkpoint_interval_ms=args.checkpoint_interval_ms) as job, h.CpuSampler() as cpu:
        rows = job.until(outputs=runs, opened=len(waiting))
        stats = job.checkpoints()
    stamps = sorted(row[3] for row in rows.outputs)
    last_opened = max(rows.opened, default=float("-inf"))
    start = min(args.concurrency - 1, len(stamps) // 4)
    while start < len(stamps) - 2 and stamps[start] <= last_opened:  # in C: only once every wait is parked
        start += 1
    begin, end = stamps[start], stamps[-1]
    window = [row for row in rows.outputs if row[3] >= begin]
    latencies = sorted(row[3] - row[4] for row in window if row[4] is not None)
    flink_cpu, _ = cpu.between(begin, end)
    groups = cpu.groups_between(begin, end)
    durations = sorted(float(c["end_to_end_duration"]) for c in completed_checkpoints(stats)
                       if begin * 1000 <= c.get("latest_ack_timestamp", 0) <= end * 1000)
    hooks = tuple(sum(row[5][i] for row in window if row[3] > begin) for i in range(4))
    return Measured(variant, round_index, len(stamps) - 1 - start, end - begin, latencies, flink_cpu,
                    groups.get("task + runs", float("nan")), hooks,
                    sum(t <= begin for t in rows.opened), h.percentile(durations, 0.5),
                    max(durations, default=float("nan")), checkpoint_bytes(latest_checkpoint(stats)) / 1024,
                    h.load1())


def throughput(bootstrap: str, args) -> list[Measured]:
    variants = [A, B, C]
    measured = []
    began = time.monotonic()
    for round_index in range(args.rounds):
        order = variants[round_index % 3:] + variants[:round_index % 3]
        for variant in order:
            result = throughput_job(bootstrap, variant, round_index, args)
            measured.append(result)
            print(f"# round {round_index + 1} {variant:<12} {result.runs:5d} runs in {result.seconds:6.2f} s = "
                  f"{result.rate:6.1f} runs/s, p50 {h.percentile(result.latencies, 0.5) * 1000:.1f} ms, "
                  f"{result.parked_at_start} parked [{time.monotonic() - began:.0f} s, load {h.load1():.1f}]",
                  flush=True)
    return measured


def throughput_tables(measured: list[Measured], args) -> None:
    by = {(m.variant, m.round): m for m in measured}
    rows = []
    ratios: dict[str, list[float]] = {B: [], C: []}
    added: dict[str, list[tuple[float, float]]] = {B: [], C: []}
    for round_index in range(args.rounds):
        base = by[(A, round_index)]
        base_p50, base_p99 = (h.percentile(base.latencies, q) * 1000 for q in (0.5, 0.99))
        for variant in (A, B, C):
            m = by[(variant, round_index)]
            p50, p99 = (h.percentile(m.latencies, q) * 1000 for q in (0.5, 0.99))
            ratio = m.rate / base.rate
            if variant != A:
                ratios[variant].append(ratio)
                added[variant].append((p50 - base_p50, p99 - base_p99))
            rows.append([round_index + 1, variant, m.parked_at_start, m.runs, m.rate,
                         "-" if variant == A else f"{ratio:.3f}", p50, p99,
                         "-" if variant == A else f"{p50 - base_p50:+.1f}",
                         "-" if variant == A else f"{p99 - base_p99:+.1f}",
                         m.flink_cpu_s / m.runs * 1000, m.task_cpu_s / m.runs * 1000, m.hooks_us,
                         m.checkpoint_p50_ms, m.checkpoint_kib, f"{m.load:.1f}"])
    h.print_table(
        f"Busy keys' runs beside waiting runs: 1 subtask, max_concurrent_runs={args.concurrency}, {args.busy_keys} "
        f"busy keys, 1 call of {args.call_ms:g} ms per run, C with {args.waiting:,} parked runs; per round",
        ["round", "variant", "parked", "runs", "runs/s", "x A", "p50 ms", "p99 ms", "p50 added", "p99 added",
         "Flink CPU ms/run", "task+runs ms/run", "wait hooks us/run", "checkpoint p50 ms", "checkpoint KiB", "load"],
        rows)
    summary = []
    for variant in (A, B, C):
        ms = [m for m in measured if m.variant == variant]
        rate = statistics.median(m.rate for m in ms)
        if variant == A:
            ratio, spread, p50_added, p99_added, target = "-", "", "-", "-", ""
        else:
            ratio = f"{statistics.median(ratios[variant]):.3f}"
            spread = (f"{min(ratios[variant]):.3f}..{max(ratios[variant]):.3f}" if len(ratios[variant]) > 1 else "")
            p50_added = f"{statistics.median(a for a, _ in added[variant]):+.1f}"
            p99_added = f"{statistics.median(b for _, b in added[variant]):+.1f}"
            target = ("" if variant == B else
                      ">= 0.90: met" if statistics.median(ratios[variant]) >= 0.90 else ">= 0.90: NOT met")
        summary.append([variant, rate, ratio, spread, p50_added, p99_added,
                        statistics.median(m.flink_cpu_s / m.runs * 1000 for m in ms),
                        statistics.median(m.hooks_us for m in ms), target])
    h.print_table(f"Median over {args.rounds} round(s)",
                  ["variant", "runs/s", "x A", "per-round x A", "p50 added ms", "p99 added ms", "Flink CPU ms/run",
                   "wait hooks us/run", "target (C)"], summary)
    for variant in (A, B, C):
        ms = [m for m in measured if m.variant == variant]
        timers, checks = sum(m.hooks[1] for m in ms), sum(m.hooks[3] for m in ms)
        runs = sum(m.runs for m in ms)
        print(f"wait hooks, {variant}: on_timer {timers / runs:.2f} calls per run at "
              f"{sum(m.hooks[0] for m in ms) / max(timers, 1) * 1e6:.1f} us, parked-run checks {checks / runs:.2f} per "
              f"run at {sum(m.hooks[2] for m in ms) / max(checks, 1) * 1e6:.1f} us")
    print("x A = runs/s over A's in the same round; added = the percentile minus A's in the same round; latency = a "
          "busy run's start (in its action) -> its output leaving the operator; Flink CPU = the Flink JVM's CPU in "
          "the window per busy run (task+runs: the task thread, run workers, journal delivery); wait hooks = the task "
          "thread's CPU in OperatorWaits.on_timer and the parked-run check of queued inputs; parked = waits opened "
          "before the window began; checkpoints: completed in the window (p50 end-to-end), the last one's state size")


# -- memory -----------------------------------------------------------------------------------------
_HISTOGRAM_ROW = re.compile(r"^\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)")
_HISTOGRAM_TOTAL = re.compile(r"^Total\s+(\d+)\s+(\d+)")


#: Classes whose instances the memory part prints at each point (keyed-state entries, timers, keys).
WATCHED_CLASSES = ("org.apache.flink.runtime.state.heap.CopyOnWriteStateMap$StateMapEntry",
                   "org.apache.flink.streaming.api.operators.TimerHeapInternalTimer", "org.apache.flink.types.Row")


@dataclass
class Heap:
    """The live heap after a full GC: bytes in all, and instances and bytes by class."""

    total_bytes: int
    by_class: dict[str, tuple[int, int]]  # class -> (instances, bytes)
    committed_bytes: int = 0  # the heap's committed size after the GC
    ranges: list[tuple[int, int]] = field(default_factory=list)  # the heap's reserved address ranges


def rss_outside(pid: int, ranges: list[tuple[int, int]]) -> int:
    """Resident bytes of the process outside the address ranges (the Java heap's): its native memory, the
    embedded Python interpreter's included (``/proc/<pid>/smaps``)."""
    total = inside = 0
    overlaps = False
    with open(f"/proc/{pid}/smaps") as handle:
        for line in handle:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                low, high = (int(part, 16) for part in line.split(None, 1)[0].split("-"))
                overlaps = any(low < end and start < high for start, end in ranges)
            elif line.startswith("Rss:"):
                size = int(line.split()[1]) * 1024
                total += size
                inside += size if overlaps else 0
    return total - inside if ranges else -1


def _jcmd(pid: int, command: str) -> str:
    return subprocess.run(["jcmd", str(pid), command], check=True, capture_output=True, text=True,
                          timeout=300).stdout


def live_heap(pid: int) -> Heap:
    """``jcmd <pid> GC.class_histogram``: a full GC, then every live object by class; and the committed heap."""
    _jcmd(pid, "GC.run")
    text = _jcmd(pid, "GC.class_histogram")
    committed, ranges = 0, []
    for line in _jcmd(pid, "GC.heap_info").splitlines():  # G1: one line; Serial, Parallel: one per generation
        size = re.search(r"total (?:reserved \d+K, committed )?(\d+)K", line)
        if size and "Metaspace" not in line and "class space" not in line:
            committed += int(size[1]) * 1024
            if where := re.search(r"\[(0x[0-9a-f]+),\s*(0x[0-9a-f]+)", line):
                ranges.append((int(where[1], 16), int(where[2], 16)))
    by_class = {}
    total = None
    for line in text.splitlines():
        if match := _HISTOGRAM_ROW.match(line):
            by_class[match[3]] = (int(match[1]), int(match[2]))
        elif match := _HISTOGRAM_TOTAL.match(line):
            total = int(match[2])
    if total is None:
        raise RuntimeError(f"no total in jcmd GC.class_histogram's answer: {text[-500:]!r}")
    return Heap(total, by_class, committed, ranges)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS:"))


@dataclass
class Point:
    """One memory measurement of the running job."""

    parked: int
    heap: Heap
    rss: int
    native_rss: int  # resident outside the Java heap (-1: the heap's range not known)
    checkpoint_bytes: float
    checkpoint_ms: float
    python: dict  # the worker interpreter after gc.collect(): allocated blocks, gc-tracked objects by type
    added: int = 0  # runs parked since the last point
    park_seconds: float = float("nan")  # first -> last opened wait of those runs


@dataclass
class Entries:
    """The keyed-state entries one parked run writes (bytes), from a representative run of the agent."""

    waiting_run: int
    in_flight: int
    seq: int
    parked_wait: int  # its index entry by wait id (``parked_waits``: seq and deadline), with the wait id
    payload: int  # the wait's payload as JSON (inside waiting_run)
    payload_copies: int  # how many times waiting_run holds the payload

    @property
    def total(self) -> int:
        return self.waiting_run + self.in_flight + self.seq + self.parked_wait


def representative_entries(args) -> Entries:
    """Run the agent's waiting path here (no journal, no Flink) and encode what the operator parks."""
    from flink_agents_replay.core.keygroups import key_group
    from flink_agents_replay.engine import RunInput, execute_run
    from flink_agents_replay.storage.formats.state import InFlightInput, encode_in_flight
    from flink_agents_replay.storage.records.parked import ParkedWait, encode_parked_wait, encode_waiting_run

    agent = waits_agent("waits-entries", call_s=0.0, payload_bytes=args.payload_bytes,
                        calls_before_wait=args.calls_before_wait)
    key = "wait-00000"
    record = {"key": key, "n": 0, "wait": True}
    now_ms = int(time.time() * 1000)
    result = execute_run(agent, RunInput(key, key_group(key, "STRING", 128), 1, record, now_ms, now_ms), {})
    if result.waiting is None:
        raise RuntimeError("the benchmark agent's waiting input did not wait")
    waiting_run = encode_waiting_run(result.waiting)
    payload = json.dumps(result.waiting.wait.payload, separators=(",", ":")).encode()
    note = json.dumps(result.waiting.wait.payload["note"]).encode()
    wait = result.waiting.wait
    parked_wait = len(encode_parked_wait(ParkedWait(1, wait.deadline_ms))) + len(wait.wait_id) + 8  # + seq key
    return Entries(len(waiting_run), len(encode_in_flight(InFlightInput(1, record, now_ms, now_ms))), 8, parked_wait,
                   len(payload), waiting_run.count(note) if len(note) > 20 else -1)


def memory(bootstrap: str, args) -> tuple[list[Point], Point | None, Entries]:
    """The memory job (see the module docstring): the points measured as runs park, and the control step's."""
    from flink_agents_replay.testing.jobs import produce_inputs, produce_json

    entries = representative_entries(args)
    warm_runs = 4 * args.busy_keys
    topic = produce_inputs(bootstrap, [{"key": f"busy-{i % args.busy_keys:04d}", "n": i // args.busy_keys}
                                       for i in range(warm_runs)])
    signals_topic = produce_inputs(bootstrap, [])
    h.CREATED_TOPICS.extend([topic, signals_topic])
    agent = waits_agent("waits-memory", call_s=args.call_ms / 1000, payload_bytes=args.payload_bytes,
                        calls_before_wait=args.calls_before_wait)
    config = h.agent_config(bootstrap, max_concurrent_runs=args.concurrency)
    pid = h.CpuSampler().flink_pid
    if pid is None:
        raise RuntimeError("no Flink JVM (PythonGatewayServer) among this process's children")
    points: list[Point] = []
    began = time.monotonic()
    with WaitsJob(bootstrap, topic, agent, config, signals_topic=signals_topic,
                  checkpoint_interval_ms=args.checkpoint_interval_ms, checkpoint_history=2) as job:
        expected = warm_runs  # outputs so far
        job.until(outputs=expected)

        def measure(parked: int, added: int, park_seconds: float, what: str) -> Point:
            nonlocal expected
            settled = time.time()
            # A checkpoint taken after the step, and the journal pruned by it.
            deadline = time.monotonic() + max(30.0, 20 * args.checkpoint_interval_ms / 1000)
            while True:
                time.sleep(args.checkpoint_interval_ms / 1000)
                latest = latest_checkpoint(job.checkpoints())
                if latest.get("latest_ack_timestamp", 0) > (settled + 1.0) * 1000 or time.monotonic() > deadline:
                    break
            # The worker's interpreter outlives jobs: collect its cycles (which may hold Java objects of earlier
            # jobs) and trim its allocator with a run of a busy key, then measure.
            expected += 1
            produce_json(bootstrap, topic, [{"key": "busy-0000", "n": -expected, "gc": True}])
            rows = job.until(outputs=expected, opened=parked)
            python = next(row[6] for row in reversed(rows.outputs) if row[6] is not None)
            heap = min((live_heap(pid) for _ in range(2)), key=lambda one: one.total_bytes)
            point = Point(parked, heap, rss_bytes(pid), rss_outside(pid, heap.ranges), checkpoint_bytes(latest),
                          float(latest.get("end_to_end_duration", float("nan"))), python, added, park_seconds)
            counts = ", ".join(f"{name.rsplit('.', 1)[-1]} {heap.by_class.get(name, (0, 0))[0]:,}"
                               for name in WATCHED_CLASSES)
            print(f"# memory: {what}: heap {heap.total_bytes / 2**20:7.1f} MiB, RSS {point.rss / 2**20:7.1f} MiB (off "
                  f"heap {point.native_rss / 2**20:7.1f}), checkpoint {point.checkpoint_bytes / 2**20:6.2f} MiB "
                  f"({counts}) [{time.monotonic() - began:.0f} s, load {h.load1():.1f}]", flush=True)
            return point

        points.append(measure(0, 0, float("nan"), f"{0:6,d} parked"))
        steps = [round(args.parked * i / args.steps) for i in range(args.steps + 1)]
        for previous, parked in zip(steps, steps[1:], strict=False):
            produce_json(bootstrap, topic, [{"key": f"wait-{i:05d}", "n": 0, "wait": True}
                                            for i in range(previous, parked)])
            job.until(outputs=expected, opened=parked)
            opened = job.rows.opened[previous:parked]
            points.append(measure(parked, parked - previous, max(opened) - min(opened) if len(opened) > 1
                                  else float("nan"), f"{parked:6,d} parked"))
        control = None
        if args.control and args.parked:
            # As many runs as a step parked, of the busy keys (no new keys, nothing parked): what running them
            # leaves in memory, next to what the parked runs do.
            runs = steps[-1] - steps[-2]
            produce_json(bootstrap, topic, [{"key": f"busy-{i % args.busy_keys:04d}", "n": 10_000_000 + i}
                                            for i in range(runs)])
            expected += runs
            job.until(outputs=expected, opened=args.parked)
            control = measure(args.parked, runs, float("nan"), f"control, {runs:,} busy runs")
        events = dict(job.rows.events)
    if events.get("opened", 0) != args.parked or len(events) > 1:
        print(f"# memory: unexpected wait events {events}", flush=True)
    return points, control, entries


def slope(points: list[Point], value) -> tuple[float, float]:
    """Least-squares bytes per parked run of ``value(point)`` over ``points``, and its standard error (NaN with
    fewer than 3 points)."""
    xs, ys = [p.parked for p in points], [float(value(p)) for p in points]
    if len(xs) < 2:
        return float("nan"), float("nan")
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    fitted = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    if len(xs) < 3:
        return fitted, float("nan")
    residuals = sum((y - mean_y - fitted * (x - mean_x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return fitted, (residuals / (len(xs) - 2) / spread) ** 0.5


def memory_tables(points: list[Point], control: Point | None, entries: Entries, args) -> None:
    rows = []
    steps = list(zip([None, *points], points, strict=False))
    if control is not None:
        steps.append((points[-1], control))
    for previous, point in steps:
        def per(value, previous: Point | None = previous, point: Point = point) -> float:
            return float("nan") if previous is None else (value(point) - value(previous)) / point.added

        rows.append([point.parked if point is not control else f"+{control.added:,} busy runs",
                     point.heap.total_bytes / 2**20, point.heap.committed_bytes / 2**20,
                     point.rss / 2**20, point.native_rss / 2**20, point.checkpoint_bytes / 2**20, point.checkpoint_ms,
                     per(lambda p: p.heap.total_bytes), per(lambda p: p.rss), per(lambda p: p.native_rss),
                     per(lambda p: p.python["blocks"]), per(lambda p: p.checkpoint_bytes),
                     point.added / point.park_seconds if point.added > 1 else float("nan")])
    h.print_table(f"Memory of parked runs: 1 subtask, signals wired, heap state backend, payload ~{args.payload_bytes} "
                  f"B, {args.calls_before_wait} call(s) before the wait; one job measured as runs park (per run: this "
                  "step's growth over the runs it parked; the control step's over its busy runs)",
                  ["parked", "heap after GC MiB", "heap committed MiB", "RSS MiB", "RSS off heap MiB", "checkpoint MiB",
                   "checkpoint ms", "heap B/run", "RSS B/run", "RSS off heap B/run", "Python blocks/run",
                   "checkpoint B/run", "parked/s"],
                  rows)
    base, last = points[0], points[-1]
    added = last.parked - base.parked
    later = points[1:] if len(points) > 2 else points  # after the first step's one-off growth
    measures = [(f"heap after full GC (fit over 0 .. {last.parked:,})", slope(points, lambda p: p.heap.total_bytes)),
                (f"RSS (fit over {later[0].parked:,} .. {last.parked:,})", slope(later, lambda p: p.rss)),
                (f"RSS off heap (fit over {later[0].parked:,} .. {last.parked:,})",
                 slope(later, lambda p: p.native_rss))]

    def verdict(beyond: float) -> str:
        return "met" if beyond <= 4096 else "NOT met"

    # Only the heap is what a parked run keeps: RSS also moves with the runs made (see the control step).
    table = [[name, value, error, value - entries.payload, value - entries.total,
              verdict(value - entries.payload) if index == 0 else "-"]
             for index, (name, (value, error)) in enumerate(measures)]
    if control is not None:
        for name, value in (("RSS", lambda p: p.rss), ("RSS off heap", lambda p: p.native_rss)):
            table.append([f"control: {name} per busy run", (value(control) - value(last)) / control.added, "", "-",
                          "-", "-"])
    h.print_table("Per waiting run (least-squares slope, bytes per parked run)",
                  ["measure", "bytes/run", "+/- (std. error)", "beyond payload", "beyond payload and entries",
                   "target <= 4,096 beyond payload"], table)
    print(f"entries per parked run (representative run, bytes): waiting_run {entries.waiting_run} (payload "
          f"{entries.payload} B of JSON, its text held {entries.payload_copies} time(s)), in_flight "
          f"{entries.in_flight}, seq {entries.seq}, parked wait {entries.parked_wait}: {entries.total} in all")
    growth = []
    for name in set(last.heap.by_class) | set(base.heap.by_class):
        count_now, bytes_now = last.heap.by_class.get(name, (0, 0))
        count_then, bytes_then = base.heap.by_class.get(name, (0, 0))
        growth.append(((bytes_now - bytes_then) / added, (count_now - count_then) / added, name))
    growth.sort(reverse=True)
    h.print_table("Where the heap per waiting run goes (jcmd GC.class_histogram, largest growth)",
                  ["class", "bytes/run", "instances/run"],
                  [[name, size, count] for size, count, name in growth[:12]])
    then, now = dict(base.python["types"]), dict(last.python["types"])
    python = sorted(((now.get(name, 0) - then.get(name, 0)) / added, name) for name in set(then) | set(now))
    grown = [[name, count] for count, name in reversed(python[-6:]) if count >= 0.01]
    if grown:
        h.print_table("The worker's Python objects per waiting run (gc-tracked, after gc.collect(); of the 60 most "
                      "common types)", ["type", "objects/run"], grown)
    else:
        print("The worker's gc-tracked Python objects (the 60 most common types) did not grow with the parked runs.")
    print("heap after GC = live objects (jcmd GC.class_histogram); committed = the heap the JVM holds (GC.heap_info); "
          "RSS = the whole JVM process, its embedded Python included (the first step also holds one-off growth; the "
          "heap's RSS grows as its committed pages are first touched); RSS off heap = outside the heap's address range "
          "(/proc/<pid>/smaps: native memory, Python's included; measured after glibc's malloc_trim); "
          "Python blocks = sys.getallocatedblocks() of the worker's interpreter (pymalloc blocks in use: objects up "
          "to 512 B); checkpoint = the last completed checkpoint's state size (REST API); entries = the keyed-state "
          "values a parked run writes (waiting_run, in_flight, seq)")


# -- main -------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round, 2,000 parked runs (~2.5 min)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of A, B, C (default 3, --quick 1)")
    parser.add_argument("--seconds", type=float,
                        help="busy runs per job = seconds x the ideal rate (concurrency / call time): default 8, "
                             "--quick 4")
    parser.add_argument("--call-ms", type=float, default=20.0, help="call time of a busy run (default 20 ms)")
    parser.add_argument("--concurrency", type=int, default=8, help="max_concurrent_runs (default 8)")
    parser.add_argument("--busy-keys", type=int, default=32, help="keys whose runs are measured (default 32)")
    parser.add_argument("--waiting", type=int, default=1000, help="parked runs in variant C (default 1,000)")
    parser.add_argument("--parked", type=int, help="parked runs of the memory job (default 10,000, --quick 2,000)")
    parser.add_argument("--payload-bytes", type=int, default=200, help="a wait's payload, JSON bytes (default 200)")
    parser.add_argument("--calls-before-wait", type=int, default=1,
                        help="calls a waiting run makes before it waits (default 1; kept in its parked records)")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000, help="checkpoint interval (default 1000)")
    parser.add_argument("--steps", type=int, default=4,
                        help="the memory job parks its runs in this many steps, measured after each (default 4)")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="leave out the memory job's control step (as many busy runs as a step parked)")
    parser.add_argument("--skip", choices=["throughput", "memory"], help="leave one part out")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (4.0 if args.quick else 8.0)
    args.parked = args.parked if args.parked is not None else (2000 if args.quick else 10_000)
    ideal = args.concurrency / (args.call_ms / 1000) if args.call_ms else 1000.0
    args.runs = max(int(seconds * ideal), 2 * args.busy_keys, 20)

    print(h.machine_note())
    print(f"# {args.rounds} round(s), {args.runs} busy runs per job ({args.busy_keys} keys, {args.call_ms:g} ms calls, "
          f"max_concurrent_runs={args.concurrency}), C with {args.waiting:,} parked; memory with {args.parked:,} "
          f"parked; payload ~{args.payload_bytes} B, {args.calls_before_wait} call(s) before a wait; checkpoints "
          f"every {args.checkpoint_interval_ms} ms to files", flush=True)
    began = time.monotonic()
    with h.broker() as bootstrap:
        h.warm_up_broker(bootstrap, 15 if args.quick else 30)
        warm = h.produce_bench_inputs(bootstrap, 16, 100)
        h.timed_agent_job(bootstrap, warm, h.bench_agent("warmup", call_delay_s=0.0, actions=1),
                          h.agent_config(bootstrap), 100)
        print(f"# warm-up job done at {time.monotonic() - began:.0f} s", flush=True)
        # Memory first: the worker's interpreter outlives jobs, and what earlier jobs leave is less noise here.
        points, control, entries = memory(bootstrap, args) if args.skip != "memory" else ([], None, None)
        measured = throughput(bootstrap, args) if args.skip != "throughput" else []
    if measured:
        throughput_tables(measured, args)
    if points:
        memory_tables(points, control, entries, args)
    print(f"# done in {time.monotonic() - began:.0f} s; load average now {h.load1():.2f}", flush=True)


if __name__ == "__main__":
    main()
