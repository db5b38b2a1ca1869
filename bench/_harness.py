"""Shared pieces of the benchmarks: a broker, a timed agent job, a benchmark agent, tables.

Not a benchmark itself. The scripts in this directory import it (their own directory is on ``sys.path``
when run as ``python bench/<script>.py``) and register it with cloudpickle *by value*, so the agent and
the functions defined here reach the Flink worker even though the worker cannot import ``bench/``.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from flink_agents_replay.flink.operator import LOG_FILE_ENV

cloudpickle.register_pickle_by_value(sys.modules[__name__])
# The repository root, for the suite's harnesses (``tests.harness``) that some benchmarks share with the tests.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIGNING_KEY = "bench-signing-key-0123456789"

# The operator logs a line per subtask start/close: keep them out of the tables.
os.environ.setdefault(LOG_FILE_ENV, os.path.join(tempfile.mkdtemp(prefix="far-bench-log-"), "operator.log"))


# -- broker ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def broker() -> Iterator[str]:
    """A Kafka broker for the benchmark: ``$KAFKA_BOOTSTRAP_SERVERS``, or a temporary local one."""
    from flink_agents_replay.testing.kafka import KafkaSource, kafka_bootstrap_servers, select_kafka_source

    source = select_kafka_source()
    began = time.monotonic()
    with kafka_bootstrap_servers(source) as bootstrap:
        print(f"# Kafka: {source.value} broker at {bootstrap} (ready in {time.monotonic() - began:.1f} s)",
              flush=True)
        try:
            yield bootstrap
        finally:
            if source is not KafkaSource.LOCAL:  # a temporary local broker takes its topics with it
                delete_topics(bootstrap)


def warm_up_broker(bootstrap: str, seconds: float) -> None:
    """Journal-like writes for ``seconds``: 8 threads appending small records to 32 of 128 partitions through
    the journal's store, each waiting for every 5th acknowledgement.

    A freshly started broker JVM spends its first half minute under load compiling (C2): measured here, its CPU
    per acknowledged record falls from ~500 us to ~100 us after ~20 s at 2,000 records/s. On 2 shared cores
    that compilation would be charged to whichever variant runs first.
    """
    from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore

    topic = f"bench-warm-up-{uuid.uuid4().hex[:8]}"
    CREATED_TOPICS.append(topic)
    store = KafkaJournalStore({"bootstrap.servers": bootstrap}, topic, 128)
    deadline = time.monotonic() + seconds

    def write(writer: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            delivery = store.append((writer * 7 + n) % 32, b"%d:warm-up" % writer, b"x" * 400)
            n += 1
            if n % 5 == 0:
                delivery.wait(60)

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()


#: Topics the benchmark created (inputs, journals), deleted at the end on a broker that outlives it.
CREATED_TOPICS: list[str] = []


def delete_topics(bootstrap: str) -> None:
    """Delete the topics in :data:`CREATED_TOPICS` (best effort)."""
    from confluent_kafka.admin import AdminClient

    if not CREATED_TOPICS:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference until the futures resolve
    futures = admin.delete_topics(list(CREATED_TOPICS), request_timeout=30)
    for topic, future in futures.items():
        try:
            future.result(timeout=60)
        except Exception as exc:  # noqa: BLE001 - cleanup: report and go on
            print(f"# could not delete topic {topic}: {exc}")
    CREATED_TOPICS.clear()


def load1() -> float:
    """The 1-minute load average (other work on the machine shows up here)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def machine_note() -> str:
    """One line about the machine: CPUs and the load average when the benchmark started."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"# machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


# -- the benchmark agent ---------------------------------------------------------------------------
def bench_agent(name: str, *, call_delay_s: float, actions: int = 2, calls_per_action: int = 1,
                result_bytes: int = 200, sync_flush: bool = False, work_us: float = 0,
                after_call: Callable[[Any], None] | None = None) -> Any:
    """An agent of ``actions`` chained actions with ``calls_per_action`` calls each.

    The tool is a plain function that sleeps ``call_delay_s`` (the stand-in for a model or an API: I/O
    that releases the GIL) and returns a string of about ``result_bytes`` bytes. The first action writes
    one memory path; the last emits one OutputEvent, so every input produces exactly one output, carrying
    the time its run began (``began``). With ``sync_flush`` the worker's journal imitates flink-agents
    (:func:`install_sync_flush`). ``work_us`` of Python CPU in each action stands for an agent's own code
    (prompts, parsing). ``after_call(ctx)`` runs after each call returns (a trace's stamp). Defined inside a
    function so that cloudpickle ships the classes by value.
    """
    from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
    from flink_agents_replay.api.resources import Tool

    filler = "x" * max(0, result_bytes - 40)

    def tool(argument: str) -> str:
        if call_delay_s:
            time.sleep(call_delay_s)
        return f"{argument[:40]}|{filler}"

    class Step(Event):
        """Sent from one action to the next."""

    def make_action(index: int):
        last = index == actions - 1

        def step(event, ctx):
            began = time.time() if index == 0 else event.began  # the run's start, for its latency
            install_ack_timer()
            if sync_flush:
                install_sync_flush()
            text = event.input["key"] if index == 0 else event.text
            if work_us:
                spin_until = time.thread_time() + work_us / 1e6
                while time.thread_time() < spin_until:
                    pass
            for call in range(calls_per_action):
                text = ctx.call("tool", f"{ctx.key}|{ctx.seq}|{index}|{call}|{text[:40]}")
                if after_call is not None:
                    after_call(ctx)
            if index == 0:
                ctx.memory.set("last", text[:64])
            ctx.send_event(OutputEvent(output={"seq": ctx.seq, "began": began}) if last
                           else Step(text=text, began=began))

        step.__name__ = step.__qualname__ = f"step{index}"
        return action(InputEvent if index == 0 else Step)(step)

    namespace = {f"step{i}": make_action(i) for i in range(actions)}
    agent_type = type("BenchAgent", (Agent,), namespace)
    return agent_type(name=name, resources={"tool": Tool(tool, side_effects="none")})


#: In the journal topic of a job whose writes flush synchronously (:func:`install_sync_flush`).
SYNC_FLUSH_TOPIC_MARK = "-syncflush-"


def install_sync_flush() -> None:
    """Make every journal write to a topic named with :data:`SYNC_FLUSH_TOPIC_MARK` flush the producer
    synchronously, as flink-agents does for each action state write (a baseline: not a mode of this package).

    Called by the worker; idempotent. The worker's interpreter outlives the job (one MiniCluster runs every job
    of a benchmark), so the patch leaves the writers of other jobs alone.
    """
    from flink_agents_replay.storage.journal.writer import JournalWriter

    if getattr(JournalWriter.append, "sync_flush", False):
        return
    original = JournalWriter.append

    def append(self, partition, record_key, value, what):
        delivery = original(self, partition, record_key, value, what)
        if SYNC_FLUSH_TOPIC_MARK in self.store.topic:
            self.store.flush(self.ack_timeout_s)
        return delivery

    append.sync_flush = True
    JournalWriter.append = append


def install_ack_timer() -> None:
    """Time every journal record from its append to Kafka's answer, in the worker (the job's own journal
    acknowledgement latency, beside its run latencies). Called by the worker; idempotent. The latencies wait on
    the class (``JournalWriter.bench_ack_latencies``: this module is pickled by value, so each operator has its
    own copy of its globals) until :func:`_stamp` carries them out with an output."""
    from flink_agents_replay.storage.journal.writer import JournalWriter

    if hasattr(JournalWriter, "bench_ack_latencies"):
        return
    original = JournalWriter.append
    latencies: list[float] = []

    def append(self, partition, record_key, value, what):
        began = time.monotonic()
        delivery = original(self, partition, record_key, value, what)
        delivery.add_done_callback(lambda: latencies.append(time.monotonic() - began))
        return delivery

    JournalWriter.append = append
    JournalWriter.bench_ack_latencies = latencies


def producer_statistics(path: str) -> dict[str, Any]:
    """Kafka settings that make every producer of the job append librdkafka's statistics to ``path`` (JSON
    lines, every 500 ms), read back by :func:`read_producer_statistics`."""
    def on_statistics(raw: str) -> None:
        if '"type":"producer"' in raw.replace(" ", ""):
            with open(path, "a") as handle:
                handle.write(raw.replace("\n", " ") + "\n")

    return {"statistics.interval.ms": 500, "stats_cb": on_statistics}


@dataclass
class ProduceStats:
    """What the journal's producer sent (librdkafka statistics, cumulative): records, Produce requests, bytes."""

    records: int = 0
    requests: int = 0
    record_bytes: int = 0  # keys and values
    wire_bytes: int = 0  # everything sent to the brokers

    def per(self, records_per_run: int) -> tuple[float, float, float]:
        """(Produce requests, record bytes, wire bytes) per run of ``records_per_run`` records."""
        runs = self.records / records_per_run if self.records else float("nan")
        return self.requests / runs, self.record_bytes / runs, self.wire_bytes / runs


def read_producer_statistics(path: str) -> ProduceStats:
    """The last statistics of the busiest producer in ``path`` (the journal's), or zeros without any."""
    import json

    last: dict[str, dict] = {}
    try:
        with open(path) as handle:
            for line in handle:
                stats = json.loads(line)
                last[stats["name"]] = stats
    except OSError:
        return ProduceStats()
    if not last:
        return ProduceStats()
    stats = max(last.values(), key=lambda s: s.get("txmsgs", 0))
    brokers = stats.get("brokers", {}).values()
    return ProduceStats(stats.get("txmsgs", 0), sum(b.get("req", {}).get("Produce", 0) for b in brokers),
                        stats.get("txmsg_bytes", 0), sum(b.get("txbytes", 0) for b in brokers))


def agent_config(bootstrap: str, **overrides: Any) -> dict:
    """A config dict for the benchmark's operator: a fresh journal topic per job (``sync_flush=True``: one whose
    writes flush synchronously, see :func:`install_sync_flush`)."""
    mark = SYNC_FLUSH_TOPIC_MARK if overrides.pop("sync_flush", False) else "-"
    topic = f"bench-journal{mark}{uuid.uuid4().hex[:8]}"
    if overrides.get("journal_enabled", True):
        CREATED_TOPICS.append(topic)
    return {"kafka": {"bootstrap.servers": bootstrap}, "journal_topic": topic, "signing_key": SIGNING_KEY,
            **overrides}


def prepare_journal_topic(config: Mapping[str, Any], partitions: int = 128, timeout_s: float = 60.0) -> None:
    """Create the journal topic now and wait until every partition answers an offsets request.

    A freshly created topic on a busy broker can answer ``NOT_LEADER_FOR_PARTITION`` for a while; the
    operator's first checkpoint would then fail (its offsets request does not retry).
    """
    if not config.get("journal_enabled", True):
        return
    from flink_agents_replay.core.errors import JournalError
    from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore

    store = KafkaJournalStore(config["kafka"], config["journal_topic"], partitions)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                store.end_offsets(range(partitions))
                return
            except JournalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        store.close()


def produce_bench_inputs(bootstrap: str, keys: int, runs: int) -> str:
    """A one-partition input topic of ``runs`` inputs spread round-robin over ``keys`` keys."""
    from flink_agents_replay.testing.jobs import produce_inputs

    records = [{"key": f"key-{i % keys:04d}", "n": i // keys} for i in range(runs)]
    topic = produce_inputs(bootstrap, records)
    CREATED_TOPICS.append(topic)
    return topic


def _stamp(output) -> tuple:
    """(key, seq, emission time, run began, journal acknowledgement latencies measured since the last output):
    added right after the agent operator, fused into its Python operator."""
    from flink_agents_replay.storage.journal.writer import JournalWriter

    began = output.output.get("began") if isinstance(output.output, dict) else None
    measured = getattr(JournalWriter, "bench_ack_latencies", [])
    acks = [measured.pop() for _ in range(len(measured))]  # pop is atomic; appends may race in
    return (output.key, output.seq, time.time(), began, acks)


def timed_agent_job(bootstrap: str, input_topic: str, agent: Any, config: Mapping[str, Any], runs: int, *,
                    checkpoint_interval_ms: int | None = 1000,
                    flink_config: Mapping[str, str] | None = None) -> JobResult:
    """Run ``agent`` on an *unbounded* Kafka input of ``runs`` inputs until ``runs`` outputs arrived.

    Returns the sorted emission times (wall clock, taken in the job as each output leaves the agent
    operator) and the CPU time the Flink JVM and a local broker spent in the measured window: from the
    end of the first wave of runs (the ``max_concurrent_runs``-th output) to the last output.
    The input is unbounded so that every variant runs the same steady-state code path: at the end of a
    *bounded* input the operator drains the remaining runs inside the final watermark, a different
    path, and the job's start-up and shutdown would count too. ``flink_config``: further Flink options.
    """
    from pyflink.common import Types

    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.flink.pipeline import connect_to_agent
    from flink_agents_replay.local.jars import kafka_connector_jar
    from flink_agents_replay.testing.jobs import keyed_json_inputs

    prepare_journal_topic(config)
    env = create_environment(parallelism=1, checkpoint_interval_ms=checkpoint_interval_ms,
                             jars=[kafka_connector_jar()], config=flink_config)
    keyed = keyed_json_inputs(env, bootstrap, input_topic)
    stamped = connect_to_agent(keyed, agent, config).map(_stamp, output_type=Types.PICKLED_BYTE_ARRAY())
    with stamped.execute_and_collect(f"bench {agent.name}") as results, CpuSampler() as cpu:
        rows = list(itertools.islice(results, runs))
    if len(rows) != runs:
        raise RuntimeError(f"expected {runs} outputs, got {len(rows)}")
    stamps = sorted(t for _, _, t, _, _ in rows)
    # The first `concurrency` runs start together and end together: measuring from the first output would
    # count that first wave's outputs without its time. The window starts at the end of the first wave.
    start = min(int(config.get("max_concurrent_runs", 8)) - 1, len(stamps) // 4)
    latencies = sorted(t - began for _, _, t, began, _ in rows if began is not None and t >= stamps[start])
    acks = sorted(a for _, _, t, _, measured in rows if t >= stamps[start] for a in measured)
    return JobResult(stamps, start, *cpu.between(stamps[start], stamps[-1]), latencies=latencies,
                     flink_cpu_by_group_s=cpu.groups_between(stamps[start], stamps[-1]), ack_latencies=acks,
                     flink_rss_mb=cpu.peak_rss_mb(stamps[start], stamps[-1]))


@dataclass
class JobResult:
    """Emission times of a timed job and the CPU seconds spent between its first and last output."""

    stamps: list[float]
    start: int  # index of the output the measured window starts at (the end of the first wave of runs)
    flink_cpu_s: float = float("nan")  # the Flink JVM: task thread, embedded Python, agent threads, librdkafka
    broker_cpu_s: float = float("nan")  # the local Kafka broker (NaN for an external one)
    latencies: list[float] = field(default_factory=list)  # sorted: run began -> its output left (window's runs)
    ack_latencies: list[float] = field(default_factory=list)  # sorted: journal record appended -> acknowledged
    flink_cpu_by_group_s: dict[str, float] = field(default_factory=dict)  # flink_cpu_s by THREAD_GROUPS
    flink_rss_mb: float = float("nan")  # the Flink JVM's peak resident memory in the window

    @property
    def runs(self) -> int:
        """Outputs in the window (after its first)."""
        return len(self.stamps) - 1 - self.start

    @property
    def seconds(self) -> float:
        return self.stamps[-1] - self.stamps[self.start]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(c) for c in handle.read().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    if pid is None:
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def _rss_mb(pid: int | None) -> float:
    """Resident memory of a process (MiB), from /proc."""
    if pid is None:
        return float("nan")
    try:
        with open(f"/proc/{pid}/status") as handle:
            line = next(line for line in handle if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return float("nan")


class BackgroundLoop:
    """A daemon thread running :meth:`_run` from ``__enter__`` to ``__exit__``, which sets ``_stop`` and joins it."""

    def __init__(self, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        raise NotImplementedError


#: Thread groups of the Flink JVM, by the thread's name in /proc (15 characters). Python threads started by
#: the operator (run workers, the journal's delivery thread) carry their creator's name: the task thread's,
#: which is the operator's ("agent <name>").
THREAD_GROUPS = (("librdkafka", ("rdk:",)), ("task + runs", ("agent ",)),
                 ("JIT + GC", ("C1 ", "C2 ", "GC ", "G1 ", "VM ", "Sweeper")))


def thread_group(name: str) -> str:
    """Which of :data:`THREAD_GROUPS` a JVM thread belongs to (``"other JVM"``: Flink's own threads)."""
    return next((group for group, prefixes in THREAD_GROUPS if name.startswith(prefixes)), "other JVM")


def _thread_cpu_seconds(pid: int | None) -> dict[str, float]:
    """CPU seconds of a process's live threads, summed by :func:`thread_group`."""
    groups: dict[str, float] = {}
    if pid is None:
        return groups
    tick = os.sysconf("SC_CLK_TCK")
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as handle:
                head, tail = handle.read().rsplit(")", 1)
        except OSError:  # the thread ended
            continue
        fields = tail.split()
        group = thread_group(head.split("(", 1)[1])
        groups[group] = groups.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return groups


class CpuSampler(BackgroundLoop):
    """Samples the CPU time of the Flink JVM (PyFlink's gateway child) and of a local broker child at 20 Hz,
    and the JVM's CPU by thread group every ``group_every`` samples (reading every thread's stat costs more).

    Linux only (``/proc``); elsewhere every figure is NaN.
    """

    def __init__(self, interval_s: float = 0.05, group_every: int = 10):
        super().__init__("cpu-sampler")
        self.interval_s = interval_s
        self.group_every = group_every
        self.samples: list[tuple[float, float, float]] = []
        self.group_samples: list[tuple[float, dict[str, float]]] = []
        self.rss_samples: list[tuple[float, float]] = []  # (time, the Flink JVM's RSS in MiB)
        me = os.getpid()
        kids = {pid: _cmdline(pid) for pid in _children(me)}
        self.flink_pid = next((p for p, c in kids.items() if "PythonGatewayServer" in c), None)
        self.broker_pid = next((p for p, c in kids.items() if "kafka.Kafka" in c), None)

    def _sample(self, groups: bool) -> None:
        now = time.time()
        self.samples.append((now, _cpu_seconds(self.flink_pid), _cpu_seconds(self.broker_pid)))
        if groups:
            self.group_samples.append((now, _thread_cpu_seconds(self.flink_pid)))
            self.rss_samples.append((now, _rss_mb(self.flink_pid)))

    def _run(self) -> None:
        for count in itertools.count():
            self._sample(count % self.group_every == 0)
            if self._stop.wait(self.interval_s):
                self._sample(True)
                return

    def peak_rss_mb(self, start: float, end: float) -> float:
        """The Flink JVM's largest RSS sampled between two wall-clock times (MiB)."""
        return max((rss for when, rss in self.rss_samples if start <= when <= end), default=float("nan"))

    def between(self, start: float, end: float) -> tuple[float, float]:
        """CPU seconds (Flink, broker) spent between two wall-clock times, linearly interpolated."""
        if len(self.samples) < 2:
            return float("nan"), float("nan")
        times = [s[0] for s in self.samples]
        return (_interpolated(times, [s[1] for s in self.samples], start, end),
                _interpolated(times, [s[2] for s in self.samples], start, end))

    def groups_between(self, start: float, end: float) -> dict[str, float]:
        """The Flink JVM's CPU seconds by thread group between two wall-clock times (threads that ended in
        between lose their share: the run workers and the producer live as long as the job)."""
        if len(self.group_samples) < 2:
            return {}
        times = [t for t, _ in self.group_samples]
        names = {name for _, groups in self.group_samples for name in groups}
        return {name: _interpolated(times, [g.get(name, 0.0) for _, g in self.group_samples], start, end)
                for name in sorted(names)}


def _interpolated(times: Sequence[float], values: Sequence[float], start: float, end: float) -> float:
    """``values(end) - values(start)`` of a sampled counter, linearly interpolated between samples."""
    def at(t: float) -> float:
        i = bisect.bisect_left(times, t)
        if i <= 0:
            return values[0]
        if i >= len(times):
            return values[-1]
        t0, t1 = times[i - 1], times[i]
        w = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
        return values[i - 1] + w * (values[i] - values[i - 1])

    return at(end) - at(start)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted ``values`` (nearest rank), NaN when empty."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(fraction * len(values)))]


# -- tables ----------------------------------------------------------------------------------------
def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain-text table, right-aligned numbers."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print()
    print(title)
    print("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True))))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
